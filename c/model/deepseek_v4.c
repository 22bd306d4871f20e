/* DeepSeek-V4 (Flash / Pro) forward pass, original checkpoint naming, weights in their stored
 * formats (FP8 + ue8m0 128x128 blocks, FP4 experts + ue8m0 per 32, BF16, F32).
 * Spec: docs/reference/dsv4-arch.md; numerics follow transformers' DeepseekV4 in fp32.
 *
 * Per layer: mHC collapse -> RMSNorm -> attention (shared K=V MQA over a sliding window plus,
 * for compressed layers, compressed rows: CSA picks them with the lightning indexer, HCA uses
 * all) -> grouped output projection -> mHC expand; then the same around the MoE (hash routing
 * via tid2eid on the first layers, sqrt-softplus scores + bias top-k on the rest, shared expert).
 *
 * State of the one sequence slot and how truncation stays exact:
 *   - every position's K=V row of every layer (the window reads the last W; truncation
 *     rebuilds nothing);
 *   - compressed rows per compressed layer (and indexer rows), cut back on truncation;
 *   - compressor carries: empty at multiples of the ratio, except the overlapping (CSA) A
 *     halves, snapshotted at every multiple of L = lcm(ratios);
 *   - the token ids.
 * truncate(n) rewinds every compressor to t0 = L * floor(n / L) and replays tokens [t0, n)
 * (< L tokens, no head) — so any prefix can be reused, and the gateway's prefix cache only
 * needs truncate + eval. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/dsv4_compress.h"
#include "model/dsv4_hc.h"
#include "model/dsv4_rows.h"
#include "model/weights.h"

#define CHUNK 128 /* prefill sub-chunk of the dense work: bounds its scratch (the window is a multiple) */
#define MAX_INDEX_DIM 1024 /* index_head_dim bound: an indexer key read back from bf16 fits on the stack */
#define DSV4_PI 3.14159265358979323846

enum { ATTN_SWA = 0, ATTN_CSA = 1, ATTN_HCA = 2 };

enum { /* scratch slots: shared ones, then attention-only and MoE-only ones overlaid */
    B_X, B_XN, B_MIX, B_PRE, B_POST, B_COMB, B_U, B_H, B_O, B_COS, B_SIN, B_COSC, B_SINC, B_HCTMP,
    B_REGION,
    B_QA = B_REGION, B_Q, B_KV, B_CKV, B_CGATE, B_IKV, B_IGATE, B_IQ, B_IW, B_IWT, B_SEL, B_ATT, B_GRP,
    B_RLOG = B_REGION, B_RW, B_RIDS, B_SH, B_MOE0 /* + 4 */
};

typedef struct dcfg {
    int64_t vocab, d, n_layers, H, D, rope, q_rank, G, o_rank, W, n_hash, E, K, I, HI, DI, topk;
    int n_hc, sinkhorn;
    double hc_eps, eps, rsf, limit, theta, ctheta, yarn_factor, yarn_orig, beta_fast, beta_slow;
    int64_t *kinds, *ratios;
} dcfg;

typedef struct layer {
    int kind, ratio;
    dsv4_hc hc_attn, hc_ffn;
    float *attn_norm, *ffn_norm, *q_norm, *kv_norm, *sink;
    mg_matrix wq_a, wq_b, wkv, wo_a, wo_b;
    mg_matrix *wo_a_groups;         /* [G] row blocks of wo_a */
    dsv4_compressor comp, icomp;    /* icomp: indexer compressor (CSA) */
    mg_matrix iwq_b, iweights;      /* indexer (CSA) */
    mg_matrix gate;                 /* router [E, d] */
    float *gate_bias;               /* score layers */
    const void *tid2eid;            /* hash layers: [vocab, K] I64 or I32 */
    int tid2eid_i64;
    mg_mlp shared;
} layer;

typedef struct state {
    dcfg c;
    const mg_compute *comp;
    layer *layers;
    mg_matrix embed, head;
    float *final_norm;
    dsv4_hc hc_head;
    dsv4_hc_dims hcd;
    mg_rope rope_main, rope_comp, rope_comp_idx; /* last rope dims of D / of DI */
    dsv4_rows rows;                              /* the recent positions' K=V rows, per layer */
    mg_expert_store *experts;
    mg_buffers buf;
    mg_weight_census census;
    int32_t *tokens;                             /* [max_ctx] */
    int64_t max_ctx, snap_every;
    mg_kv_type kv_type;                          /* K=V rows, compressed rows, indexer keys */
    int budgeted;                                /* --ram: the slot state is reserved at load */
    float *attn_scratch;
    int64_t attn_scratch_per_worker;
    int64_t window;                              /* prefill tokens evaluated layer by layer at once */
    uint64_t window_bytes_per_token;             /* the scratch each of them holds */
} state;

/* ---- config -------------------------------------------------------------------------------- */

static int read_cfg(const mg_json *j, dcfg *c, mg_error *err) {
    int64_t n_kinds = 0, n_ratios = 0, n_hc = 0, sink = 0;
    if (mg_config_int(j, "vocab_size", &c->vocab, err) || mg_config_int(j, "hidden_size", &c->d, err) ||
        mg_config_int(j, "n_layers", &c->n_layers, err) || mg_config_int(j, "n_heads", &c->H, err) ||
        mg_config_int(j, "head_dim", &c->D, err) || mg_config_int(j, "rope_dim", &c->rope, err) ||
        mg_config_int(j, "q_lora_rank", &c->q_rank, err) || mg_config_int(j, "o_groups", &c->G, err) ||
        mg_config_int(j, "o_lora_rank", &c->o_rank, err) || mg_config_int(j, "sliding_window", &c->W, err) ||
        mg_config_int(j, "n_hash_layers", &c->n_hash, err) || mg_config_int(j, "n_experts", &c->E, err) ||
        mg_config_int(j, "n_experts_per_tok", &c->K, err) ||
        mg_config_int(j, "moe_intermediate_size", &c->I, err) ||
        mg_config_int(j, "index_n_heads", &c->HI, err) || mg_config_int(j, "index_head_dim", &c->DI, err) ||
        mg_config_int(j, "index_topk", &c->topk, err) || mg_config_int(j, "hc_mult", &n_hc, err) ||
        mg_config_int(j, "hc_sinkhorn_iters", &sink, err) || mg_config_num(j, "hc_eps", &c->hc_eps, err) ||
        mg_config_num(j, "rms_norm_eps", &c->eps, err) ||
        mg_config_num(j, "routed_scaling_factor", &c->rsf, err) ||
        mg_config_num(j, "swiglu_limit", &c->limit, err) || mg_config_num(j, "rope_theta", &c->theta, err) ||
        mg_config_num(j, "compress_rope_theta", &c->ctheta, err) ||
        mg_config_num(j, "yarn_factor", &c->yarn_factor, err) ||
        mg_config_num(j, "yarn_original_max_position", &c->yarn_orig, err) ||
        mg_config_num(j, "yarn_beta_fast", &c->beta_fast, err) ||
        mg_config_num(j, "yarn_beta_slow", &c->beta_slow, err) ||
        mg_config_int_array(j, "attn_kinds", &c->kinds, &n_kinds, err) ||
        mg_config_int_array(j, "compress_ratios", &c->ratios, &n_ratios, err))
        return -1;
    c->n_hc = (int)n_hc;
    c->sinkhorn = (int)sink;
    if (c->vocab <= 0 || c->d <= 0 || c->n_layers <= 0 || c->H <= 0 || c->D <= 0 || c->rope <= 0 || c->rope % 2 ||
        c->rope > c->D || c->rope > 512 || c->q_rank <= 0 || c->G <= 0 || c->H % c->G || c->o_rank <= 0 ||
        c->W <= 0 || c->E <= 0 || c->K <= 0 || c->K > c->E || c->I <= 0 || c->n_hash < 0 || n_hc <= 0 ||
        n_hc > 16 || sink <= 0)
        return mg_fail(err, "normalised config: inconsistent deepseek_v4 sizes");
    if (n_kinds != c->n_layers || n_ratios != c->n_layers)
        return mg_fail(err, "normalised config: attn_kinds / compress_ratios need %lld entries", (long long)c->n_layers);
    for (int64_t i = 0; i < c->n_layers; i++) {
        int64_t k = c->kinds[i], r = c->ratios[i];
        if (k < 0 || k > 2 || (k != ATTN_SWA && (r < 1 || r > 65536)))
            return mg_fail(err, "normalised config: layer %lld has attention kind %lld with ratio %lld",
                           (long long)i, (long long)k, (long long)r);
        if (k == ATTN_CSA && (c->HI <= 0 || c->DI < c->rope || c->DI > MAX_INDEX_DIM || c->topk <= 0))
            return mg_fail(err, "normalised config: inconsistent indexer sizes");
    }
    return 0;
}

/* ---- loading ------------------------------------------------------------------------------- */

static void layer_free(layer *L) {
    free(L->attn_norm); free(L->ffn_norm); free(L->q_norm); free(L->kv_norm); free(L->sink);
    free(L->hc_attn.base); free(L->hc_attn.scale); free(L->hc_ffn.base); free(L->hc_ffn.scale);
    free(L->gate_bias); free(L->wo_a_groups);
    dsv4_comp_free(&L->comp);
    dsv4_comp_free(&L->icomp);
}

static void state_free(void *p) {
    state *s = p;
    if (!s) return;
    if (s->layers)
        for (int64_t i = 0; i < s->c.n_layers; i++) layer_free(&s->layers[i]);
    free(s->layers);
    free(s->final_norm);
    free(s->hc_head.base);
    free(s->hc_head.scale);
    mg_rope_free(&s->rope_main);
    mg_rope_free(&s->rope_comp);
    mg_rope_free(&s->rope_comp_idx);
    dsv4_rows_free(&s->rows);
    mg_expert_store_free(s->experts);
    mg_buffers_free(&s->buf);
    free(s->tokens);
    free(s->attn_scratch);
    free(s->c.kinds);
    free(s->c.ratios);
    free(s);
}

static int bind_hc(state *s, const mg_checkpoint *ck, dsv4_hc *hc, int64_t mix, int64_t n_scale, const char *prefix,
                   const char *part, mg_error *err) {
    const int64_t w = s->c.n_hc * s->c.d;
    if (mg_bind_matrixf(ck, &s->census, mix, w, &hc->fn, err, "%shc_%sfn", prefix, part)) return -1;
    if (!(hc->base = mg_bind_vectorf(ck, mix, err, "%shc_%sbase", prefix, part))) return -1;
    if (!(hc->scale = mg_bind_vectorf(ck, n_scale, err, "%shc_%sscale", prefix, part))) return -1;
    return 0;
}

/* A view of rows [r0, r0 + n) of w (block-scaled formats need r0 on a block boundary). */
static int row_block(const mg_matrix *w, int64_t r0, int64_t n, mg_matrix *out, const char *name, mg_error *err) {
    *out = *w;
    out->rows = n;
    out->data = (const char *)w->data + (size_t)r0 * mg_matrix_row_bytes(w);
    switch (w->scale_kind) {
    case MG_SCALE_NONE: break;
    case MG_SCALE_F32_BLOCK128:
    case MG_SCALE_E8M0_BLOCK128:
        if (r0 % 128)
            return mg_fail(err, "%s: group rows start at %lld, not on a 128-row scale block", name, (long long)r0);
        out->scale = (const char *)w->scale + (size_t)(r0 / 128) * (size_t)w->scale_cols *
                                                  (w->scale_kind == MG_SCALE_F32_BLOCK128 ? 4 : 1);
        break;
    case MG_SCALE_E8M0_G32: out->scale = (const char *)w->scale + (size_t)r0 * (size_t)w->scale_cols; break;
    default: return mg_fail(err, "%s: unsupported scale kind", name);
    }
    return 0;
}

/* Recent carry snapshots a compressor holds: every multiple of snap_every the window-row ring
 * can rewind to (dsv4_rows.h), with a slot to spare either side. */
static int64_t comp_ring_len(const state *s) {
    return dsv4_rows_ring_len(s->c.W, CHUNK) / s->snap_every + 2;
}

static int bind_compressor(state *s, const mg_checkpoint *ck, dsv4_compressor *cp, int ratio, int dim, int overlap,
                           const mg_rope *rope, const char *prefix, mg_error *err) {
    const int64_t w = (int64_t)(overlap ? 2 : 1) * dim;
    cp->ratio = ratio;
    cp->dim = dim;
    cp->overlap = overlap;
    cp->snap_every = s->snap_every;
    cp->keep_every = dsv4_rows_period(s->c.W, s->snap_every); /* where deep rewinds land */
    cp->ring_len = comp_ring_len(s);
    cp->rope = rope;
    cp->eps = (float)s->c.eps;
    cp->row_type = s->kv_type;
    if (mg_bind_matrixf(ck, &s->census, w, s->c.d, &cp->wkv, err, "%s.wkv.weight", prefix) ||
        mg_bind_matrixf(ck, &s->census, w, s->c.d, &cp->wgate, err, "%s.wgate.weight", prefix))
        return -1;
    char name[160];
    snprintf(name, sizeof name, "%s.ape", prefix);
    if (!(cp->ape = mg_bind_array(ck, name, (int64_t)ratio * w, err))) return -1;
    if (!(cp->norm = mg_bind_vectorf(ck, dim, err, "%s.norm.weight", prefix))) return -1;
    return dsv4_comp_init(cp, err) || (s->budgeted && dsv4_comp_reserve(cp, s->max_ctx, err)) ? -1 : 0;
}

static int bind_tid2eid(state *s, const mg_checkpoint *ck, layer *L, int li, mg_error *err) {
    char name[96];
    snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", li);
    const mg_tensor *t = mg_checkpoint_find(ck, name);
    /* a GGUF file names it blk.N.ffn_gate_tid2eid.weight: the message says so */
    char stored[128] = "";
    if (mg_checkpoint_is_gguf(ck) && !mg_gguf_stored_name(name, stored + 8, sizeof stored - 10)) {
        memcpy(stored, " (GGUF '", 8);
        strcat(stored, "')");
    }
    if (!t) return mg_fail(err, "tensor '%s'%s is missing (hash-routed layer)", name, stored);
    if ((t->dtype != MG_DT_I64 && t->dtype != MG_DT_I32) || t->ndim != 2 || t->shape[0] != s->c.vocab ||
        t->shape[1] != s->c.K)
        return mg_fail(err, "tensor '%s'%s: expected I64 or I32 [%lld, %lld]", name, stored, (long long)s->c.vocab,
                       (long long)s->c.K);
    L->tid2eid = t->data;
    L->tid2eid_i64 = t->dtype == MG_DT_I64;
    /* every entry must name an expert: checked once here, not per token */
    for (int64_t i = 0; i < s->c.vocab * s->c.K; i++) {
        int64_t e = L->tid2eid_i64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
        if (e < 0 || e >= s->c.E)
            return mg_fail(err, "tensor '%s'%s: entry %lld names expert %lld outside [0, %lld)", name, stored, (long long)i,
                           (long long)e, (long long)s->c.E);
    }
    return 0;
}

static int load_layer(state *s, const mg_checkpoint *ck, int li, mg_error *err) {
    const dcfg *c = &s->c;
    layer *L = &s->layers[li];
    mg_weight_census *cs = &s->census;
    const int64_t d = c->d, mix = (2 + c->n_hc) * c->n_hc;
    char p[64], a[80], f[80];
    snprintf(p, sizeof p, "layers.%d.", li);
    snprintf(a, sizeof a, "layers.%d.attn", li);
    snprintf(f, sizeof f, "layers.%d.ffn", li);
    L->kind = (int)c->kinds[li];
    L->ratio = (int)c->ratios[li];
    if (bind_hc(s, ck, &L->hc_attn, mix, 3, p, "attn_", err) || bind_hc(s, ck, &L->hc_ffn, mix, 3, p, "ffn_", err))
        return -1;
    if (!(L->attn_norm = mg_bind_vectorf(ck, d, err, "%sattn_norm.weight", p)) ||
        !(L->ffn_norm = mg_bind_vectorf(ck, d, err, "%sffn_norm.weight", p)) ||
        !(L->q_norm = mg_bind_vectorf(ck, c->q_rank, err, "%s.q_norm.weight", a)) ||
        !(L->kv_norm = mg_bind_vectorf(ck, c->D, err, "%s.kv_norm.weight", a)) ||
        !(L->sink = mg_bind_vectorf(ck, c->H, err, "%s.attn_sink", a)))
        return -1;
    const int64_t hd = c->H * c->D;
    if (mg_bind_matrixf(ck, cs, c->q_rank, d, &L->wq_a, err, "%s.wq_a.weight", a) ||
        mg_bind_matrixf(ck, cs, hd, c->q_rank, &L->wq_b, err, "%s.wq_b.weight", a) ||
        mg_bind_matrixf(ck, cs, c->D, d, &L->wkv, err, "%s.wkv.weight", a) ||
        mg_bind_matrixf(ck, cs, c->G * c->o_rank, hd / c->G, &L->wo_a, err, "%s.wo_a.weight", a) ||
        mg_bind_matrixf(ck, cs, d, c->G * c->o_rank, &L->wo_b, err, "%s.wo_b.weight", a))
        return -1;
    if (!(L->wo_a_groups = calloc((size_t)c->G, sizeof(mg_matrix)))) return mg_fail(err, "out of memory");
    for (int64_t g = 0; g < c->G; g++) {
        char name[96];
        snprintf(name, sizeof name, "%s.wo_a.weight", a);
        if (row_block(&L->wo_a, g * c->o_rank, c->o_rank, &L->wo_a_groups[g], name, err)) return -1;
    }
    if (L->kind != ATTN_SWA) {
        char cp[128];
        snprintf(cp, sizeof cp, "%s.compressor", a);
        if (bind_compressor(s, ck, &L->comp, L->ratio, (int)c->D, L->kind == ATTN_CSA, &s->rope_comp, cp, err))
            return -1;
    }
    if (L->kind == ATTN_CSA) {
        char ip[128];
        snprintf(ip, sizeof ip, "%s.indexer.compressor", a);
        if (bind_compressor(s, ck, &L->icomp, L->ratio, (int)c->DI, 1, &s->rope_comp_idx, ip, err)) return -1;
        if (mg_bind_matrixf(ck, cs, c->HI * c->DI, c->q_rank, &L->iwq_b, err, "%s.indexer.wq_b.weight", a) ||
            mg_bind_matrixf(ck, cs, c->HI, d, &L->iweights, err, "%s.indexer.weights_proj.weight", a))
            return -1;
    }
    if (mg_bind_matrixf(ck, cs, c->E, d, &L->gate, err, "%s.gate.weight", f)) return -1;
    if (li < c->n_hash) {
        if (bind_tid2eid(s, ck, L, li, err)) return -1;
    } else if (!(L->gate_bias = mg_bind_vectorf(ck, c->E, err, "%s.gate.bias", f))) {
        return -1;
    }
    if (mg_bind_matrixf(ck, cs, c->I, d, &L->shared.gate, err, "%s.shared_experts.w1.weight", f) ||
        mg_bind_matrixf(ck, cs, c->I, d, &L->shared.up, err, "%s.shared_experts.w3.weight", f) ||
        mg_bind_matrixf(ck, cs, d, c->I, &L->shared.down, err, "%s.shared_experts.w2.weight", f))
        return -1;
    for (int e = 0; e < c->E; e++) {
        mg_expert x;
        if (mg_bind_matrixf(ck, cs, c->I, d, &x.gate, err, "%s.experts.%d.w1.weight", f, e) ||
            mg_bind_matrixf(ck, cs, c->I, d, &x.up, err, "%s.experts.%d.w3.weight", f, e) ||
            mg_bind_matrixf(ck, cs, d, c->I, &x.down, err, "%s.experts.%d.w2.weight", f, e))
            return -1;
        mg_expert_store_set(s->experts, li, e, &x);
    }
    return 0;
}

/* YaRN inverse frequencies exactly as transformers' _compute_yarn_parameters (fp32 tensors). */
static void yarn_inv_freq(float *inv, int dim, double base, double factor, double orig, double beta_fast,
                          double beta_slow) {
    const int half = dim / 2;
    double low = dim * log(orig / (beta_fast * 2 * DSV4_PI)) / (2 * log(base));
    double high = dim * log(orig / (beta_slow * 2 * DSV4_PI)) / (2 * log(base));
    low = floor(low);
    high = ceil(high);
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (int j = 0; j < half; j++) {
        float pos_freq = powf((float)base, (float)(2 * j) / (float)dim);
        float extrap = 1.0f / pos_freq, interp = 1.0f / ((float)factor * pos_freq);
        float ramp = ((float)j - (float)low) / ((float)high - (float)low);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp;
        inv[j] = interp * (1.0f - ef) + extrap * ef;
    }
}

/* What one position of context costs in the slot: its share of the window-row snapshots
 * (dsv4_rows.h; the ring itself is a fixed cost, ring_bytes), the compressed
 * rows (1 per ratio positions) and indexer keys of compressed layers, the carry snapshots of
 * overlapping compressors, and the token id kept for replay. */
static uint64_t slot_bytes_per_token(const state *s) {
    const dcfg *c = &s->c;
    uint64_t b = dsv4_rows_bytes_per_pos((int)c->n_layers, c->D, c->W, s->snap_every, s->kv_type) + sizeof(int32_t);
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->kinds[i] == ATTN_SWA) continue;
        const int r = (int)c->ratios[i], csa = c->kinds[i] == ATTN_CSA;
        const int64_t keep = dsv4_rows_period(c->W, s->snap_every);
        b += dsv4_comp_bytes_per_pos(r, (int)c->D, csa, keep, s->kv_type);
        if (csa) b += dsv4_comp_bytes_per_pos(r, (int)c->DI, 1, keep, s->kv_type);
    }
    return b;
}

/* The rings of recent K=V rows and of recent compressor carries: paid once, whatever the context. */
static uint64_t ring_bytes(const state *s) {
    const dcfg *c = &s->c;
    uint64_t b = dsv4_rows_fixed_bytes((int)c->n_layers, c->D, c->W, CHUNK, s->kv_type);
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->kinds[i] != ATTN_CSA) continue; /* only overlapping (CSA) compressors carry */
        b += dsv4_comp_fixed_bytes((int)c->ratios[i], (int)c->D, 1, comp_ring_len(s));
        b += dsv4_comp_fixed_bytes((int)c->ratios[i], (int)c->DI, 1, comp_ring_len(s));
    }
    return b;
}

/* Floats per token of a prefill window's own arrays (win_bufs below: residual streams, block
 * inputs and outputs, mHC mixes, RoPE tables, routing; the MoE's rows are
 * mg_moe_floats_per_token). */
static uint64_t win_floats_per_token(const dcfg *c) {
    const uint64_t n = (uint64_t)c->n_hc, d = (uint64_t)c->d;
    return n * d + 3 * d + n + n * n + 2 * (uint64_t)c->rope + 2 * (uint64_t)c->K;
}

static int64_t gcd64(int64_t a, int64_t b) { while (b) { int64_t t = a % b; a = b; b = t; } return a; }

static void *load(const mg_arch_env *env, mg_error *err) {
    state *s = calloc(1, sizeof *s);
    if (!s) {
        mg_fail(err, "out of memory");
        return NULL;
    }
    s->comp = env->compute;
    s->max_ctx = env->max_ctx;
    s->kv_type = (mg_kv_type)env->kv_type;
    s->budgeted = env->ram_gb > 0;
    if (read_cfg(env->config, &s->c, err)) goto fail;
    const dcfg *c = &s->c;
    const mg_checkpoint *ck = env->ck;
    s->hcd = (dsv4_hc_dims){c->n_hc, c->sinkhorn, c->d, (float)c->eps, (float)c->hc_eps};
    /* replay granularity: lcm of the compression ratios (every carry is exactly restorable there) */
    s->snap_every = 1;
    for (int64_t i = 0; i < c->n_layers; i++)
        if (c->kinds[i] != ATTN_SWA) s->snap_every = s->snap_every / gcd64(s->snap_every, c->ratios[i]) * c->ratios[i];
    if (s->snap_every > 4096) {
        mg_fail(err, "compression ratios give a replay period of %lld tokens (max 4096)", (long long)s->snap_every);
        goto fail;
    }
    if (mg_rope_init(&s->rope_main, (int)c->rope, (int)(c->D - c->rope), c->theta, 1, err) ||
        mg_rope_init(&s->rope_comp, (int)c->rope, (int)(c->D - c->rope), c->ctheta, 1, err) ||
        mg_rope_init(&s->rope_comp_idx, (int)c->rope, (int)(c->DI - c->rope), c->ctheta, 1, err))
        goto fail;
    if (c->yarn_factor != 1.0) {
        yarn_inv_freq(s->rope_comp.inv_freq, (int)c->rope, c->ctheta, c->yarn_factor, c->yarn_orig, c->beta_fast,
                      c->beta_slow);
        memcpy(s->rope_comp_idx.inv_freq, s->rope_comp.inv_freq, sizeof(float) * (size_t)(c->rope / 2));
    }
    if (!(s->layers = calloc((size_t)c->n_layers, sizeof(layer))) ||
        !(s->tokens = calloc((size_t)s->max_ctx, sizeof(int32_t)))) {
        mg_fail(err, "out of memory");
        goto fail;
    }
    if (!(s->experts = mg_expert_store_create((int)c->n_layers, (int)c->E, err))) goto fail;
    if (mg_bind_matrixf(ck, &s->census, c->vocab, c->d, &s->embed, err, "embed.weight")) goto fail;
    for (int i = 0; i < c->n_layers; i++)
        if (load_layer(s, ck, i, err)) goto fail;
    if (!(s->final_norm = mg_bind_vectorf(ck, c->d, err, "norm.weight"))) goto fail;
    if (bind_hc(s, ck, &s->hc_head, c->n_hc, 1, "", "head_", err)) goto fail;
    if (mg_bind_matrixf(ck, &s->census, c->vocab, c->d, &s->head, err, "head.weight")) goto fail;
    if (dsv4_rows_init(&s->rows, (int)c->n_layers, c->D, c->W, CHUNK, s->snap_every, s->max_ctx, s->kv_type, err))
        goto fail;
    /* A budget counts the slot at max_ctx: reserve it now (pages become resident as positions
     * are written), so growth never holds an old and a new copy at once. */
    if (s->budgeted && dsv4_rows_reserve(&s->rows, s->max_ctx, err)) goto fail;
    /* --ram budget: what is not resident weights, the slot's state at max_ctx (KV rows,
     * compressed rows, indexer keys, carry snapshots, token ids: slot_bytes_per_token) and chunk
     * scratch caches experts. */
    uint64_t slot_bytes = (uint64_t)s->max_ctx * slot_bytes_per_token(s) + ring_bytes(s);
    const mg_prefill_cost pc = {CHUNK, sizeof(float) * (win_floats_per_token(c) + mg_moe_floats_per_token(c->d, c->K, c->I, c->I)),
                                sizeof(float) * mg_moe_fixed_floats(c->d, c->K, c->I, CHUNK)};
    if (mg_expert_store_apply_budget(env, s->experts, &s->census, slot_bytes + (64u << 20), &pc, &s->window, err))
        goto fail;
    s->window_bytes_per_token = pc.bytes_per_token;
    return s;
fail:
    state_free(s);
    return NULL;
}

/* ---- attention ----------------------------------------------------------------------------- */

#define KV_BLOCK 32 /* rows materialised per step: a block stays in L1 while every head of a slice reads it */

typedef struct attn_ctx {
    const state *s;
    const layer *L;
    int li;
    const float *q;        /* [m, H*D] */
    float *out;            /* [m, H*D] */
    int64_t m, pos;
    const int *sel;        /* CSA: [m, topk] selected compressed rows */
    const int *n_sel;      /* CSA: [m] */
    float *scratch;
    int64_t per_worker;    /* heads_per_item score rows of s_row floats, then KV_BLOCK rows of D */
    int64_t s_row;         /* the most rows a token sees */
    int heads_per_item;    /* query heads one work item covers (a slice of the token's H) */
    int items_per_token;
} attn_ctx;

/* Rows [j0, j0 + nb) of what token t sees (window rows from lo, n_win of them, then its compressed
 * rows: sel's, or all in order) as nb consecutive fp32 rows of D: in place when an fp32 cache
 * holds them consecutively, else gathered (bf16: converted) into buf. */
static const float *attn_rows(const attn_ctx *a, int64_t lo, int64_t n_win, const int *sel, int64_t j0, int64_t nb,
                              float *buf) {
    const int64_t D = a->s->c.D;
    const float *src[KV_BLOCK] = {NULL}; /* nb >= 1; the initialiser quiets -Wmaybe-uninitialized */
    int contiguous = 1;
    for (int64_t r = 0; r < nb; r++) {
        const int64_t j = j0 + r;
        float *dst = buf + r * D;
        src[r] = j < n_win ? dsv4_rows_get(&a->s->rows, a->li, lo + j, dst)
                           : dsv4_comp_row(&a->L->comp, sel ? sel[j - n_win] : j - n_win, dst);
        contiguous &= (uintptr_t)src[r] == (uintptr_t)src[0] + (uintptr_t)(r * D) * sizeof(float);
    }
    if (contiguous) return src[0];
    for (int64_t r = 0; r < nb; r++)
        if (src[r] != buf + r * D) memcpy(buf + r * D, src[r], sizeof(float) * (size_t)D);
    return buf;
}

/* Query heads [h0, h1) of token t.  Every head reads the same rows (one K=V head): keys, then
 * values, go by blocks of KV_BLOCK rows materialised once for the whole slice; per head the
 * scaled scores, the softmax entry with the head's sink (its e^(sink - max) joins the sum, the
 * sink itself gets no value), then the probabilities' sum of rows in order (window, compressed). */
static void attn_slice(const attn_ctx *a, int64_t t, int h0, int h1, float *sc) {
    const state *s = a->s;
    const dcfg *c = &s->c;
    const mg_kernels *k = s->comp->k;
    const int64_t D = c->D, p = a->pos + t, s_row = a->s_row;
    const int nh = h1 - h0;
    const float *q = a->q + t * c->H * D + h0 * D;
    float *o = a->out + t * c->H * D + h0 * D;
    float *buf = sc + (int64_t)a->heads_per_item * s_row;
    const int64_t lo = p - c->W + 1 > 0 ? p - c->W + 1 : 0, n_win = p - lo + 1;
    int64_t n_comp = 0;
    const int *sel = NULL;
    if (a->L->kind == ATTN_HCA) n_comp = (p + 1) / a->L->ratio;
    else if (a->L->kind == ATTN_CSA) { n_comp = a->n_sel[t]; sel = a->sel + t * c->topk; }
    const int64_t n = n_win + n_comp;
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t j0 = 0; j0 < n; j0 += KV_BLOCK) {
        const int64_t nb = n - j0 < KV_BLOCK ? n - j0 : KV_BLOCK;
        mg_attn_scores(k, q, D, nh, attn_rows(a, lo, n_win, sel, j0, nb, buf), D, nb, D, scale, sc + j0, s_row);
    }
    for (int i = 0; i < nh; i++) k->softmax(sc + i * s_row, n, a->L->sink[h0 + i]);
    memset(o, 0, sizeof(float) * (size_t)(nh * D));
    for (int64_t j0 = 0; j0 < n; j0 += KV_BLOCK) {
        const int64_t nb = n - j0 < KV_BLOCK ? n - j0 : KV_BLOCK;
        mg_attn_values(k, o, D, nh, sc + j0, s_row, attn_rows(a, lo, n_win, sel, j0, nb, buf), D, nb, D);
    }
}

static void attn_task(void *ctx, int worker, int n_workers) {
    const attn_ctx *a = ctx;
    const int H = (int)a->s->c.H, per = a->items_per_token;
    int64_t begin, end;
    mg_split_range(a->m * per, 1, worker, n_workers, &begin, &end);
    float *sc = a->scratch + worker * a->per_worker;
    for (int64_t i = begin; i < end; i++) {
        const int h0 = (int)(i % per) * a->heads_per_item;
        const int h1 = h0 + a->heads_per_item < H ? h0 + a->heads_per_item : H;
        if (h0 < h1) attn_slice(a, i / per, h0, h1, sc);
    }
}

/* Lightning indexer scores (dsv4-arch §4.5): score[t, r] = sum_h w[t, h] * relu(q[t, h] . k[r]) for
 * the rows r visible to token t; rows are split over the pool (decode scans every row). */
typedef struct index_ctx {
    const mg_kernels *k;
    const float *iq, *iw;         /* [m, HI*DI], [m, HI] */
    const dsv4_compressor *keys;  /* the indexer compressor: its rows are the keys [n_rows, DI] */
    float *scores;                /* [m, n_rows] */
    int64_t m, pos, ratio, n_rows, HI, DI;
    float q_scale, w_scale;
} index_ctx;

static void index_task(void *ctx, int worker, int n_workers) {
    const index_ctx *x = ctx;
    int64_t begin, end;
    mg_split_range(x->m * x->n_rows, 16, worker, n_workers, &begin, &end);
    for (int64_t i = begin; i < end; i++) {
        const int64_t t = i / x->n_rows, r = i % x->n_rows;
        if (r >= (x->pos + t + 1) / x->ratio) continue; /* not visible to t */
        float tmp[MAX_INDEX_DIM];
        const float *qt = x->iq + t * x->HI * x->DI, *wt = x->iw + t * x->HI, *kr = dsv4_comp_row(x->keys, r, tmp);
        float acc = 0.0f;
        for (int64_t h = 0; h < x->HI; h++) {
            float dot = x->k->dot(qt + h * x->DI, kr, x->DI);
            acc += (dot > 0.0f ? dot * x->q_scale : 0.0f) * (wt[h] * x->w_scale);
        }
        x->scores[i] = acc;
    }
}

/* For each token, the top-min(topk, visible) indexer rows; ties keep the lower row first.
 * iq [m, HI*DI] (indexer queries before RoPE, rotated here) and iw [m, HI] (head weights) were
 * projected together with the block's other projections. */
static int indexer_select(state *s, const layer *L, float *iq, const float *iw, int64_t m, int64_t pos,
                          const float *cos_c, const float *sin_c, int *sel, int *n_sel, mg_error *err) {
    const dcfg *c = &s->c;
    const int64_t HI = c->HI, DI = c->DI, n_rows = L->icomp.n_rows;
    float *scores = mg_buf(&s->buf, B_IW, (size_t)(m * n_rows + 1), err);
    if (!scores) return -1;
    mg_rope_rows(&s->rope_comp_idx, iq, m, HI * DI, (int)HI, (int)DI, cos_c, sin_c, 0);
    int any = 0;
    for (int64_t t = 0; t < m; t++) any |= (pos + t + 1) / L->ratio > c->topk;
    if (any) {
        index_ctx x = {s->comp->k, iq, iw, &L->icomp, scores, m, pos, L->ratio, n_rows, HI, DI,
                       1.0f / sqrtf((float)DI), 1.0f / sqrtf((float)HI)};
        mg_pool_run(s->comp->pool, index_task, &x);
    }
    for (int64_t t = 0; t < m; t++) {
        int64_t vis = (pos + t + 1) / L->ratio;
        if (vis > n_rows) vis = n_rows;
        int *st = sel + t * c->topk;
        if (vis <= c->topk) {
            for (int64_t r = 0; r < vis; r++) st[r] = (int)r;
            n_sel[t] = (int)vis;
        } else {
            mg_topk(scores + t * n_rows, (int)vis, (int)c->topk, st);
            n_sel[t] = (int)c->topk;
        }
    }
    return 0;
}

/* The RoPE tables of a sub-chunk: main (sliding-window layers) and compressed-layer ones,
 * [m, rope / 2] each, pointing into the window's tables. */
typedef struct rope_rows {
    const float *cos_m, *sin_m, *cos_c, *sin_c;
} rope_rows;

/* Attention sub-block: o[m, d] from the block input h[m, d]. */
static int attention_block(state *s, int li, const float *h, int64_t m, int64_t pos, const rope_rows *rr, float *o,
                           mg_error *err) {
    const dcfg *c = &s->c;
    layer *L = &s->layers[li];
    const mg_compute *comp = s->comp;
    const int64_t D = c->D, HD = c->H * c->D;
    const mg_rope *rope = L->kind == ATTN_SWA ? &s->rope_main : &s->rope_comp;
    const float *cos_t = L->kind == ATTN_SWA ? rr->cos_m : rr->cos_c;
    const float *sin_t = L->kind == ATTN_SWA ? rr->sin_m : rr->sin_c;
    float *qa = mg_buf(&s->buf, B_QA, (size_t)(m * c->q_rank), err);
    float *q = mg_buf(&s->buf, B_Q, (size_t)(m * HD), err);
    float *kv = mg_buf(&s->buf, B_KV, (size_t)(m * D), err);
    float *att = mg_buf(&s->buf, B_ATT, (size_t)(m * HD), err);
    float *grp = mg_buf(&s->buf, B_GRP, (size_t)(m * c->G * c->o_rank), err);
    if (!qa || !q || !kv || !att || !grp) return -1;
    /* Every projection of the block input h (queries' low rank, K=V, compressors, indexer head
     * weights) in ONE pool dispatch, then the two of the normed low-rank query in a second:
     * decode is a chain of small matrices, and each dispatch is a pool hand-off. */
    const int64_t cw = L->kind == ATTN_SWA ? 0 : L->comp.overlap ? 2 * D : D, iwd = 2 * c->DI;
    const int csa = L->kind == ATTN_CSA;
    float *ckv = NULL, *cg = NULL, *ikv = NULL, *ig = NULL, *iq = NULL, *iw = NULL;
    if (cw && (!(ckv = mg_buf(&s->buf, B_CKV, (size_t)(m * cw), err)) ||
               !(cg = mg_buf(&s->buf, B_CGATE, (size_t)(m * cw), err))))
        return -1;
    if (csa && (!(ikv = mg_buf(&s->buf, B_IKV, (size_t)(m * iwd), err)) ||
                !(ig = mg_buf(&s->buf, B_IGATE, (size_t)(m * iwd), err)) ||
                !(iq = mg_buf(&s->buf, B_IQ, (size_t)(m * c->HI * c->DI), err)) ||
                !(iw = mg_buf(&s->buf, B_IWT, (size_t)(m * c->HI), err))))
        return -1;
    {
        const mg_matrix *ws[7] = {&L->wq_a, &L->wkv};
        float *ys[7] = {qa, kv};
        int n = 2;
        if (cw) { ws[n] = &L->comp.wkv; ys[n++] = ckv; ws[n] = &L->comp.wgate; ys[n++] = cg; }
        if (csa) {
            ws[n] = &L->icomp.wkv; ys[n++] = ikv; ws[n] = &L->icomp.wgate; ys[n++] = ig;
            ws[n] = &L->iweights; ys[n++] = iw;
        }
        mg_linear_multi(comp, n, ws, h, m, ys);
    }
    /* queries: low-rank, normed, per-head unweighted norm, RoPE on the last dims */
    mg_rmsnorm_rows(comp->k, qa, qa, L->q_norm, m, c->q_rank, c->q_rank, (float)c->eps);
    {
        const mg_matrix *ws[2] = {&L->wq_b, &L->iwq_b};
        float *ys[2] = {q, iq};
        mg_linear_multi(comp, csa ? 2 : 1, ws, qa, m, ys);
    }
    mg_rmsnorm_rows(comp->k, q, q, NULL, m * c->H, D, D, (float)c->eps);
    mg_rope_rows(rope, q, m, HD, (int)c->H, (int)D, cos_t, sin_t, 0);
    /* the single K=V row of each token */
    mg_rmsnorm_rows(comp->k, kv, kv, L->kv_norm, m, D, D, (float)c->eps);
    mg_rope_rows(rope, kv, m, D, 1, (int)D, cos_t, sin_t, 0);
    dsv4_rows_store(&s->rows, li, pos, m, kv);
    /* compressors see the chunk's tokens before attention: a window closed by token p is visible to p */
    int *sel = NULL, *n_sel = NULL;
    if (cw)
        for (int64_t t = 0; t < m; t++)
            if (dsv4_comp_push(&L->comp, ckv + t * cw, cg + t * cw, pos + t, err)) return -1;
    if (csa) {
        float *sb = mg_buf(&s->buf, B_SEL, (size_t)(m * (c->topk + 1)), err);
        if (!sb) return -1;
        for (int64_t t = 0; t < m; t++)
            if (dsv4_comp_push(&L->icomp, ikv + t * iwd, ig + t * iwd, pos + t, err)) return -1;
        sel = (int *)sb;
        n_sel = sel + m * c->topk;
        if (indexer_select(s, L, iq, iw, m, pos, rr->cos_c, rr->sin_c, sel, n_sel, err))
            return -1;
    }
    /* attention over window + compressed rows, per (token, slice of heads) on the pool: a token's
     * heads are cut into slices so that there are at least as many items as workers (decode uses
     * them all); a head's results do not depend on the slice it is in (core/kernels.h), so neither
     * on the thread count */
    const int64_t max_keys = c->W + (L->kind == ATTN_HCA ? L->comp.n_rows : L->kind == ATTN_CSA ? c->topk : 0) + 1;
    const int nw = mg_pool_threads(comp->pool), H = (int)c->H;
    int per = m >= nw ? 1 : (int)((nw + m - 1) / m);
    if (per > H) per = H;
    const int hpi = (H + per - 1) / per;
    const int64_t need = hpi * max_keys + KV_BLOCK * D;
    if (need > s->attn_scratch_per_worker) { /* score rows, then one block of fp32 rows */
        free(s->attn_scratch);
        s->attn_scratch_per_worker = need * 2;
        s->attn_scratch = malloc(sizeof(float) * (size_t)(s->attn_scratch_per_worker * nw));
        if (!s->attn_scratch) {
            s->attn_scratch_per_worker = 0;
            return mg_fail(err, "out of memory (attention scores)");
        }
    }
    attn_ctx a = {s, L, li, q, att, m, pos, sel, n_sel, s->attn_scratch, s->attn_scratch_per_worker, max_keys,
                  hpi, (H + hpi - 1) / hpi};
    mg_pool_run(comp->pool, attn_task, &a);
    /* values carried their rotation: undo it at the query position */
    mg_rope_rows(rope, att, m, HD, (int)c->H, (int)D, cos_t, sin_t, 1);
    /* grouped output projection: group g's heads -> o_rank values, then wo_b over all groups */
    const int64_t gin = HD / c->G, gout = c->o_rank;
    mg_linear_job jobs[64];
    for (int64_t g0 = 0; g0 < c->G; g0 += 64) {
        int n = 0;
        for (int64_t g = g0; g < c->G && n < 64; g++, n++)
            jobs[n] = (mg_linear_job){&L->wo_a_groups[g], att + g * gin, HD, grp + g * gout, c->G * gout, m};
        mg_linear_jobs(comp, n, jobs);
    }
    mg_linear(comp, &L->wo_b, grp, m, o);
    return 0;
}

/* ---- MoE ----------------------------------------------------------------------------------- */

static float sqrt_softplus(float x) {
    float sp = x > 20.0f ? x : log1pf(expf(x)); /* torch softplus threshold 20 */
    return sqrtf(sp);
}

/* A hash-routed layer's experts for a token: its row of the table (I64 or I32). */
static void hash_route(const layer *L, int32_t token, int64_t K, int *ids) {
    for (int64_t j = 0; j < K; j++) {
        int64_t idx = (int64_t)token * K + j;
        ids[j] = L->tid2eid_i64 ? (int)((const int64_t *)L->tid2eid)[idx] : ((const int32_t *)L->tid2eid)[idx];
    }
}

/* Decode with a store that wants look-ahead hints (experts.h): layer li + 1's routing applied
 * to this layer's MoE input predicts most of what that layer will pick (the residual changes
 * little in one layer; a hash-routed layer's pick is known from the token alone).  Told
 * before this layer's fetch, the store can read those experts while this layer computes.
 * Only the cache changes: what is computed is the same.  scr: E floats, then K ints. */
static void hint_next_layer(state *s, int li, const float *h, int32_t token, float *scr) {
    const dcfg *c = &s->c;
    if (li + 1 >= c->n_layers || !mg_expert_store_wants_hints(s->experts)) return;
    const layer *N = &s->layers[li + 1];
    const int64_t E = c->E, K = c->K;
    int *ids = (int *)(scr + E);
    if (N->tid2eid) {
        hash_route(N, token, K, ids);
    } else {
        mg_linear(s->comp, &N->gate, h, 1, scr);
        for (int64_t e = 0; e < E; e++) scr[e] = sqrt_softplus(scr[e]) + N->gate_bias[e];
        mg_topk(scr, (int)E, (int)K, ids);
    }
    mg_expert_store_hint(s->experts, li + 1, (int)K, ids);
}

/* Decode: the hash-routed layers' experts are known from the token alone (the first
 * n_hash layers), so the store reads the ones it lacks from the start of the step, while the
 * embedding and the first attention run, in layer order (every later layer's are hinted by
 * the layer before it: hint_next_layer).  Only the cache changes. */
static void hint_hash_layers(state *s, int32_t token) {
    if (!mg_expert_store_wants_hints(s->experts)) return;
    mg_error ignored;
    int *ids = (int *)mg_buf(&s->buf, B_RIDS, (size_t)s->c.K, &ignored); /* moe_layer's ids, later */
    for (int li = 0; ids && li < s->c.n_layers && s->layers[li].tid2eid; li++) {
        hash_route(&s->layers[li], token, s->c.K, ids);
        mg_expert_store_hint(s->experts, li, (int)s->c.K, ids);
        mg_expert_store_read_ahead(s->experts, li);
    }
}

/* Routes the m tokens of a sub-chunk from their MoE input h: ids/rw [m, K]; the router's
 * product runs per sub-chunk as a pass per chunk ran it.  Returns the last token's ranked
 * values (sc + bias: E floats; NULL on hash layers, which rank nothing), or NULL + err. */
static int route_rows(state *s, const layer *L, const float *h, const int32_t *tokens, int64_t m, int *ids,
                      float *rw, float **ranked, mg_error *err) {
    const dcfg *c = &s->c;
    const int64_t E = c->E, K = c->K;
    /* the router's logits, the last token's ranked values (E), the look-ahead's scratch (E + K) */
    float *logits = mg_buf(&s->buf, B_RLOG, (size_t)(m * E + 2 * E + K), err);
    if (!logits) return -1;
    float *choice = logits + m * E;
    mg_linear(s->comp, &L->gate, h, m, logits);
    for (int64_t t = 0; t < m; t++) {
        float *sc = logits + t * E;
        for (int64_t e = 0; e < E; e++) sc[e] = sqrt_softplus(sc[e]);
        int *it = ids + t * K;
        if (L->tid2eid) {
            hash_route(L, tokens[t], K, it);
        } else {
            for (int64_t e = 0; e < E; e++) choice[e] = sc[e] + L->gate_bias[e];
            mg_topk(choice, (int)E, (int)K, it);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < K; j++) sum += sc[it[j]];
        for (int64_t j = 0; j < K; j++) rw[t * K + j] = sc[it[j]] / (sum + 1e-20f) * (float)c->rsf;
    }
    *ranked = choice;
    return 0;
}

/* ---- forward ------------------------------------------------------------------------------- */

/* mHC in front of a sub-block of m tokens: hb = norm(collapse(X)) [m, d], and the mix weights
 * the expansion after it needs (post [m, n], comb [m, n, n]). */
static int hc_pre(state *s, const dsv4_hc *hc, const float *norm, const float *X, int64_t m, float *hb, float *post,
                  float *comb, mg_error *err) {
    const int64_t d = s->c.d, n = s->c.n_hc, mix = (2 + n) * n;
    float *xn = mg_buf(&s->buf, B_XN, (size_t)(m * n * d), err);
    float *mx = mg_buf(&s->buf, B_MIX, (size_t)(m * mix), err);
    float *pre = mg_buf(&s->buf, B_PRE, (size_t)(m * n), err);
    float *u = mg_buf(&s->buf, B_U, (size_t)(m * d), err);
    if (!xn || !mx || !pre || !u) return -1;
    dsv4_hc_mixes(s->comp, hc, &s->hcd, X, m, xn, mx);
    dsv4_hc_split(hc, &s->hcd, mx, m, pre, post, comb);
    dsv4_hc_collapse(&s->hcd, X, pre, m, u);
    mg_rmsnorm_rows(s->comp->k, hb, u, norm, m, d, d, (float)s->c.eps);
    return 0;
}

/* mHC after a sub-block: X <- post * o + comb^T X. */
static int hc_post(state *s, float *X, const float *o, const float *post, const float *comb, int64_t m, mg_error *err) {
    float *tmp = mg_buf(&s->buf, B_HCTMP, (size_t)(s->c.n_hc * s->c.d), err);
    if (!tmp) return -1;
    dsv4_hc_expand(&s->hcd, X, o, post, comb, m, tmp);
    return 0;
}

/* The window-wide arrays of one eval window of m tokens (scratch slots sized for m). */
typedef struct win_bufs {
    float *X;                  /* [m, n_hc, d] residual streams */
    float *H, *O, *SH;         /* [m, d]: sub-block inputs, outputs, shared expert outputs */
    float *post, *comb;        /* [m, n_hc], [m, n_hc, n_hc] */
    float *cm, *sm, *cc, *scs; /* [m, rope / 2] RoPE tables (main, compressed) */
    int *ids;                  /* [m, K] */
    float *rw;                 /* [m, K] */
} win_bufs;

static int win_alloc(state *s, int64_t m, win_bufs *w, mg_error *err) {
    const dcfg *c = &s->c;
    const size_t d = (size_t)c->d, n = (size_t)c->n_hc, half = (size_t)(c->rope / 2), M = (size_t)m;
    w->X = mg_buf(&s->buf, B_X, M * n * d, err);
    w->H = mg_buf(&s->buf, B_H, M * d, err);
    w->O = mg_buf(&s->buf, B_O, M * d, err);
    w->post = mg_buf(&s->buf, B_POST, M * n, err);
    w->comb = mg_buf(&s->buf, B_COMB, M * n * n, err);
    w->cm = mg_buf(&s->buf, B_COS, M * half, err);
    w->sm = mg_buf(&s->buf, B_SIN, M * half, err);
    w->cc = mg_buf(&s->buf, B_COSC, M * half, err);
    w->scs = mg_buf(&s->buf, B_SINC, M * half, err);
    return w->X && w->H && w->O && w->post && w->comb && w->cm && w->sm && w->cc && w->scs ? 0 : -1;
}

/* The MoE-phase arrays, in slots the attention phase reuses (allocated after it). */
static int win_alloc_moe(state *s, int64_t m, win_bufs *w, mg_error *err) {
    const dcfg *c = &s->c;
    w->SH = mg_buf(&s->buf, B_SH, (size_t)(m * c->d), err);
    w->rw = mg_buf(&s->buf, B_RW, (size_t)(m * c->K), err);
    float *ri = mg_buf(&s->buf, B_RIDS, (size_t)(m * c->K), err); /* holds ints */
    w->ids = (int *)ri;
    return w->SH && w->rw && ri ? 0 : -1;
}

static rope_rows rope_at(const win_bufs *w, int64_t t0, int64_t half) {
    return (rope_rows){w->cm + t0 * half, w->sm + t0 * half, w->cc + t0 * half, w->scs + t0 * half};
}

/* Layer li's attention sub-block over the window, sub-chunk by sub-chunk in position order. */
static int attn_layer(state *s, int li, const mg_window *win, win_bufs *w, mg_error *err) {
    const layer *L = &s->layers[li];
    const int64_t d = s->c.d, n = s->c.n_hc, half = s->c.rope / 2;
    for (int64_t t0 = 0; t0 < win->m; t0 += win->chunk) {
        const int64_t m = win->m - t0 < win->chunk ? win->m - t0 : win->chunk;
        float *X = w->X + t0 * n * d, *hb = w->H + t0 * d, *o = w->O + t0 * d;
        float *post = w->post + t0 * n, *comb = w->comb + t0 * n * n;
        rope_rows rr = rope_at(w, t0, half);
        /* A cancel between sub-chunks drops the window (eval rewinds the rows and compressor
         * states to the kept positions, as after a cancel between layers). */
        if (t0 > 0 && mg_window_poll(win, li)) return MG_EVAL_CANCELLED;
        if (hc_pre(s, &L->hc_attn, L->attn_norm, X, m, hb, post, comb, err) ||
            attention_block(s, li, hb, m, win->pos + t0, &rr, o, err) || hc_post(s, X, o, post, comb, m, err))
            return -1;
    }
    return 0;
}

/* Layer li's MoE over the window: every sub-chunk's input and routing first, then each routed
 * expert fetched once for the whole window (mg_moe_experts with group = chunk: bitwise a pass
 * per chunk), then the shared expert's sum and the mHC expansion per sub-chunk. */
static int moe_layer(state *s, int li, const mg_window *win, win_bufs *w, mg_error *err) {
    const dcfg *c = &s->c;
    const layer *L = &s->layers[li];
    const int64_t d = c->d, n = c->n_hc, K = c->K, M = win->m;
    if (win_alloc_moe(s, M, w, err)) return -1;
    float *ranked = NULL;
    for (int64_t t0 = 0; t0 < M; t0 += win->chunk) {
        const int64_t m = M - t0 < win->chunk ? M - t0 : win->chunk;
        float *hb = w->H + t0 * d;
        if (hc_pre(s, &L->hc_ffn, L->ffn_norm, w->X + t0 * n * d, m, hb, w->post + t0 * n, w->comb + t0 * n * n,
                   err) ||
            route_rows(s, L, hb, win->tokens + t0, m, w->ids + t0 * K, w->rw + t0 * K, &ranked, err))
            return -1;
    }
    if (M == 1) hint_next_layer(s, li, w->H, win->tokens[0], ranked + c->E);
    memset(w->O, 0, sizeof(float) * (size_t)(M * d));
    mg_moe_args a = {
        .store = s->experts, .layer = li, .n_experts = (int)c->E, .k = (int)K, .x = w->H, .n_tok = M, .d = d,
        .group = win->chunk, .ids = w->ids, .w = w->rw, .limit = (float)c->limit, .out = w->O,
        .shared = &L->shared, .shared_out = w->SH, /* same clamp; rides in the experts' dispatches */
        .scores = L->tid2eid ? NULL : ranked, /* the last token's sc + bias; hash layers rank nothing */
        .poll = win,
    };
    if (mg_window_poll(win, li)) return MG_EVAL_CANCELLED;
    const int rc = mg_moe_experts(s->comp, &a, &s->buf, B_MOE0, err);
    if (rc) return rc; /* -1, or a cancel polled between expert groups */
    for (int64_t i = 0; i < M * d; i++) w->O[i] += w->SH[i];
    for (int64_t t0 = 0; t0 < M; t0 += win->chunk) {
        const int64_t m = M - t0 < win->chunk ? M - t0 : win->chunk;
        if (hc_post(s, w->X + t0 * n * d, w->O + t0 * d, w->post + t0 * n, w->comb + t0 * n * n, m, err)) return -1;
    }
    return 0;
}

/* The head over the rows of sub-chunk [t0, t0 + m) that get logits. */
static int head_rows(state *s, const mg_window *win, const win_bufs *w, int64_t t0, int64_t m, mg_error *err) {
    const dcfg *c = &s->c;
    const int64_t d = c->d, n = c->n_hc;
    int64_t from;
    float *logits = mg_window_head(win, t0, m, &from);
    const int64_t nh = m - from;
    if (!logits || nh <= 0) return 0;
    const float *Xh = w->X + (t0 + from) * n * d;
    float *xn = mg_buf(&s->buf, B_XN, (size_t)(nh * n * d), err);
    float *mx = mg_buf(&s->buf, B_MIX, (size_t)(nh * n), err);
    float *pre = mg_buf(&s->buf, B_PRE, (size_t)(nh * n), err);
    float *y = mg_buf(&s->buf, B_U, (size_t)(nh * d), err);
    if (!xn || !mx || !pre || !y) return -1;
    dsv4_hc_mixes(s->comp, &s->hc_head, &s->hcd, Xh, nh, xn, mx);
    dsv4_hc_head_pre(&s->hc_head, &s->hcd, mx, nh, pre);
    dsv4_hc_collapse(&s->hcd, Xh, pre, nh, y);
    mg_rmsnorm_rows(s->comp->k, y, y, s->final_norm, nh, d, d, (float)c->eps);
    mg_linear(s->comp, &s->head, y, nh, logits);
    return 0;
}

/* One window, layer by layer (mg_window_fn). */
static int eval_window(void *p, const mg_window *win, mg_error *err) {
    state *s = p;
    const dcfg *c = &s->c;
    const int64_t d = c->d, n = c->n_hc, M = win->m;
    if (dsv4_rows_begin(&s->rows, win->pos, M, err)) return -1;
    win_bufs w;
    if (win_alloc(s, M, &w, err)) return -1;
    memmove(s->tokens + win->pos, win->tokens, sizeof(int32_t) * (size_t)M); /* the error-path replay passes s->tokens itself */
    mg_rope_table(&s->rope_main, win->pos, M, w.cm, w.sm);
    mg_rope_table(&s->rope_comp, win->pos, M, w.cc, w.scs);
    for (int64_t t0 = 0; t0 < M; t0 += win->chunk) {
        const int64_t m = M - t0 < win->chunk ? M - t0 : win->chunk;
        float *e = mg_buf(&s->buf, B_U, (size_t)(m * d), err);
        if (!e) return -1;
        mg_embed_rows(&s->embed, win->tokens + t0, m, e);
        for (int64_t t = 0; t < m; t++)
            for (int64_t j = 0; j < n; j++) memcpy(w.X + ((t0 + t) * n + j) * d, e + t * d, sizeof(float) * (size_t)d);
    }
    if (M == 1) hint_hash_layers(s, win->tokens[0]);
    for (int li = 0; li < c->n_layers; li++) {
        int rc = attn_layer(s, li, win, &w, err);
        if (!rc) rc = moe_layer(s, li, win, &w, err);
        if (!rc) rc = mg_window_layer_done(win, li);
        if (rc) return rc; /* -1, MG_EVAL_CANCELLED (polled inside the layer) or a cancel after it */
    }
    for (int64_t t0 = 0; t0 < M; t0 += win->chunk)
        if (head_rows(s, win, &w, t0, M - t0 < win->chunk ? M - t0 : win->chunk, err)) return -1;
    return 0;
}

static int eval_range(state *s, const int32_t *tokens, int64_t n, int64_t pos, int last_only, float *logits,
                      const mg_eval_hook *hook, int64_t *done, mg_error *err) {
    mg_window call = {tokens, n, pos, 0, n, CHUNK, last_only, logits, s->c.vocab, hook, (int)s->c.n_layers};
    int64_t ignored;
    return mg_eval_windows(s, eval_window, &call, s->window, done ? done : &ignored, err);
}

static void rewind_to(state *s, int64_t t0) {
    for (int64_t i = 0; i < s->c.n_layers; i++) {
        layer *L = &s->layers[i];
        if (L->kind != ATTN_SWA) dsv4_comp_rewind(&L->comp, t0);
        if (L->kind == ATTN_CSA) dsv4_comp_rewind(&L->icomp, t0);
    }
}

static int truncate_state(void *p, int64_t n, mg_error *err);

static int eval(void *p, const int32_t *tokens, int64_t n, int64_t pos, int last_only, float *logits,
                const mg_eval_hook *hook, int64_t *done, mg_error *err) {
    state *s = p;
    int rc = eval_range(s, tokens, n, pos, last_only, logits, hook, done, err);
    if (rc == 0) return 0;
    /* keep the slot usable: positions past the windows a cancel left complete never happened */
    if (rc == MG_EVAL_CANCELLED && truncate_state(s, pos + *done, err) == 0) return rc;
    mg_error ignored;
    truncate_state(s, pos, &ignored);
    return -1;
}

static int truncate_state(void *p, int64_t n, mg_error *err) {
    state *s = p;
    const int64_t t0 = dsv4_rows_rewind(&s->rows, n); /* a multiple of snap_every */
    rewind_to(s, t0);
    if (n == t0) return 0;
    /* replay [t0, n): the ids are still in s->tokens (copied, as the replay rewrites them) */
    int32_t local[256];
    int32_t *ids = n - t0 <= 256 ? local : malloc(sizeof(int32_t) * (size_t)(n - t0));
    if (!ids) return mg_fail(err, "out of memory (truncate replay)");
    memcpy(ids, s->tokens + t0, sizeof(int32_t) * (size_t)(n - t0));
    int rc = eval_range(s, ids, n - t0, t0, 0, NULL, NULL, NULL, err);
    if (ids != local) free(ids);
    return rc;
}

static void info(const void *p, mg_arch_info *out) {
    const state *s = p;
    memset(out, 0, sizeof *out);
    out->vocab = s->c.vocab;
    out->n_layers = (int)s->c.n_layers;
    out->n_experts = (int)s->c.E;
    out->n_experts_per_tok = (int)s->c.K;
    out->weights = s->census;
    out->experts = s->experts;
    out->kv_type = (int)s->kv_type;
    out->kv_bytes_per_token = slot_bytes_per_token(s);
    out->kv_fixed_bytes = ring_bytes(s);
    out->prefill_window = s->window;
    out->prefill_bytes_per_token = s->window_bytes_per_token;
}

/* Positions [0, n) left: the token ids (truncate replays the tail from them), each
 * compressor's rows and snapshots, and the window rows' snapshots and tail (dsv4_rows.h).  The
 * compressors' open windows and carries are not reported: truncate(n) after a restore rewinds to
 * the tail's replay point and replays. */
static int prefix_regions(void *p, int64_t n, int reserve, mg_region_fn fn, void *ctx, mg_error *err) {
    state *s = p;
    int rc = fn(ctx, s->tokens, (uint64_t)n * sizeof(int32_t));
    if (rc) return rc;
    /* the rows first: their tail fixes the replay point whose carries the compressors send */
    if ((rc = dsv4_rows_regions(&s->rows, n, reserve, fn, ctx, err))) return rc;
    const int64_t at = s->rows.tail_at;
    for (int64_t i = 0; i < s->c.n_layers; i++) {
        layer *L = &s->layers[i];
        if (L->kind != ATTN_SWA && (rc = dsv4_comp_regions(&L->comp, n, at, reserve, fn, ctx, err))) return rc;
        if (L->kind == ATTN_CSA && (rc = dsv4_comp_regions(&L->icomp, n, at, reserve, fn, ctx, err))) return rc;
    }
    return 0;
}

const mg_arch mg_arch_deepseek_v4 = {"deepseek_v4", load, eval, truncate_state, state_free, info, prefix_regions};
