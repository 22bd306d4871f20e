/* A GGUF file (llama.cpp's model format), memory-mapped read-only and validated strictly.
 *
 * Format facts: docs/reference/gguf.md §1.  mg_gguf_open() refuses, with a message naming the
 * file and the key or tensor: a wrong magic; versions other than 2 and 3 (v1 included); a
 * big-endian file (its version's low 16 bits read as 0); counts, strings and arrays that cannot
 * fit in the file or pass llama.cpp's bounds (strings <= 1 GiB, arrays <= 2^30 elements);
 * arrays of arrays; unknown value types; duplicate keys or tensor names; tensor names of 64
 * bytes or more; n_dims outside 1..4, dims < 1 or an element count that overflows; ggml type
 * ids that are unknown or removed (an ik_llama.cpp-only id is named as such); ne[0] not a
 * multiple of the type's block size; general.alignment that is not a u32 power of two; and any
 * tensor whose offset is not the padded end of the one before (as llama.cpp requires: in
 * order, aligned, no overlap, no gap) or whose bytes end past the end of the file.
 *
 * Dims are in ggml order: ne[0] is the contiguous row (the number of columns), so a torch
 * tensor of shape [out, in] is stored with ne = {in, out}.  All numbers in the file are
 * little-endian; accessors decode them byte by byte, so mapped pointers may be unaligned. */
#ifndef MG_GGUF_H
#define MG_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

/* ---- ggml tensor types ------------------------------------------------------------------ */

#define MG_GGML_MAX_DIMS 4

typedef struct mg_ggml_type {
    const char *name;    /* as llama.cpp prints it: "Q4_K", "BF16", ... */
    uint32_t block_size; /* elements per block (1 for plain types) */
    uint32_t type_size;  /* bytes per block */
    int supported;       /* 1: in the set moegate's kernels will run (docs/reference/gguf.md §3) */
} mg_ggml_type;

/* The type with this id, or NULL for ids that are unknown or were removed (4, 5, 31-33,
 * 36-38). */
const mg_ggml_type *mg_ggml_type_info(uint32_t id);
/* The name of a type id that only ik_llama.cpp knows (IQ4_KS, Q6_0, ...), or NULL. */
const char *mg_ggml_foreign_type_name(uint32_t id);
/* One past the largest id mg_ggml_type_info() knows, for iterating over the table. */
uint32_t mg_ggml_type_id_end(void);

/* ---- metadata values ------------------------------------------------------------------- */

typedef enum mg_gguf_vtype {
    MG_GGUF_U8 = 0, MG_GGUF_I8 = 1, MG_GGUF_U16 = 2, MG_GGUF_I16 = 3, MG_GGUF_U32 = 4,
    MG_GGUF_I32 = 5, MG_GGUF_F32 = 6, MG_GGUF_BOOL = 7, MG_GGUF_STRING = 8, MG_GGUF_ARRAY = 9,
    MG_GGUF_U64 = 10, MG_GGUF_I64 = 11, MG_GGUF_F64 = 12,
    MG_GGUF_VTYPE_COUNT
} mg_gguf_vtype;

const char *mg_gguf_vtype_name(uint32_t t); /* "u8", ..., "string", "array"; "?" if unknown */

typedef struct mg_gguf_kv {
    const char *key;            /* NUL-terminated copy */
    mg_gguf_vtype type;
    mg_gguf_vtype elem_type;    /* arrays: the element type (never ARRAY); else == type */
    uint64_t count;             /* arrays: element count; else 1 */
    const unsigned char *value; /* in the mapping: scalar bytes, string length, or first element */
    const uint64_t *str_offsets; /* string arrays: offset of element i's length from value */
} mg_gguf_kv;

/* Scalar values (or element i of an array, with the _at forms).  Each returns 0, or -1 when
 * the value is not of that kind (integers: any u8..i64 whose value fits; floats: f32 or f64;
 * an integer is not a float). */
int mg_gguf_kv_int(const mg_gguf_kv *kv, int64_t *out);
int mg_gguf_kv_uint(const mg_gguf_kv *kv, uint64_t *out);
int mg_gguf_kv_float(const mg_gguf_kv *kv, double *out);
int mg_gguf_kv_bool(const mg_gguf_kv *kv, int *out);
/* The string's bytes (not NUL-terminated; NULL if not a string). */
const char *mg_gguf_kv_string(const mg_gguf_kv *kv, size_t *len);
int mg_gguf_kv_int_at(const mg_gguf_kv *kv, uint64_t i, int64_t *out);
int mg_gguf_kv_uint_at(const mg_gguf_kv *kv, uint64_t i, uint64_t *out);
int mg_gguf_kv_float_at(const mg_gguf_kv *kv, uint64_t i, double *out);
int mg_gguf_kv_bool_at(const mg_gguf_kv *kv, uint64_t i, int *out);
const char *mg_gguf_kv_string_at(const mg_gguf_kv *kv, uint64_t i, size_t *len);

/* ---- the file -------------------------------------------------------------------------- */

typedef struct mg_gguf_tensor {
    const char *name;     /* NUL-terminated copy */
    uint32_t type;        /* ggml type id; mg_ggml_type_info(type) is never NULL */
    int n_dims;           /* 1..4 */
    int64_t ne[MG_GGML_MAX_DIMS]; /* ggml order (ne[0] contiguous); 1 beyond n_dims */
    uint64_t row_bytes;   /* bytes of one ne[0] row: ne[0] / block_size * type_size */
    uint64_t nbytes;      /* row_bytes * ne[1] * ne[2] * ne[3] */
    uint64_t offset;      /* relative to the data section, as stored */
    uint64_t file_offset; /* absolute: data section start + offset */
    const void *data;     /* in the mapping */
} mg_gguf_tensor;

typedef struct mg_gguf mg_gguf;

mg_gguf *mg_gguf_open(const char *path, mg_error *err);
void mg_gguf_close(mg_gguf *g);

const char *mg_gguf_path(const mg_gguf *g);
uint32_t mg_gguf_version(const mg_gguf *g);
uint32_t mg_gguf_alignment(const mg_gguf *g);
uint64_t mg_gguf_data_offset(const mg_gguf *g); /* absolute start of the data section */
uint64_t mg_gguf_file_size(const mg_gguf *g);
int mg_gguf_fd(const mg_gguf *g); /* read-only descriptor, owned; for pread/O_DIRECT of slices */

size_t mg_gguf_tensor_count(const mg_gguf *g);
const mg_gguf_tensor *mg_gguf_tensor_at(const mg_gguf *g, size_t i); /* in file order */
const mg_gguf_tensor *mg_gguf_find_tensor(const mg_gguf *g, const char *name); /* NULL if absent */

/* Slice i of the outermost dim (ne[n_dims - 1]) of t: for a stacked `ffn_*_exps` tensor,
 * expert i's contiguous bytes (docs/reference/gguf.md §4: offset + i * ne1 * row_bytes for a
 * 3-D tensor).  Returns 0, or -1 when i is out of range. */
int mg_gguf_tensor_slice(const mg_gguf_tensor *t, int64_t i, uint64_t *file_offset,
                         uint64_t *nbytes);

size_t mg_gguf_kv_count(const mg_gguf *g);
const mg_gguf_kv *mg_gguf_kv_at(const mg_gguf *g, size_t i); /* in file order */
const mg_gguf_kv *mg_gguf_find_kv(const mg_gguf *g, const char *key); /* NULL if absent */

/* By key, with an error naming the file, the key and what was found instead. */
int mg_gguf_get_int(const mg_gguf *g, const char *key, int64_t *out, mg_error *err);
int mg_gguf_get_float(const mg_gguf *g, const char *key, double *out, mg_error *err);
const char *mg_gguf_get_string(const mg_gguf *g, const char *key, size_t *len, mg_error *err);

#endif
