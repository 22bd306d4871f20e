/* A checkpoint: a folder of safetensors shards, or a GGUF file (or split set), memory-mapped
 * read-only.  A GGUF file is presented under the Hugging Face tensor names the architecture
 * loaders bind (c/io/gguf_checkpoint.c), so loaders and the expert store read both alike.
 *
 * mg_checkpoint_open() reads model.safetensors.index.json when present (and checks that every
 * tensor it lists exists in the shard it names), otherwise every *.safetensors file in the
 * folder.  Headers are validated strictly: dtype known, shape product matching the byte
 * range, ranges inside the file and not overlapping the header.  Any defect is an error
 * naming the file and the tensor. */
#ifndef MG_SAFETENSORS_H
#define MG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

typedef enum mg_dtype {
    MG_DT_F32, MG_DT_F16, MG_DT_BF16, MG_DT_F64,
    MG_DT_F8_E4M3, MG_DT_F8_E5M2, MG_DT_F8_E8M0,
    MG_DT_I8, MG_DT_U8, MG_DT_I16, MG_DT_I32, MG_DT_I64, MG_DT_BOOL,
    /* A ggml block format from a GGUF file (Q8_0, Q4_K, ...): mg_tensor.ggml_type says which.
     * Never read from a safetensors header; mg_dtype_size() is 0 (elements are not bytes). */
    MG_DT_GGML,
    MG_DT_COUNT
} mg_dtype;

const char *mg_dtype_name(mg_dtype dt);  /* as spelled in safetensors headers */
size_t mg_dtype_size(mg_dtype dt);

#define MG_MAX_DIMS 8

typedef struct mg_tensor {
    const char *name;
    mg_dtype dtype;
    int ndim;
    int64_t shape[MG_MAX_DIMS];
    const void *data;      /* inside the shard's mapping */
    size_t nbytes;
    int shard;             /* index into the checkpoint's shard list */
    uint64_t file_offset;  /* absolute byte offset of data in the shard file */
    uint32_t ggml_type;    /* MG_DT_GGML: the ggml type id (io/gguf.h mg_ggml_type_info) */
    const char *stored_name; /* the name in the file when it differs (GGUF: "blk.0.attn_q.weight"
                              * for "model.layers.0.self_attn.q_proj.weight"; one expert's
                              * slice names the stacked "blk.1.ffn_up_exps.weight"), else NULL */
} mg_tensor;

typedef struct mg_checkpoint mg_checkpoint;

/* `path`: a folder of safetensors, or a `.gguf` file (the first part `NAME-00001-of-0000N.gguf`
 * of a split set: every part is opened and the set must be complete). */
mg_checkpoint *mg_checkpoint_open(const char *path, mg_error *err);
void mg_checkpoint_close(mg_checkpoint *ck);

const mg_tensor *mg_checkpoint_find(const mg_checkpoint *ck, const char *name); /* NULL if absent */
size_t mg_checkpoint_count(const mg_checkpoint *ck);
const mg_tensor *mg_checkpoint_at(const mg_checkpoint *ck, size_t i);
int mg_checkpoint_shards(const mg_checkpoint *ck);
const char *mg_checkpoint_shard_path(const mg_checkpoint *ck, int shard);
uint64_t mg_checkpoint_total_bytes(const mg_checkpoint *ck);

/* Like find, but a missing tensor or a shape other than the expected one is an error that
 * names the tensor, its shard and both shapes.  expected[i] < 0 matches any size. */
const mg_tensor *mg_checkpoint_expect(const mg_checkpoint *ck, const char *name, int ndim,
                                      const int64_t *expected, mg_error *err);

/* Added by the loader, for the expert store's direct reads (pread/O_DIRECT at
 * mg_tensor.file_offset): the shard's open read-only descriptor (owned by the checkpoint,
 * valid until close) and its file size; and the folder the checkpoint was opened from. */
int mg_checkpoint_shard_fd(const mg_checkpoint *ck, int shard);
uint64_t mg_checkpoint_shard_size(const mg_checkpoint *ck, int shard);
const char *mg_checkpoint_dir(const mg_checkpoint *ck); /* the folder, or the (first) GGUF file */
/* 1 when the checkpoint was opened from a GGUF file. */
int mg_checkpoint_is_gguf(const mg_checkpoint *ck);
/* llama.cpp's name for Hugging Face tensor name `hf` ("blk.0.attn_q.weight"; an expert's as
 * "blk.1.ffn_up_exps.weight (expert 3)"), for messages about GGUF files; -1 if it has none. */
int mg_gguf_stored_name(const char *hf, char *out, size_t cap);

/* Added by the loader: tensor t (of this checkpoint; F32, BF16 or F16) as fp32 values.  F32
 * data is returned in place when aligned; otherwise a converted copy is made once and owned
 * by the checkpoint (freed at close).  Not thread-safe: call while loading. */
const float *mg_checkpoint_tensor_f32(const mg_checkpoint *ck, const mg_tensor *t, mg_error *err);

#endif
