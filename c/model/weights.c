/* Binds checkpoint tensors to mg_matrix descriptors (pointing into the mapped shards) and
 * converts small vectors to fp32.  Every error names the tensor and the shard file. */
#include "model/weights.h"
#include "io/gguf.h"
#include "core/ggml_blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *shard_of(const mg_checkpoint *ck, const mg_tensor *t) {
    const char *p = mg_checkpoint_shard_path(ck, t->shard);
    return p ? p : "?";
}

static void shape_str(char *buf, size_t cap, const mg_tensor *t) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The ggml block type -> the matrix format our kernels read it in (docs/reference/gguf.md §2);
 * -1 for the types outside that set. */
static int format_of_ggml(uint32_t type) {
    switch (type) {
    case 2: return MG_Q4_0;
    case 3: return MG_Q4_1;
    case 6: return MG_Q5_0;
    case 7: return MG_Q5_1;
    case 8: return MG_Q8_0;
    case 10: return MG_Q2_K;
    case 11: return MG_Q3_K;
    case 12: return MG_Q4_K;
    case 13: return MG_Q5_K;
    case 14: return MG_Q6_K;
    case 16: return MG_IQ2_XXS;
    case 17: return MG_IQ2_XS;
    case 18: return MG_IQ3_XXS;
    case 19: return MG_IQ1_S;
    case 20: return MG_IQ4_NL;
    case 21: return MG_IQ3_S;
    case 22: return MG_IQ2_S;
    case 23: return MG_IQ4_XS;
    case 29: return MG_IQ1_M;
    case 39: return MG_MXFP4;
    default: return -1;
    }
}

/* "F32, F16, Q4_0, ...": the reader's supported types, for messages. */
static void supported_list(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (uint32_t id = 0; id < mg_ggml_type_id_end() && n < cap; id++) {
        const mg_ggml_type *ty = mg_ggml_type_info(id);
        if (ty && ty->supported && (ty->block_size == 1 || format_of_ggml(id) >= 0))
            n += (size_t)snprintf(buf + n, cap - n, n ? ", %s" : "%s", ty->name);
    }
}

/* The file's own name for the tensor, when it has one (a GGUF name), for messages. */
static const char *stored(const mg_tensor *t) { return t->stored_name ? t->stored_name : t->name; }

static int not_found(const mg_checkpoint *ck, const char *name, mg_error *err) {
    char stored_as[192];
    if (mg_checkpoint_is_gguf(ck) && !mg_gguf_stored_name(name, stored_as, sizeof stored_as))
        return mg_fail(err, "%s: tensor '%s' not found in the file (bound as '%s')", mg_checkpoint_dir(ck),
                       stored_as, name);
    return mg_fail(err, "%s: tensor '%s' not found in the checkpoint", mg_checkpoint_dir(ck), name);
}

/* True when t is [rows, cols], or [a, b, ..., cols] with a*b*... == rows (same row-major bytes). */
static int is_matrix_shape(const mg_tensor *t, int64_t rows, int64_t cols) {
    if (t->ndim < 2 || t->shape[t->ndim - 1] != cols) return 0;
    int64_t lead = 1;
    for (int i = 0; i < t->ndim - 1; i++) {
        if (t->shape[i] && lead > rows / t->shape[i] + 1) return 0; /* avoid overflow */
        lead *= t->shape[i];
    }
    return lead == rows;
}

static int wrong_shape(const mg_checkpoint *ck, const mg_tensor *t, int64_t rows, int64_t cols,
                       const char *note, mg_error *err) {
    char got[160];
    shape_str(got, sizeof got, t);
    const mg_ggml_type *ty = t->dtype == MG_DT_GGML ? mg_ggml_type_info(t->ggml_type) : NULL;
    return mg_fail(err, "%s: tensor '%s'%s%s%s: %s shape %s, expected [%lld, %lld]%s", shard_of(ck, t),
                   t->name, t->stored_name ? " (GGUF '" : "", t->stored_name ? t->stored_name : "",
                   t->stored_name ? "')" : "", ty ? ty->name : mg_dtype_name(t->dtype), got, (long long)rows, (long long)cols, note);
}

/* Finds and checks a scale tensor: dtype and exact 2-D shape.  With allow_half, a BF16 or
 * F16 scale is accepted in place of F32 (some Qwen FP8 releases store weight_scale_inv so, and
 * compressed-tensors may store weight_scale in the model dtype);
 * *f32 then receives fp32 values (converted once, owned by the checkpoint). */
static const mg_tensor *bind_scale(const mg_checkpoint *ck, const mg_tensor *w, const char *sname,
                                   mg_dtype dt, int allow_half, int64_t srows, int64_t scols,
                                   const void **data, mg_error *err) {
    const mg_tensor *s = mg_checkpoint_find(ck, sname);
    if (!s) {
        mg_fail(err, "%s: tensor '%s': %s weight needs scale tensor '%s', which is missing",
                shard_of(ck, w), w->name, mg_dtype_name(w->dtype), sname);
        return NULL;
    }
    int dtype_ok = s->dtype == dt || (allow_half && (s->dtype == MG_DT_BF16 || s->dtype == MG_DT_F16));
    if (!dtype_ok || s->ndim != 2 || s->shape[0] != srows || s->shape[1] != scols) {
        char got[160];
        shape_str(got, sizeof got, s);
        mg_fail(err, "%s: tensor '%s': scale of '%s' is %s %s, expected %s%s [%lld, %lld]",
                shard_of(ck, s), s->name, w->name, mg_dtype_name(s->dtype), got, mg_dtype_name(dt),
                allow_half ? " (or BF16/F16)" : "", (long long)srows, (long long)scols);
        return NULL;
    }
    if (allow_half) {
        *data = mg_checkpoint_tensor_f32(ck, s, err);
        if (!*data) return NULL;
    } else {
        *data = s->data;
    }
    return s;
}

/* "<x>.weight" -> "<x>" + suffix; other names get the suffix appended. */
static char *sibling(const char *name, const char *strip, const char *suffix) {
    size_t n = strlen(name), k = strlen(strip);
    if (k && n > k && !strcmp(name + n - k, strip)) n -= k;
    size_t sl = strlen(suffix);
    char *s = malloc(n + sl + 1);
    if (!s) return NULL;
    memcpy(s, name, n);
    memcpy(s + n, suffix, sl + 1);
    return s;
}

int mg_bind_matrix(const mg_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                   mg_matrix *out, mg_error *err) {
    const mg_tensor *t = mg_checkpoint_find(ck, name);
    if (!t) return not_found(ck, name, err);
    if (rows <= 0 || cols <= 0)
        return mg_fail(err, "%s: tensor '%s': requested matrix shape [%lld, %lld] is empty",
                       shard_of(ck, t), name, (long long)rows, (long long)cols);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    out->data = t->data;
    out->scale_kind = MG_SCALE_NONE;
    switch (t->dtype) {
    case MG_DT_F32:
    case MG_DT_BF16:
    case MG_DT_F16:
        if (!is_matrix_shape(t, rows, cols)) return wrong_shape(ck, t, rows, cols, "", err);
        out->format = t->dtype == MG_DT_F32 ? MG_F32 : t->dtype == MG_DT_BF16 ? MG_BF16 : MG_F16;
        return 0;
    case MG_DT_F8_E4M3: {
        if (!is_matrix_shape(t, rows, cols)) return wrong_shape(ck, t, rows, cols, "", err);
        out->format = MG_FP8_E4M3;
        int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
        char *hf = sibling(name, "", "_scale_inv");      /* <x>.weight_scale_inv */
        char *ds = sibling(name, ".weight", ".scale");   /* <x>.scale */
        char *ct = sibling(name, "", "_scale");          /* <x>.weight_scale (per channel) */
        int rc = 0;
        if (!hf || !ds || !ct) {
            rc = mg_fail(err, "%s: out of memory", name);
        } else {
            const mg_tensor *shf = mg_checkpoint_find(ck, hf), *sds = mg_checkpoint_find(ck, ds);
            const mg_tensor *sct = mg_checkpoint_find(ck, ct);
            const mg_tensor *s = NULL;
            const void *sdata = NULL;
            if ((shf != NULL) + (sds != NULL) + (sct != NULL) > 1) {
                rc = mg_fail(err, "%s: tensor '%s': more than one of '%s', '%s' and '%s' exists; "
                             "which scale applies is ambiguous", shard_of(ck, t), name, hf, ds, ct);
            } else if (shf) {
                s = bind_scale(ck, t, hf, MG_DT_F32, 1, br, bc, &sdata, err);
                out->scale_kind = MG_SCALE_F32_BLOCK128;
            } else if (sds) {
                s = bind_scale(ck, t, ds, MG_DT_F8_E8M0, 0, br, bc, &sdata, err);
                out->scale_kind = MG_SCALE_E8M0_BLOCK128;
            } else if (sct) {
                /* compressed-tensors "channel" FP8 (GLM-4.5-FP8): one scale per output row,
                 * stored [rows, 1]; a per-tensor scale ([1] or [1, 1]) is refused here. */
                s = bind_scale(ck, t, ct, MG_DT_F32, 1, rows, 1, &sdata, err);
                out->scale_kind = MG_SCALE_F32_ROW;
                bc = 1;
            } else {
                rc = mg_fail(err, "%s: tensor '%s': F8_E4M3 weight without a scale tensor "
                             "('%s', '%s' or '%s')", shard_of(ck, t), name, hf, ds, ct);
            }
            if (!rc && !s) rc = -1;
            if (!rc) {
                out->scale = sdata;
                out->scale_cols = bc;
            }
        }
        free(hf);
        free(ds);
        free(ct);
        return rc;
    }
    case MG_DT_I8:
    case MG_DT_U8: {
        /* Packed FP4 (e2m1): two codes per byte, one ue8m0 scale per 32 columns. */
        if (cols % 32)
            return mg_fail(err, "%s: tensor '%s': packed FP4 needs a column count that is a "
                           "multiple of 32, got %lld", shard_of(ck, t), name, (long long)cols);
        if (!is_matrix_shape(t, rows, cols / 2))
            return wrong_shape(ck, t, rows, cols / 2, " (packed FP4: two values per byte)", err);
        out->format = MG_FP4_E2M1;
        out->scale_kind = MG_SCALE_E8M0_G32;
        out->scale_cols = cols / 32;
        char *ds = sibling(name, ".weight", ".scale");
        if (!ds) return mg_fail(err, "%s: out of memory", name);
        const void *sdata = NULL;
        const mg_tensor *s = bind_scale(ck, t, ds, MG_DT_F8_E8M0, 0, rows, cols / 32, &sdata, err);
        free(ds);
        if (!s) return -1;
        out->scale = sdata;
        return 0;
    }
    case MG_DT_GGML: {
        const mg_ggml_type *ty = mg_ggml_type_info(t->ggml_type);
        int f = format_of_ggml(t->ggml_type);
        if (f < 0 || !ty || !ty->supported) {
            char list[256];
            supported_list(list, sizeof list);
            return mg_fail(err, "%s: %s (bound as '%s'): ggml type %s is not supported (supported: %s)",
                           shard_of(ck, t), stored(t), name, ty ? ty->name : "?", list);
        }
        if (!is_matrix_shape(t, rows, cols)) return wrong_shape(ck, t, rows, cols, "", err);
        int64_t be, bb;
        mg_format_block((mg_format)f, &be, &bb);
        if (cols % be) /* the reader checks ne[0]; a [a, b, cols] view needs nothing more */
            return mg_fail(err, "%s: %s: %lld columns are not whole %s blocks of %lld", shard_of(ck, t),
                           stored(t), (long long)cols, ty->name, (long long)be);
        out->format = (mg_format)f;
        return 0;
    }
    default:
        return mg_fail(err, "%s: tensor '%s': dtype %s cannot be used as a weight matrix",
                       shard_of(ck, t), name, mg_dtype_name(t->dtype));
    }
}

/* The values of a ggml block tensor holding n values, decoded exactly (core/ggml_blocks.h), for
 * mg_bind_array: llama-quantize quantises every 2-D tensor whose name ends in "weight" unless
 * told not to, DeepSeek-V4's compressor position biases (`*_compressor_ape.weight`, read whole)
 * among them. */
static float *ggml_to_f32(const mg_checkpoint *ck, const mg_tensor *t, int64_t n, mg_error *err) {
    const mg_ggml_type *ty = mg_ggml_type_info(t->ggml_type);
    int f = format_of_ggml(t->ggml_type);
    if (f < 0 || !ty || !ty->supported) {
        char list[256];
        supported_list(list, sizeof list);
        mg_fail(err, "%s: %s (bound as '%s'): ggml type %s is not supported (supported: %s)", shard_of(ck, t),
                stored(t), t->name, ty ? ty->name : "?", list);
        return NULL;
    }
    int64_t be, bb, count = 1;
    mg_format_block((mg_format)f, &be, &bb);
    for (int i = 0; i < t->ndim; i++) count *= t->shape[i];
    /* rows of whole blocks follow each other, so the tensor is one run of blocks */
    if (count != n || n % be || (size_t)(n / be * bb) != t->nbytes) {
        char got[160];
        shape_str(got, sizeof got, t);
        mg_fail(err, "%s: %s (bound as '%s'): %s shape %s holds %lld values, expected %lld", shard_of(ck, t),
                stored(t), t->name, ty->name, got, (long long)count, (long long)n);
        return NULL;
    }
    float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!out) {
        mg_fail(err, "%s: tensor '%s': out of memory", shard_of(ck, t), t->name);
        return NULL;
    }
    mg_ggml_row_f32((mg_format)f, t->data, 0, n, out);
    return out;
}

static float *to_f32(const mg_checkpoint *ck, const mg_tensor *t, int64_t n, mg_error *err) {
    if (t->dtype == MG_DT_GGML) { /* llama.cpp never quantises a 1-D tensor: a foreign file */
        const mg_ggml_type *ty = mg_ggml_type_info(t->ggml_type);
        mg_fail(err, "%s: %s (bound as '%s'): ggml type %s, expected F32, BF16 or F16 for a vector",
                shard_of(ck, t), stored(t), t->name, ty ? ty->name : "?");
        return NULL;
    }
    if (t->dtype != MG_DT_F32 && t->dtype != MG_DT_BF16 && t->dtype != MG_DT_F16) {
        mg_fail(err, "%s: tensor '%s': dtype %s, expected F32, BF16 or F16", shard_of(ck, t),
                t->name, mg_dtype_name(t->dtype));
        return NULL;
    }
    float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!out) {
        mg_fail(err, "%s: tensor '%s': out of memory", shard_of(ck, t), t->name);
        return NULL;
    }
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == MG_DT_F32) {
            memcpy(&out[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = t->dtype == MG_DT_BF16 ? mg_bf16_to_f32(h) : mg_f16_to_f32(h);
        }
    }
    return out;
}

float *mg_bind_vector(const mg_checkpoint *ck, const char *name, int64_t n, mg_error *err) {
    const mg_tensor *t = mg_checkpoint_find(ck, name);
    if (!t) {
        not_found(ck, name, err);
        return NULL;
    }
    if (t->ndim != 1 || t->shape[0] != n) {
        char got[160];
        shape_str(got, sizeof got, t);
        mg_fail(err, "%s: tensor '%s'%s%s%s: shape %s, expected [%lld]", shard_of(ck, t), name,
                t->stored_name ? " (GGUF '" : "", t->stored_name ? t->stored_name : "", t->stored_name ? "')" : "",
                got, (long long)n);
        return NULL;
    }
    return to_f32(ck, t, n, err);
}

float *mg_bind_array(const mg_checkpoint *ck, const char *name, int64_t n, mg_error *err) {
    const mg_tensor *t = mg_checkpoint_find(ck, name);
    if (!t) {
        not_found(ck, name, err);
        return NULL;
    }
    if (t->dtype == MG_DT_GGML) return ggml_to_f32(ck, t, n, err);
    size_t esz = mg_dtype_size(t->dtype);
    if (n < 0 || !esz || t->nbytes / esz != (size_t)n) {
        char got[160];
        shape_str(got, sizeof got, t);
        mg_fail(err, "%s: tensor '%s'%s%s%s: shape %s holds %zu values, expected %lld", shard_of(ck, t), name,
                t->stored_name ? " (GGUF '" : "", t->stored_name ? t->stored_name : "", t->stored_name ? "')" : "",
                got, esz ? t->nbytes / esz : (size_t)0, (long long)n);
        return NULL;
    }
    return to_f32(ck, t, n, err);
}
