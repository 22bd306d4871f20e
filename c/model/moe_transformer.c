/* qwen3_moe and glm4_moe: pre-norm decoder stacks with GQA attention (optional q/k/v bias,
 * optional per-head q/k RMSNorm before RoPE, partial neox RoPE), dense SwiGLU or MoE MLPs.
 * The differences are flags of the normalised config (python/gateway/model_config/hf_moe.py):
 *   router "softmax" (qwen) | "sigmoid" (glm: correction bias, groups, scaling factor),
 *   n_shared_experts, attention_bias / o_proj_bias, use_qk_norm, layer_is_moe[]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/arch.h"
#include "model/blocks.h"

#define CHUNK 256 /* prefill sub-chunk of the dense work: bounds its scratch (the window is a multiple) */

enum { /* scratch slots; B_X .. B_SIN, B_MOE_OUT, B_RW, B_RIDS and B_W* hold a whole prefill window */
    B_X, B_H, B_Q, B_K, B_V, B_ATT, B_O, B_COS, B_SIN, B_SCORES, B_MLP, B_MOE_OUT, B_RLOGITS,
    B_RW, B_RIDS, B_RSCR, B_WH, B_WSH, B_MOE0 /* .. B_MOE0 + 3: mg_moe_experts */
};

typedef struct layer {
    float *attn_norm, *ffn_norm;
    mg_matrix wq, wk, wv, wo;
    float *bq, *bk, *bv, *bo;
    float *q_norm, *k_norm;
    int is_moe;
    mg_mlp dense;       /* dense layers */
    mg_matrix router;   /* [E, d] */
    float *score_bias;  /* [E] (glm) */
    int has_shared;
    mg_mlp shared;
} layer;

typedef struct cfg {
    int router_sigmoid;
    int64_t vocab, d, n_layers, n_heads, n_kv, head_dim, rot_dim, f_dense, f_moe;
    int64_t n_experts, top_k, n_shared, n_group, topk_group;
    int norm_topk, qkv_bias, o_bias, qk_norm, tied;
    double theta, eps, scaling;
} cfg;

typedef struct state {
    cfg c;
    const mg_compute *comp;
    layer *layers;
    mg_matrix embed, head;
    float *final_norm;
    mg_rope rope;
    mg_kv_cache kv;
    mg_expert_store *experts;
    mg_buffers buf;
    mg_weight_census census;
    int64_t window;     /* prefill tokens evaluated layer by layer at once */
} state;

static int read_cfg(const mg_json *j, cfg *c, int64_t **is_moe, mg_error *err) {
    memset(c, 0, sizeof *c);
    int64_t n_moe_flags = 0;
    const mg_json *router = mg_json_get(j, "router");
    if (!router || mg_json_type_of(router) != MG_JSON_STRING)
        return mg_fail(err, "normalised config: missing string field 'router'");
    if (strcmp(mg_json_string(router), "sigmoid") == 0) c->router_sigmoid = 1;
    else if (strcmp(mg_json_string(router), "softmax") != 0)
        return mg_fail(err, "normalised config: unknown router '%s'", mg_json_string(router));
    if (mg_config_int(j, "vocab_size", &c->vocab, err) || mg_config_int(j, "hidden_size", &c->d, err) ||
        mg_config_int(j, "num_hidden_layers", &c->n_layers, err) ||
        mg_config_int(j, "num_attention_heads", &c->n_heads, err) ||
        mg_config_int(j, "num_key_value_heads", &c->n_kv, err) || mg_config_int(j, "head_dim", &c->head_dim, err) ||
        mg_config_int(j, "rotary_dim", &c->rot_dim, err) ||
        mg_config_int(j, "intermediate_size", &c->f_dense, err) ||
        mg_config_int(j, "moe_intermediate_size", &c->f_moe, err) ||
        mg_config_int(j, "n_routed_experts", &c->n_experts, err) ||
        mg_config_int(j, "num_experts_per_tok", &c->top_k, err) ||
        mg_config_int(j, "n_shared_experts", &c->n_shared, err) || mg_config_int(j, "n_group", &c->n_group, err) ||
        mg_config_int(j, "topk_group", &c->topk_group, err) || mg_config_bool(j, "norm_topk_prob", &c->norm_topk, err) ||
        mg_config_bool(j, "attention_bias", &c->qkv_bias, err) || mg_config_bool(j, "o_proj_bias", &c->o_bias, err) ||
        mg_config_bool(j, "use_qk_norm", &c->qk_norm, err) ||
        mg_config_bool(j, "tie_word_embeddings", &c->tied, err) || mg_config_num(j, "rope_theta", &c->theta, err) ||
        mg_config_num(j, "rms_norm_eps", &c->eps, err) ||
        mg_config_num(j, "routed_scaling_factor", &c->scaling, err) ||
        mg_config_int_array(j, "layer_is_moe", is_moe, &n_moe_flags, err))
        return -1;
    if (c->vocab <= 0 || c->d <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv <= 0 || c->head_dim <= 0 ||
        c->n_heads % c->n_kv || c->rot_dim < 0 || c->rot_dim > c->head_dim || c->rot_dim % 2)
        return mg_fail(err, "normalised config: inconsistent attention sizes");
    if (n_moe_flags != c->n_layers)
        return mg_fail(err, "normalised config: layer_is_moe has %lld entries for %lld layers",
                       (long long)n_moe_flags, (long long)c->n_layers);
    for (int64_t i = 0; i < c->n_layers; i++)
        if ((*is_moe)[i] &&
            (c->n_experts <= 0 || c->top_k <= 0 || c->top_k > c->n_experts || c->n_group <= 0 ||
             c->n_experts % c->n_group || c->topk_group <= 0 || c->topk_group > c->n_group))
            return mg_fail(err, "normalised config: inconsistent expert counts");
    return 0;
}

static void state_free(void *p) {
    state *s = p;
    if (!s) return;
    if (s->layers) {
        for (int64_t i = 0; i < s->c.n_layers; i++) {
            layer *L = &s->layers[i];
            free(L->attn_norm); free(L->ffn_norm); free(L->bq); free(L->bk); free(L->bv); free(L->bo);
            free(L->q_norm); free(L->k_norm); free(L->score_bias);
        }
        free(s->layers);
    }
    free(s->final_norm);
    mg_rope_free(&s->rope);
    mg_kv_free(&s->kv);
    mg_expert_store_free(s->experts);
    mg_buffers_free(&s->buf);
    free(s);
}

static int load_layer(state *s, const mg_checkpoint *ck, int i, int is_moe, mg_error *err) {
    const cfg *c = &s->c;
    layer *L = &s->layers[i];
    mg_weight_census *cs = &s->census;
    const int64_t d = c->d, qd = c->n_heads * c->head_dim, kvd = c->n_kv * c->head_dim;
    const char *p = "model.layers";
    if (!(L->attn_norm = mg_bind_vectorf(ck, d, err, "%s.%d.input_layernorm.weight", p, i))) return -1;
    if (!(L->ffn_norm = mg_bind_vectorf(ck, d, err, "%s.%d.post_attention_layernorm.weight", p, i))) return -1;
    if (mg_bind_matrixf(ck, cs, qd, d, &L->wq, err, "%s.%d.self_attn.q_proj.weight", p, i) ||
        mg_bind_matrixf(ck, cs, kvd, d, &L->wk, err, "%s.%d.self_attn.k_proj.weight", p, i) ||
        mg_bind_matrixf(ck, cs, kvd, d, &L->wv, err, "%s.%d.self_attn.v_proj.weight", p, i) ||
        mg_bind_matrixf(ck, cs, d, qd, &L->wo, err, "%s.%d.self_attn.o_proj.weight", p, i))
        return -1;
    if (c->qkv_bias) {
        if (!(L->bq = mg_bind_vectorf(ck, qd, err, "%s.%d.self_attn.q_proj.bias", p, i)) ||
            !(L->bk = mg_bind_vectorf(ck, kvd, err, "%s.%d.self_attn.k_proj.bias", p, i)) ||
            !(L->bv = mg_bind_vectorf(ck, kvd, err, "%s.%d.self_attn.v_proj.bias", p, i)))
            return -1;
    }
    if (c->o_bias && !(L->bo = mg_bind_vectorf(ck, d, err, "%s.%d.self_attn.o_proj.bias", p, i))) return -1;
    if (c->qk_norm) {
        if (!(L->q_norm = mg_bind_vectorf(ck, c->head_dim, err, "%s.%d.self_attn.q_norm.weight", p, i)) ||
            !(L->k_norm = mg_bind_vectorf(ck, c->head_dim, err, "%s.%d.self_attn.k_norm.weight", p, i)))
            return -1;
    }
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s.%d.mlp", p, i);
    L->is_moe = is_moe;
    if (!is_moe) return mg_mlp_bind(ck, cs, prefix, d, c->f_dense, &L->dense, err);
    if (mg_bind_matrixf(ck, cs, c->n_experts, d, &L->router, err, "%s.gate.weight", prefix)) return -1;
    if (c->router_sigmoid &&
        !(L->score_bias = mg_bind_vectorf(ck, c->n_experts, err, "%s.gate.e_score_correction_bias", prefix)))
        return -1;
    for (int e = 0; e < c->n_experts; e++) {
        mg_expert x;
        if (mg_bind_matrixf(ck, cs, c->f_moe, d, &x.gate, err, "%s.experts.%d.gate_proj.weight", prefix, e) ||
            mg_bind_matrixf(ck, cs, c->f_moe, d, &x.up, err, "%s.experts.%d.up_proj.weight", prefix, e) ||
            mg_bind_matrixf(ck, cs, d, c->f_moe, &x.down, err, "%s.experts.%d.down_proj.weight", prefix, e))
            return -1;
        mg_expert_store_set(s->experts, i, e, &x);
    }
    if (c->n_shared > 0) {
        char sp[160];
        snprintf(sp, sizeof sp, "%s.shared_experts", prefix);
        L->has_shared = 1;
        if (mg_mlp_bind(ck, cs, sp, d, c->f_moe * c->n_shared, &L->shared, err)) return -1;
    }
    return 0;
}

/* What one position of context costs: K and V rows of every layer in the cache's type. */
static uint64_t kv_bytes_per_token(const cfg *c, mg_kv_type t) {
    const int64_t kvd = c->n_kv * c->head_dim;
    return mg_kv_bytes_per_pos((int)c->n_layers, kvd, kvd, t);
}

/* What the process holds besides the weights: the KV cache at max_ctx in its stored type (a
 * budgeted load reserves exactly that, so growth never copies) and the scratch of a full
 * prefill chunk (for the expert-cache budget). */
static uint64_t other_bytes(const cfg *c, const mg_arch_env *env) {
    const uint64_t qd = (uint64_t)(c->n_heads * c->head_dim), kvd = (uint64_t)(c->n_kv * c->head_dim);
    uint64_t kv = (uint64_t)env->max_ctx * kv_bytes_per_token(c, (mg_kv_type)env->kv_type);
    uint64_t fw = (uint64_t)(c->f_dense > c->f_moe * c->n_shared ? c->f_dense : c->f_moe * c->n_shared);
    uint64_t per_tok = 6 * (uint64_t)c->d + 2 * qd + 2 * kvd + 2 * fw + (uint64_t)c->n_experts +
                       (uint64_t)c->top_k * (2 * (uint64_t)c->d + 2 * (uint64_t)c->f_moe + 2);
    /* attention scores: a row of max_ctx per query head of a worker's slice of a kv group (and
     * a block of converted rows for bf16) */
    uint64_t hpg = (uint64_t)(c->n_heads / c->n_kv);
    uint64_t scores = (uint64_t)mg_pool_threads(env->compute->pool) *
                      (hpg * (uint64_t)env->max_ctx + 32 * (uint64_t)c->head_dim);
    return kv + (CHUNK * per_tok + scores) * sizeof(float);
}

/* Bytes per token of a prefill window: the residual stream, rope tables, the MoE input,
 * output, shared output and routing of every token, and mg_moe_experts' rows. */
static uint64_t window_bytes_per_token(const cfg *c) {
    const uint64_t d = (uint64_t)c->d, half = (uint64_t)c->rot_dim / 2;
    uint64_t own = 4 * d + 2 * (half + 1) + 2 * (uint64_t)c->top_k;
    return sizeof(float) * (own + mg_moe_floats_per_token(c->d, c->top_k, c->f_moe, c->f_moe * c->n_shared));
}

static void *load(const mg_arch_env *env, mg_error *err) {
    state *s = calloc(1, sizeof *s);
    int64_t *is_moe = NULL;
    if (!s) {
        mg_fail(err, "out of memory");
        return NULL;
    }
    s->comp = env->compute;
    if (read_cfg(env->config, &s->c, &is_moe, err)) goto fail;
    const cfg *c = &s->c;
    const mg_checkpoint *ck = env->ck;
    if (!(s->layers = calloc((size_t)c->n_layers, sizeof(layer)))) {
        mg_fail(err, "out of memory");
        goto fail;
    }
    if (!(s->experts = mg_expert_store_create((int)c->n_layers, c->n_experts > 0 ? (int)c->n_experts : 1, err)))
        goto fail;
    if (mg_bind_matrixf(ck, &s->census, c->vocab, c->d, &s->embed, err, "model.embed_tokens.weight")) goto fail;
    for (int i = 0; i < c->n_layers; i++)
        if (load_layer(s, ck, i, (int)is_moe[i], err)) goto fail;
    if (!(s->final_norm = mg_bind_vectorf(ck, c->d, err, "model.norm.weight"))) goto fail;
    if (c->tied && !mg_has_tensorf(ck, "lm_head.weight")) s->head = s->embed;
    else if (mg_bind_matrixf(ck, &s->census, c->vocab, c->d, &s->head, err, "lm_head.weight")) goto fail;
    if (mg_rope_init(&s->rope, (int)c->rot_dim, 0, c->theta, 0, err)) goto fail;
    if (mg_kv_init(&s->kv, (int)c->n_layers, c->n_kv * c->head_dim, c->n_kv * c->head_dim, env->max_ctx,
                   (mg_kv_type)env->kv_type, err))
        goto fail;
    /* A budget counts the cache at max_ctx: reserve it now (untouched pages cost nothing until
     * written), so growing never holds an old and a new copy at once. */
    if (env->ram_gb > 0 && mg_kv_reserve(&s->kv, env->max_ctx, err)) goto fail;
    const mg_prefill_cost pc = {CHUNK, window_bytes_per_token(c),
                                sizeof(float) * mg_moe_fixed_floats(c->d, c->top_k, c->f_moe, CHUNK)};
    if (mg_expert_store_apply_budget(env, s->experts, &s->census, other_bytes(c, env), &pc, &s->window, err))
        goto fail;
    free(is_moe);
    return s;
fail:
    free(is_moe);
    state_free(s);
    return NULL;
}

/* Attention sub-block for m tokens at positions pos..pos+m-1: x += o_proj(attn(norm(x))). */
static int attention_block(state *s, int li, float *x, int64_t m, int64_t pos, const float *cos_t,
                           const float *sin_t, mg_error *err) {
    const cfg *c = &s->c;
    const layer *L = &s->layers[li];
    const mg_compute *comp = s->comp;
    const int64_t d = c->d, Dh = c->head_dim, qd = c->n_heads * Dh, kvd = c->n_kv * Dh;
    float *h = mg_buf(&s->buf, B_H, (size_t)(m * d), err);
    float *q = mg_buf(&s->buf, B_Q, (size_t)(m * qd), err);
    float *k = mg_buf(&s->buf, B_K, (size_t)(m * kvd), err);
    float *v = mg_buf(&s->buf, B_V, (size_t)(m * kvd), err);
    float *att = mg_buf(&s->buf, B_ATT, (size_t)(m * qd), err);
    float *o = mg_buf(&s->buf, B_O, (size_t)(m * d), err);
    if (!h || !q || !k || !v || !att || !o) return -1;
    mg_rmsnorm_rows(comp->k, h, x, L->attn_norm, m, d, d, (float)c->eps);
    const mg_matrix *ws[3] = {&L->wq, &L->wk, &L->wv};
    float *ys[3] = {q, k, v};
    mg_linear_multi(comp, 3, ws, h, m, ys);
    if (L->bq) {
        mg_add_bias_rows(q, L->bq, m, qd, qd);
        mg_add_bias_rows(k, L->bk, m, kvd, kvd);
        mg_add_bias_rows(v, L->bv, m, kvd, kvd);
    }
    if (L->q_norm) {
        mg_rmsnorm_rows(comp->k, q, q, L->q_norm, m * c->n_heads, Dh, Dh, (float)c->eps);
        mg_rmsnorm_rows(comp->k, k, k, L->k_norm, m * c->n_kv, Dh, Dh, (float)c->eps);
    }
    mg_rope_rows(&s->rope, q, m, qd, (int)c->n_heads, (int)Dh, cos_t, sin_t, 0);
    mg_rope_rows(&s->rope, k, m, kvd, (int)c->n_kv, (int)Dh, cos_t, sin_t, 0);
    mg_kv_store(&s->kv, li, pos, m, k, v);
    mg_attn_args a = {
        .q = q, .q_stride = qd, .k = s->kv.k[li], .k_stride = kvd, .v = s->kv.v[li], .v_stride = kvd,
        .out = att, .out_stride = qd, .n_tok = m, .pos0 = pos, .window = 0,
        .n_heads = (int)c->n_heads, .n_kv = (int)c->n_kv, .qk_dim = (int)Dh, .v_dim = (int)Dh,
        .scale = 1.0f / sqrtf((float)Dh), .sinks = NULL, .kv_type = s->kv.type,
    };
    float *scores = mg_buf(&s->buf, B_SCORES, mg_attention_scratch(comp, &a), err);
    if (!scores) return -1;
    mg_attention(comp, &a, scores);
    mg_linear(comp, &L->wo, att, m, o);
    if (L->bo) mg_add_bias_rows(o, L->bo, m, d, d);
    for (int64_t i = 0; i < m * d; i++) x[i] += o[i];
    return 0;
}

/* Decode with a store that wants look-ahead hints (experts.h: reading ahead, or tracing): the
 * next layer's router applied to this layer's MoE input predicts most of what that layer will
 * pick (the residual changes little in one layer), so the store is told before this layer's
 * fetch and can read those experts while this layer computes.  Only the cache changes: what is
 * computed is the same.  Scratch as in moe_block. */
static void hint_next_layer(state *s, int li, const float *h, float *rscr) {
    const cfg *c = &s->c;
    if (li + 1 >= c->n_layers || !s->layers[li + 1].is_moe || !mg_expert_store_wants_hints(s->experts)) return;
    const layer *N = &s->layers[li + 1];
    const int64_t E = c->n_experts, K = c->top_k;
    float *logits = rscr + 3 * E + c->n_group, *w = logits + E;
    int *ids = (int *)(w + K);
    mg_linear(s->comp, &N->router, h, 1, logits);
    if (c->router_sigmoid)
        mg_route_sigmoid_grouped(logits, N->score_bias, (int)E, (int)c->n_group, (int)c->topk_group, (int)K,
                                 c->norm_topk, (float)c->scaling, ids, w, rscr);
    else
        mg_route_softmax_topk(logits, (int)E, (int)K, c->norm_topk, ids, w);
    mg_expert_store_hint(s->experts, li + 1, (int)K, ids);
}

/* Dense MLP sub-block of m tokens: x += mlp(norm(x)). */
static int dense_block(state *s, const layer *L, float *x, int64_t m, mg_error *err) {
    const cfg *c = &s->c;
    const int64_t d = c->d;
    float *h = mg_buf(&s->buf, B_H, (size_t)(m * d), err);
    float *out = mg_buf(&s->buf, B_MOE_OUT, (size_t)(m * d), err);
    float *tmp = mg_buf(&s->buf, B_MLP, (size_t)(2 * m * c->f_dense), err);
    if (!h || !out || !tmp) return -1;
    mg_rmsnorm_rows(s->comp->k, h, x, L->ffn_norm, m, d, d, (float)c->eps);
    mg_mlp_forward(s->comp, &L->dense, h, m, out, tmp, 0.0f);
    for (int64_t i = 0; i < m * d; i++) x[i] += out[i];
    return 0;
}

/* Routes the m tokens of a sub-chunk from their MoE input h (the router's product per
 * sub-chunk, as a pass per chunk ran it): ids/rw [m, K].  rscr: moe_block's router scratch;
 * it ends with the last token's sigmoids (sigmoid router).  logits: [m, E], left in place. */
static void route_rows(state *s, const layer *L, const float *h, int64_t m, float *logits, int *ids, float *rw,
                       float *rscr) {
    const cfg *c = &s->c;
    const int64_t E = c->n_experts, K = c->top_k;
    mg_linear(s->comp, &L->router, h, m, logits);
    for (int64_t t = 0; t < m; t++) {
        if (c->router_sigmoid)
            mg_route_sigmoid_grouped(logits + t * E, L->score_bias, (int)E, (int)c->n_group, (int)c->topk_group,
                                     (int)K, c->norm_topk, (float)c->scaling, ids + t * K, rw + t * K, rscr);
        else
            mg_route_softmax_topk(logits + t * E, (int)E, (int)K, c->norm_topk, ids + t * K, rw + t * K);
    }
}

/* What top-k ranked for the window's last token, for the store when it wants them (tracing):
 * the logits (softmax is monotonic), or sigmoid + bias (the scratch still holds the last
 * token's sigmoids; before any group masking, so a dropped group's experts keep their rank). */
static const float *last_ranked(state *s, const layer *L, const float *last_logits, float *rscr) {
    const cfg *c = &s->c;
    const int64_t E = c->n_experts;
    if (!mg_expert_store_wants_scores(s->experts)) return NULL;
    if (!c->router_sigmoid) return last_logits;
    float *v = rscr + 2 * E + c->n_group;
    for (int64_t e = 0; e < E; e++) v[e] = rscr[e] + (L->score_bias ? L->score_bias[e] : 0.0f);
    return v;
}

/* MoE sub-block over the window's M tokens: x += moe(norm(x)) (+ shared expert).  Every
 * sub-chunk is normed and routed first, then each routed expert is fetched once for the whole
 * window (mg_moe_experts with group = chunk: bitwise a pass per chunk). */
static int moe_block(state *s, int li, const mg_window *win, float *x, int64_t M, int64_t chunk, mg_error *err) {
    const cfg *c = &s->c;
    const layer *L = &s->layers[li];
    const int64_t d = c->d, E = c->n_experts, K = c->top_k;
    float *h = mg_buf(&s->buf, B_WH, (size_t)(M * d), err);
    float *out = mg_buf(&s->buf, B_MOE_OUT, (size_t)(M * d), err);
    float *logits = mg_buf(&s->buf, B_RLOGITS, (size_t)((M < chunk ? M : chunk) * E), err);
    float *rw = mg_buf(&s->buf, B_RW, (size_t)(M * K), err);
    float *rids = mg_buf(&s->buf, B_RIDS, (size_t)(M * K), err); /* holds ints */
    /* rscr: the router's scratch (2E + n_group), then the last token's ranked values (E), then
     * the look-ahead hint's logits (E), ids and weights (K each) */
    float *rscr = mg_buf(&s->buf, B_RSCR, (size_t)(4 * E + c->n_group + 2 * K), err);
    float *sh = L->has_shared ? mg_buf(&s->buf, B_WSH, (size_t)(M * d), err) : NULL;
    if (!h || !out || !logits || !rw || !rids || !rscr || (L->has_shared && !sh)) return -1;
    int *ids = (int *)rids;
    int64_t last = 0;
    for (int64_t t0 = 0; t0 < M; t0 += chunk) {
        const int64_t m = M - t0 < chunk ? M - t0 : chunk;
        mg_rmsnorm_rows(s->comp->k, h + t0 * d, x + t0 * d, L->ffn_norm, m, d, d, (float)c->eps);
        route_rows(s, L, h + t0 * d, m, logits, ids + t0 * K, rw + t0 * K, rscr);
        last = m - 1;
    }
    const float *ranked = last_ranked(s, L, logits + last * E, rscr);
    if (M == 1) hint_next_layer(s, li, h, rscr);
    memset(out, 0, sizeof(float) * (size_t)(M * d));
    /* the shared expert runs inside the routed experts' two dispatches */
    mg_moe_args a = {
        .store = s->experts, .layer = li, .n_experts = (int)E, .k = (int)K, .x = h, .n_tok = M, .d = d,
        .group = chunk, .ids = ids, .w = rw, .limit = 0.0f, .out = out,
        .shared = L->has_shared ? &L->shared : NULL, .shared_out = sh, .scores = ranked, .poll = win,
    };
    const int rc = mg_moe_experts(s->comp, &a, &s->buf, B_MOE0, err);
    if (rc) return rc; /* -1, or a cancel polled between expert groups */
    if (sh)
        for (int64_t i = 0; i < M * d; i++) out[i] += sh[i];
    for (int64_t i = 0; i < M * d; i++) x[i] += out[i];
    return 0;
}

/* One window, layer by layer (mg_window_fn): attention and dense MLPs per sub-chunk in
 * position order, MoE over the whole window. */
static int eval_window(void *p, const mg_window *win, mg_error *err) {
    state *s = p;
    const cfg *c = &s->c;
    const int64_t d = c->d, M = win->m, ch = win->chunk, half = s->rope.half + 1;
    if (mg_kv_reserve(&s->kv, win->pos + M, err)) return -1;
    float *x = mg_buf(&s->buf, B_X, (size_t)(M * d), err);
    float *cos_t = mg_buf(&s->buf, B_COS, (size_t)(M * half), err);
    float *sin_t = mg_buf(&s->buf, B_SIN, (size_t)(M * half), err);
    if (!x || !cos_t || !sin_t) return -1;
    mg_embed_rows(&s->embed, win->tokens, M, x);
    mg_rope_table(&s->rope, win->pos, M, cos_t, sin_t);
    for (int li = 0; li < c->n_layers; li++) {
        const layer *L = &s->layers[li];
        for (int64_t t0 = 0; t0 < M; t0 += ch) {
            const int64_t m = M - t0 < ch ? M - t0 : ch;
            float *xs = x + t0 * d;
            /* A cancel between sub-chunks drops the window: what layer li wrote of it (KV rows
             * past the kept positions) is dead, as after a cancel between layers. */
            if (t0 > 0 && mg_window_poll(win, li)) return MG_EVAL_CANCELLED;
            if (attention_block(s, li, xs, m, win->pos + t0, cos_t + t0 * s->rope.half, sin_t + t0 * s->rope.half,
                                err) ||
                (!L->is_moe && dense_block(s, L, xs, m, err)))
                return -1;
        }
        if (L->is_moe) {
            if (mg_window_poll(win, li)) return MG_EVAL_CANCELLED;
            int rc = moe_block(s, li, win, x, M, ch, err);
            if (rc) return rc;
        }
        int rc = mg_window_layer_done(win, li);
        if (rc) return rc;
    }
    /* Final norm + head per sub-chunk, only for the rows a pass per chunk computed. */
    for (int64_t t0 = 0; t0 < M; t0 += ch) {
        const int64_t m = M - t0 < ch ? M - t0 : ch;
        int64_t from;
        float *logits = mg_window_head(win, t0, m, &from);
        if (!logits || m - from <= 0) continue;
        float *xs = x + (t0 + from) * d;
        mg_rmsnorm_rows(s->comp->k, xs, xs, s->final_norm, m - from, d, d, (float)c->eps);
        mg_linear(s->comp, &s->head, xs, m - from, logits);
    }
    return 0;
}

/* The KV rows past the kept positions are dead (overwritten later): an error or a cancel
 * needs no repair. */
static int eval(void *p, const int32_t *tokens, int64_t n, int64_t pos, int last_only, float *logits,
                const mg_eval_hook *hook, int64_t *done, mg_error *err) {
    state *s = p;
    mg_window call = {tokens, n, pos, 0, n, CHUNK, last_only, logits, s->c.vocab, hook, (int)s->c.n_layers};
    return mg_eval_windows(s, eval_window, &call, s->window, done, err);
}

static int truncate_state(void *p, int64_t n, mg_error *err) {
    (void)p; (void)n; (void)err; /* the KV rows >= n are simply overwritten later */
    return 0;
}

static void info(const void *p, mg_arch_info *out) {
    const state *s = p;
    memset(out, 0, sizeof *out);
    out->vocab = s->c.vocab;
    out->n_layers = (int)s->c.n_layers;
    out->n_experts = (int)s->c.n_experts;
    out->n_experts_per_tok = (int)s->c.top_k;
    out->weights = s->census;
    out->experts = s->experts;
    out->kv_type = (int)s->kv.type;
    out->kv_bytes_per_token = kv_bytes_per_token(&s->c, s->kv.type);
    out->prefill_window = s->window;
    out->prefill_bytes_per_token = window_bytes_per_token(&s->c);
}

/* The KV rows are the whole per-position state. */
static int prefix_regions(void *p, int64_t n, int reserve, mg_region_fn fn, void *ctx, mg_error *err) {
    state *s = p;
    return mg_kv_regions(&s->kv, n, reserve, fn, ctx, err);
}

const mg_arch mg_arch_qwen3_moe = {"qwen3_moe", load, eval, truncate_state, state_free, info, prefix_regions};
const mg_arch mg_arch_glm4_moe = {"glm4_moe", load, eval, truncate_state, state_free, info, prefix_regions};
