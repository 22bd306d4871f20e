/* The checkpoint's insides, shared by the two ways of filling it: safetensors.c (a folder of
 * shards) and gguf_checkpoint.c (a GGUF file or split set).  Not for other modules: they use
 * io/safetensors.h. */
#ifndef MG_CHECKPOINT_INTERNAL_H
#define MG_CHECKPOINT_INTERNAL_H

#include "io/gguf.h"
#include "io/json.h"
#include "io/safetensors.h"

typedef struct mg_shard {
    char *path;                /* dir/file, used in every message */
    int fd;                    /* kept open for later pread/O_DIRECT reads of expert bytes */
    const unsigned char *map;  /* whole file, PROT_READ, MAP_PRIVATE */
    uint64_t size;
    uint64_t data_start;       /* 8 + header length */
    mg_json *header;           /* owns the tensor name strings */
    mg_gguf *gguf;             /* a GGUF part: owns fd, map and the stored names instead */
} mg_shard;

struct mg_checkpoint {
    char *dir;                 /* the folder, or the GGUF file opened */
    int is_gguf;
    mg_shard *shards;
    int n_shards;
    mg_tensor *tensors;
    size_t n_tensors, cap_tensors;
    uint32_t *index; /* open addressing: slot -> tensor index + 1 */
    size_t index_mask;
    uint64_t total_bytes;
    float **f32_copies; /* [n_tensors]: fp32 conversions made by mg_checkpoint_tensor_f32 */
    char **names;       /* tensor names made by the GGUF path (owned) */
    size_t n_names, cap_names;
};

int mg_ck_push_tensor(mg_checkpoint *ck, const mg_tensor *t, mg_error *err);
int mg_ck_build_index(mg_checkpoint *ck, mg_error *err);
int mg_ck_alloc_shards(mg_checkpoint *ck, int n, mg_error *err);
/* A copy of s that the checkpoint owns (freed at close); NULL when out of memory. */
char *mg_ck_own_string(mg_checkpoint *ck, const char *s);

/* Fills ck (ck->dir is the file path) from a GGUF file or the first part of a split set:
 * gguf_checkpoint.c. */
int mg_gguf_checkpoint_load(mg_checkpoint *ck, mg_error *err);

#endif
