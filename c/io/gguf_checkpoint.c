/* A GGUF file (or split set) as an mg_checkpoint: every tensor under the name the architecture
 * loader binds (Hugging Face names for qwen3moe / glm4moe, DeepSeek's release names for
 * deepseek4), shapes in [rows, cols] order, and each stacked expert tensor
 * (`blk.N.ffn_{gate,up,down}_exps.weight`, docs/reference/gguf.md §4) cut into one tensor per
 * expert whose bytes are that expert's contiguous slice, so the expert store reads one expert
 * by shard descriptor and file offset exactly as it does for safetensors.
 *
 * Names not in the table (GLM's `nextn.*` MTP tensors, say) are kept under their GGUF name:
 * nothing binds them, and nothing is silently dropped.  The permutation llama.cpp's converter
 * applies to llama-style q/k rows does not apply here: qwen3moe and glm4moe use the neox
 * (rotate-half) RoPE in both llama.cpp and transformers, so their q/k rows are stored as
 * released; the deepseek4 converter renames and requantises but reorders no rows either. */
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

typedef struct { const char *gguf, *to; } name_pair;

/* One architecture family's names: GGUF -> the names its loader binds. */
typedef struct {
    const char *const *archs; /* general.architecture values it serves */
    size_t n_archs;
    const name_pair *globals, *layers, *stacked; /* stacked: .to is the expert projection */
    size_t n_globals, n_layers, n_stacked;
    const char *layer_prefix; /* "model.layers." or "layers." */
    const char *expert_infix; /* <layer_prefix>N.<expert_infix>E.<proj>.weight: one expert */
} name_table;

/* ---- qwen3moe, glm4moe: Hugging Face names (model.layers.N.*) ---- */

static const char *const hf_archs[] = {"qwen3moe", "glm4moe"};

/* blk.N.<gguf suffix> -> model.layers.N.<hf suffix> */
static const name_pair hf_layer_names[] = {
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
static const name_pair hf_stacked_names[] = {
    {"ffn_gate_exps.weight", "gate_proj"},
    {"ffn_up_exps.weight", "up_proj"},
    {"ffn_down_exps.weight", "down_proj"},
};

static const name_pair hf_global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* ---- deepseek4: DeepSeek's own release names (layers.N.*), which deepseek_v4.c binds ----
 * llama.cpp's converter renames without touching the values of BF16/F32 tensors, requantises
 * what the release stores as FP8 (dequantised with its 128x128 scales) to Q8_0, repacks the FP4
 * experts into MXFP4 blocks (lossless: the same codes and E8M0 scales, only reordered), stacks
 * them per layer, and stores the hash-routing tables as I32.  The FP8/FP4 `.scale` siblings are
 * gone: the block formats carry their own scales. */

static const char *const ds4_archs[] = {"deepseek4"};

static const name_pair ds4_layer_names[] = {
    {"attn_norm.weight", "attn_norm.weight"},
    {"ffn_norm.weight", "ffn_norm.weight"},
    {"hc_attn_fn.weight", "hc_attn_fn"},
    {"hc_attn_base.weight", "hc_attn_base"},
    {"hc_attn_scale.weight", "hc_attn_scale"},
    {"hc_ffn_fn.weight", "hc_ffn_fn"},
    {"hc_ffn_base.weight", "hc_ffn_base"},
    {"hc_ffn_scale.weight", "hc_ffn_scale"},
    {"attn_sinks.weight", "attn.attn_sink"},
    {"attn_q_a.weight", "attn.wq_a.weight"},
    {"attn_q_a_norm.weight", "attn.q_norm.weight"},
    {"attn_q_b.weight", "attn.wq_b.weight"},
    {"attn_kv.weight", "attn.wkv.weight"},
    {"attn_kv_a_norm.weight", "attn.kv_norm.weight"},
    {"attn_output_a.weight", "attn.wo_a.weight"},
    {"attn_output_b.weight", "attn.wo_b.weight"},
    {"attn_compressor_ape.weight", "attn.compressor.ape"},
    {"attn_compressor_kv.weight", "attn.compressor.wkv.weight"},
    {"attn_compressor_gate.weight", "attn.compressor.wgate.weight"},
    {"attn_compressor_norm.weight", "attn.compressor.norm.weight"},
    {"indexer.attn_q_b.weight", "attn.indexer.wq_b.weight"},
    {"indexer.proj.weight", "attn.indexer.weights_proj.weight"},
    {"indexer_compressor_ape.weight", "attn.indexer.compressor.ape"},
    {"indexer_compressor_kv.weight", "attn.indexer.compressor.wkv.weight"},
    {"indexer_compressor_gate.weight", "attn.indexer.compressor.wgate.weight"},
    {"indexer_compressor_norm.weight", "attn.indexer.compressor.norm.weight"},
    {"ffn_gate_inp.weight", "ffn.gate.weight"},
    {"exp_probs_b.bias", "ffn.gate.bias"},
    {"ffn_gate_tid2eid.weight", "ffn.gate.tid2eid"},
    {"ffn_gate_shexp.weight", "ffn.shared_experts.w1.weight"},
    {"ffn_down_shexp.weight", "ffn.shared_experts.w2.weight"},
    {"ffn_up_shexp.weight", "ffn.shared_experts.w3.weight"},
};

/* w1 = gate, w2 = down, w3 = up, as in the release */
static const name_pair ds4_stacked_names[] = {
    {"ffn_gate_exps.weight", "w1"},
    {"ffn_down_exps.weight", "w2"},
    {"ffn_up_exps.weight", "w3"},
};

static const name_pair ds4_global_names[] = {
    {"token_embd.weight", "embed.weight"},
    {"output_norm.weight", "norm.weight"},
    {"output.weight", "head.weight"},
    {"output_hc_fn.weight", "hc_head_fn"},
    {"output_hc_base.weight", "hc_head_base"},
    {"output_hc_scale.weight", "hc_head_scale"},
};

#define N_OF(a) (sizeof a / sizeof *a)
static const name_table tables[] = {
    {hf_archs, N_OF(hf_archs), hf_global_names, hf_layer_names, hf_stacked_names, N_OF(hf_global_names),
     N_OF(hf_layer_names), N_OF(hf_stacked_names), "model.layers.", "mlp.experts."},
    {ds4_archs, N_OF(ds4_archs), ds4_global_names, ds4_layer_names, ds4_stacked_names, N_OF(ds4_global_names),
     N_OF(ds4_layer_names), N_OF(ds4_stacked_names), "layers.", "ffn.experts."},
};
#define N_TABLES N_OF(tables)

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

/* The GGUF name of a bound name in one table; -1 when the table has none. */
static int stored_name_in(const name_table *tb, const char *to, char *out, size_t cap) {
    for (size_t k = 0; k < tb->n_globals; k++)
        if (!strcmp(to, tb->globals[k].to)) return snprintf(out, cap, "%s", tb->globals[k].gguf) < 0 ? -1 : 0;
    const char *p = tb->layer_prefix;
    if (strncmp(to, p, strlen(p))) return -1;
    char *end;
    long layer = strtol(to + strlen(p), &end, 10);
    if (end == to + strlen(p) || *end != '.') return -1;
    const char *rest = end + 1;
    size_t n = 0;
    for (size_t k = 0; k < tb->n_layers && n < cap; k++)
        if (!strcmp(rest, tb->layers[k].to)) /* post_attention_layernorm has two names */
            n += (size_t)snprintf(out + n, cap - n, "%sblk.%ld.%s", n ? " or " : "", layer, tb->layers[k].gguf);
    if (n) return 0;
    size_t il = strlen(tb->expert_infix);
    if (strncmp(rest, tb->expert_infix, il)) return -1;
    long e;
    char proj[16];
    int used = 0;
    if (sscanf(rest + il, "%ld.%15[a-z0-9_].weight%n", &e, proj, &used) == 2 && rest[il + (size_t)used] == 0)
        for (size_t k = 0; k < tb->n_stacked; k++)
            if (!strcmp(proj, tb->stacked[k].to)) {
                snprintf(out, cap, "blk.%ld.%s (expert %ld)", layer, tb->stacked[k].gguf, e);
                return 0;
            }
    return -1;
}

/* The tables' bound names do not overlap (model.layers.* and lm_head vs layers.*, embed, head),
 * so the first table that knows a name gives its GGUF name. */
int mg_gguf_stored_name(const char *hf, char *out, size_t cap) {
    for (size_t i = 0; i < N_TABLES; i++)
        if (!stored_name_in(&tables[i], hf, out, cap)) return 0;
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
static int add_experts(mg_checkpoint *ck, int si, const mg_gguf_tensor *g, const name_table *tb, long layer,
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
        snprintf(name, sizeof name, "%s%ld.%s%lld.%s.weight", tb->layer_prefix, layer, tb->expert_infix,
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

static int add_part_tensors(mg_checkpoint *ck, int si, const name_table *tb, mg_error *err) {
    const mg_gguf *g = ck->shards[si].gguf;
    char name[160];
    for (size_t i = 0; i < mg_gguf_tensor_count(g); i++) {
        const mg_gguf_tensor *t = mg_gguf_tensor_at(g, i);
        const char *to = NULL;
        for (size_t k = 0; k < tb->n_globals && !to; k++)
            if (!strcmp(t->name, tb->globals[k].gguf)) to = tb->globals[k].to;
        long layer;
        const char *rest;
        if (!to && !split_layer_name(t->name, &layer, &rest)) {
            for (size_t k = 0; k < tb->n_stacked; k++)
                if (!strcmp(rest, tb->stacked[k].gguf)) {
                    if (add_experts(ck, si, t, tb, layer, tb->stacked[k].to, err)) return -1;
                    rest = NULL;
                    break;
                }
            if (!rest) continue;
            for (size_t k = 0; k < tb->n_layers && !to; k++)
                if (!strcmp(rest, tb->layers[k].gguf)) {
                    snprintf(name, sizeof name, "%s%ld.%s", tb->layer_prefix, layer, tb->layers[k].to);
                    to = name;
                }
        }
        if (add_tensor(ck, si, t, to ? to : t->name, err)) return -1;
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
    const name_table *tb = NULL;
    if (!rc) {
        for (size_t i = 0; i < N_TABLES && !tb; i++)
            for (size_t k = 0; k < tables[i].n_archs; k++)
                if (strlen(tables[i].archs[k]) == arch_len && !memcmp(arch, tables[i].archs[k], arch_len))
                    tb = &tables[i];
        if (!tb)
            rc = mg_fail(err, "%s: general.architecture '%.*s' is not supported (supported: qwen3moe, glm4moe, "
                         "deepseek4)", path, (int)(arch_len > 64 ? 64 : arch_len), arch);
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
        if ((rc = add_part_tensors(ck, i, tb, err))) return rc;
    return mg_ck_build_index(ck, err);
}
