/* A GGUF file (or split set) as an mg_checkpoint: every tensor under the Hugging Face name the
 * architecture loaders bind, shapes in [rows, cols] order, and each stacked expert tensor
 * (`blk.N.ffn_{gate,up,down}_exps.weight`, docs/reference/gguf.md §4) cut into one tensor per
 * expert whose bytes are that expert's contiguous slice, so the expert store reads one expert
 * by shard descriptor and file offset exactly as it does for safetensors.
 *
 * Names not in the table (GLM's `nextn.*` MTP tensors, say) are kept under their GGUF name:
 * nothing binds them, and nothing is silently dropped.  The permutation llama.cpp's converter
 * applies to llama-style q/k rows does not apply here: qwen3moe and glm4moe use the neox
 * (rotate-half) RoPE in both llama.cpp and transformers, so their q/k rows are stored as
 * released. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint_internal.h"

#define MAX_SPLIT_PARTS 99999 /* five digits in the part names */

/* The architectures whose tensors this table names (general.architecture). */
static const char *const supported_archs[] = {"qwen3moe", "glm4moe"};
#define N_ARCHS (sizeof supported_archs / sizeof *supported_archs)

/* blk.N.<gguf suffix> -> model.layers.N.<hf suffix> */
static const struct { const char *gguf, *hf; } layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},            /* qwen3moe */
    {"post_attention_norm.weight", "post_attention_layernorm.weight"}, /* glm4moe */
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
};

/* blk.N.<stacked> -> model.layers.N.mlp.experts.E.<proj>.weight */
static const struct { const char *gguf, *proj; } stacked_names[] = {
    {"ffn_gate_exps.weight", "gate_proj"},
    {"ffn_up_exps.weight", "up_proj"},
    {"ffn_down_exps.weight", "down_proj"},
};

static const struct { const char *gguf, *hf; } global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* "blk.N.rest" -> N and rest; 0 on a match. */
static int split_layer_name(const char *name, long *layer, const char **rest) {
    if (strncmp(name, "blk.", 4)) return -1;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    char *end;
    errno = 0;
    long n = strtol(p, &end, 10);
    if (errno || *end != '.' || n < 0 || n > 1000000) return -1;
    *layer = n;
    *rest = end + 1;
    return 0;
}

int mg_gguf_stored_name(const char *hf, char *out, size_t cap) {
    for (size_t k = 0; k < sizeof global_names / sizeof *global_names; k++)
        if (!strcmp(hf, global_names[k].hf)) return snprintf(out, cap, "%s", global_names[k].gguf) < 0 ? -1 : 0;
    const char *p = "model.layers.";
    if (strncmp(hf, p, strlen(p))) return -1;
    char *end;
    long layer = strtol(hf + strlen(p), &end, 10);
    if (end == hf + strlen(p) || *end != '.') return -1;
    const char *rest = end + 1;
    size_t n = 0;
    for (size_t k = 0; k < sizeof layer_names / sizeof *layer_names && n < cap; k++)
        if (!strcmp(rest, layer_names[k].hf)) /* post_attention_layernorm has two names */
            n += (size_t)snprintf(out + n, cap - n, "%sblk.%ld.%s", n ? " or " : "", layer, layer_names[k].gguf);
    if (n) return 0;
    long e;
    char proj[16];
    int used = 0;
    if (sscanf(rest, "mlp.experts.%ld.%15[a-z_].weight%n", &e, proj, &used) == 2 && rest[used] == 0)
        for (size_t k = 0; k < sizeof stacked_names / sizeof *stacked_names; k++)
            if (!strcmp(proj, stacked_names[k].proj)) {
                snprintf(out, cap, "blk.%ld.%s (expert %ld)", layer, stacked_names[k].gguf, e);
                return 0;
            }
    return -1;
}

/* The plain dtype of a ggml type, or MG_DT_GGML for the block formats. */
static mg_dtype dtype_of(uint32_t ggml_type) {
    switch (ggml_type) {
    case 0: return MG_DT_F32;
    case 1: return MG_DT_F16;
    case 30: return MG_DT_BF16;
    case 24: return MG_DT_I8;
    case 25: return MG_DT_I16;
    case 26: return MG_DT_I32;
    case 27: return MG_DT_I64;
    case 28: return MG_DT_F64;
    default: return MG_DT_GGML;
    }
}

static void reversed_shape(const mg_gguf_tensor *g, mg_tensor *t) {
    t->ndim = g->n_dims;
    for (int i = 0; i < MG_MAX_DIMS; i++) t->shape[i] = 0;
    for (int i = 0; i < g->n_dims; i++) t->shape[i] = g->ne[g->n_dims - 1 - i];
}

static int add_tensor(mg_checkpoint *ck, int si, const mg_gguf_tensor *g, const char *hf_name,
                      mg_error *err) {
    mg_tensor t;
    memset(&t, 0, sizeof t);
    if (!(t.name = mg_ck_own_string(ck, hf_name))) return mg_fail(err, "%s: out of memory", ck->dir);
    t.stored_name = strcmp(hf_name, g->name) ? g->name : NULL;
    t.dtype = dtype_of(g->type);
    t.ggml_type = g->type;
    reversed_shape(g, &t);
    t.data = g->data;
    t.nbytes = (size_t)g->nbytes;
    t.shard = si;
    t.file_offset = g->file_offset;
    ck->total_bytes += g->nbytes;
    return mg_ck_push_tensor(ck, &t, err);
}

/* One tensor per expert of a stacked [n_expert, rows, cols] tensor (ggml ne = {cols, rows, E}). */
static int add_experts(mg_checkpoint *ck, int si, const mg_gguf_tensor *g, long layer,
                       const char *proj, mg_error *err) {
    if (g->n_dims != 3)
        return mg_fail(err, "%s: tensor '%s': stacked experts need 3 dims (cols, rows, experts), "
                       "it has %d", ck->shards[si].path, g->name, g->n_dims);
    char name[160];
    for (int64_t e = 0; e < g->ne[2]; e++) {
        uint64_t off = 0, nbytes = 0;
        if (mg_gguf_tensor_slice(g, e, &off, &nbytes))
            return mg_fail(err, "%s: tensor '%s': cannot slice expert %lld", ck->shards[si].path,
                           g->name, (long long)e);
        snprintf(name, sizeof name, "model.layers.%ld.mlp.experts.%lld.%s.weight", layer,
                 (long long)e, proj);
        mg_tensor t;
        memset(&t, 0, sizeof t);
        if (!(t.name = mg_ck_own_string(ck, name))) return mg_fail(err, "%s: out of memory", ck->dir);
        t.stored_name = g->name;
        t.dtype = dtype_of(g->type);
        t.ggml_type = g->type;
        t.ndim = 2;
        t.shape[0] = g->ne[1];
        t.shape[1] = g->ne[0];
        t.data = (const unsigned char *)g->data + (off - g->file_offset);
        t.nbytes = (size_t)nbytes;
        t.shard = si;
        t.file_offset = off;
        ck->total_bytes += nbytes;
        if (mg_ck_push_tensor(ck, &t, err)) return -1;
    }
    return 0;
}

static int add_part_tensors(mg_checkpoint *ck, int si, mg_error *err) {
    const mg_gguf *g = ck->shards[si].gguf;
    char name[160];
    for (size_t i = 0; i < mg_gguf_tensor_count(g); i++) {
        const mg_gguf_tensor *t = mg_gguf_tensor_at(g, i);
        const char *hf = NULL;
        for (size_t k = 0; k < sizeof global_names / sizeof *global_names && !hf; k++)
            if (!strcmp(t->name, global_names[k].gguf)) hf = global_names[k].hf;
        long layer;
        const char *rest;
        if (!hf && !split_layer_name(t->name, &layer, &rest)) {
            for (size_t k = 0; k < sizeof stacked_names / sizeof *stacked_names; k++)
                if (!strcmp(rest, stacked_names[k].gguf)) {
                    if (add_experts(ck, si, t, layer, stacked_names[k].proj, err)) return -1;
                    rest = NULL;
                    break;
                }
            if (!rest) continue;
            for (size_t k = 0; k < sizeof layer_names / sizeof *layer_names && !hf; k++)
                if (!strcmp(rest, layer_names[k].gguf)) {
                    snprintf(name, sizeof name, "model.layers.%ld.%s", layer, layer_names[k].hf);
                    hf = name;
                }
        }
        if (add_tensor(ck, si, t, hf ? hf : t->name, err)) return -1;
    }
    return 0;
}

/* split.count / split.no of a part (llama.cpp's gguf-split: u16, split.no counts from 0);
 * absent keys read as a one-part set. */
static int split_info(const mg_gguf *g, uint64_t *count, uint64_t *no, mg_error *err) {
    *count = 1;
    *no = 0;
    const mg_gguf_kv *c = mg_gguf_find_kv(g, "split.count"), *n = mg_gguf_find_kv(g, "split.no");
    if (c && (mg_gguf_kv_uint(c, count) || *count < 1 || *count > MAX_SPLIT_PARTS))
        return mg_fail(err, "%s: split.count is not a part count in 1..%d", mg_gguf_path(g),
                       MAX_SPLIT_PARTS);
    if (n && mg_gguf_kv_uint(n, no))
        return mg_fail(err, "%s: split.no is not an unsigned integer", mg_gguf_path(g));
    return 0;
}

/* NAME-0000k-of-0000N.gguf: the length of NAME and k, N; -1 when the name has no such suffix. */
static int parse_split_name(const char *path, size_t *prefix_len, int *k, int *n) {
    size_t len = strlen(path);
    const char *tail = "-00000-of-00000.gguf";
    size_t tl = strlen(tail);
    if (len <= tl) return -1;
    const char *s = path + len - tl;
    for (size_t i = 0; i < tl; i++) {
        if (tail[i] == '0' ? (s[i] < '0' || s[i] > '9') : s[i] != tail[i]) return -1;
    }
    *k = atoi(s + 1);
    *n = atoi(s + 10);
    *prefix_len = len - tl;
    return 0;
}

static int open_part(mg_checkpoint *ck, int si, const char *path, mg_error *err) {
    mg_shard *sh = &ck->shards[si];
    if (!(sh->path = strdup(path))) return mg_fail(err, "%s: out of memory", path);
    if (!(sh->gguf = mg_gguf_open(path, err))) return -1;
    sh->fd = mg_gguf_fd(sh->gguf);
    sh->size = mg_gguf_file_size(sh->gguf);
    sh->data_start = mg_gguf_data_offset(sh->gguf);
    return 0;
}

int mg_gguf_checkpoint_load(mg_checkpoint *ck, mg_error *err) {
    const char *path = ck->dir;
    mg_gguf *first = mg_gguf_open(path, err);
    if (!first) return -1;
    uint64_t count, no;
    size_t prefix_len = 0;
    int name_k = 0, name_n = 0;
    int named = parse_split_name(path, &prefix_len, &name_k, &name_n) == 0;
    int rc = split_info(first, &count, &no, err);
    if (!rc && named && name_k != 1)
        rc = mg_fail(err, "%s: part %d of a split set; open the first part (%.*s-00001-of-%05d.gguf)",
                     path, name_k, (int)prefix_len, path, name_n);
    if (!rc && count > 1 && (!named || (uint64_t)name_n != count))
        rc = mg_fail(err, "%s: split.count is %llu, but the file is not named NAME-00001-of-%05llu.gguf "
                     "(the other parts are found by that name)", path, (unsigned long long)count,
                     (unsigned long long)count);
    if (!rc && named && name_n > 1 && count == 1)
        rc = mg_fail(err, "%s: named as part 1 of %d but has no split.count", path, name_n);
    if (!rc && no != 0)
        rc = mg_fail(err, "%s: split.no is %llu, expected 0 for the first part", path,
                     (unsigned long long)no);
    const char *arch = NULL;
    size_t arch_len = 0;
    if (!rc && !(arch = mg_gguf_get_string(first, "general.architecture", &arch_len, err))) rc = -1;
    if (!rc) {
        int known = 0;
        for (size_t i = 0; i < N_ARCHS; i++)
            if (strlen(supported_archs[i]) == arch_len && !memcmp(arch, supported_archs[i], arch_len))
                known = 1;
        if (!known)
            rc = mg_fail(err, "%s: general.architecture '%.*s' is not supported (supported: qwen3moe, glm4moe)",
                         path, (int)(arch_len > 64 ? 64 : arch_len), arch);
    }
    mg_gguf_close(first); /* reopened as shard 0 below: one owner per part */
    if (rc) return rc;
    if ((rc = mg_ck_alloc_shards(ck, (int)count, err))) return rc;
    if ((rc = open_part(ck, 0, path, err))) return rc;
    char *part = malloc(strlen(path) + 1);
    if (!part) return mg_fail(err, "%s: out of memory", path);
    for (uint64_t k = 1; k < count && !rc; k++) {
        snprintf(part, strlen(path) + 1, "%.*s-%05llu-of-%05llu.gguf", (int)prefix_len, path,
                 (unsigned long long)(k + 1), (unsigned long long)count);
        if (access(part, F_OK)) {
            rc = mg_fail(err, "%s: split part %llu of %llu is missing: %s (%s)", path,
                         (unsigned long long)(k + 1), (unsigned long long)count, part, strerror(errno));
            break;
        }
        if ((rc = open_part(ck, (int)k, part, err))) break;
        uint64_t c, n;
        if ((rc = split_info(ck->shards[k].gguf, &c, &n, err))) break;
        if (c != count || n != k)
            rc = mg_fail(err, "%s: split.count %llu and split.no %llu, expected %llu and %llu (a part "
                         "of another split set?)", part, (unsigned long long)c, (unsigned long long)n,
                         (unsigned long long)count, (unsigned long long)k);
    }
    free(part);
    if (rc) return rc;
    /* The first part records how many tensors the whole set holds. */
    const mg_gguf_kv *tc = mg_gguf_find_kv(ck->shards[0].gguf, "split.tensors.count");
    uint64_t want = 0, have = 0;
    if (tc && !mg_gguf_kv_uint(tc, &want)) {
        for (int i = 0; i < ck->n_shards; i++) have += mg_gguf_tensor_count(ck->shards[i].gguf);
        if (have != want)
            return mg_fail(err, "%s: split.tensors.count is %llu but the %d parts hold %llu tensors",
                           path, (unsigned long long)want, ck->n_shards, (unsigned long long)have);
    }
    for (int i = 0; i < ck->n_shards; i++)
        if ((rc = add_part_tensors(ck, i, err))) return rc;
    return mg_ck_build_index(ck, err);
}
