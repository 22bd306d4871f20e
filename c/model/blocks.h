/* Shared building blocks of the decoder forward passes.
 *
 * Used by moe_transformer.c (qwen3_moe, glm4_moe) and meant to be reused by deepseek_v4.c.
 * Conventions everywhere in this file:
 *   - activations are fp32, row-major, one row per token: x[t * stride + i];
 *   - weights are mg_matrix in their stored format ([rows = outputs, cols = inputs]);
 *   - "n_tok" tokens are processed together (prefill chunk, or 1 for decode);
 *   - every threaded helper takes the model's mg_compute (pool + kernel table);
 *   - nothing here keeps global state; failures return -1 with err set.
 *
 * Sections:
 *   1. Scratch buffers          mg_buffers: named, grow-on-demand fp32 slots
 *   2. Binding helpers          printf-style tensor names, census of formats per matrix
 *   3. Norms and embeddings     RMSNorm over rows (also per head), embedding row lookup
 *   4. RoPE                     inv_freq once, cos/sin table per chunk, apply to q/k heads
 *   5. KV cache                 per-layer [positions, row] fp32 or bf16 arrays
 *   6. Attention                causal GQA over cache, optional window and per-head sinks
 *   7. Batched linear jobs      many (matrix, input rows) pairs in ONE pool dispatch
 *   8. Dense SwiGLU MLP         down(silu(gate x) * up x), optional clamp limit
 *   9. Routers                  softmax top-k (Qwen), grouped sigmoid top-k (GLM/DeepSeek-V3)
 *  10. Routed experts           fetch the union of selected experts of a layer as one batch,
 *                               run each on the tokens that chose it, weighted scatter-add
 *  11. Layer-major prefill      an eval call as windows of sub-chunks; which head rows each
 *                               sub-chunk computes; the progress/cancel hook between layers,
 *                               polled inside a layer between sub-chunks and expert groups
 */
#ifndef MG_BLOCKS_H
#define MG_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include "core/linear.h"
#include "core/status.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "model/experts.h"

/* ---- 1. Scratch buffers ------------------------------------------------------------------
 * A fixed set of slots, each an fp32 array that grows (never shrinks) to the largest size
 * asked.  Pick slot numbers per architecture (an enum in the arch file); a slot's contents
 * are only valid until the next mg_buf call on the same slot with a larger size. */
#define MG_BUF_SLOTS 32

typedef struct mg_buffers {
    float *p[MG_BUF_SLOTS];
    size_t cap[MG_BUF_SLOTS]; /* in floats */
} mg_buffers;

/* 64-byte aligned, at least n floats; NULL with err set when out of memory. */
float *mg_buf(mg_buffers *b, int slot, size_t n, mg_error *err);
void mg_buffers_free(mg_buffers *b);

/* ---- 2. Binding helpers ------------------------------------------------------------------
 * Tensor names are printf formats ("model.layers.%d.self_attn.q_proj.weight").  Matrices are
 * counted per stored format in `census` (may be NULL) for Engine.info. */
int mg_bind_matrixf(const mg_checkpoint *ck, mg_weight_census *census, int64_t rows, int64_t cols,
                    mg_matrix *out, mg_error *err, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* fp32 copy of a vector of n values (free() it); NULL + err when missing / wrong size. */
float *mg_bind_vectorf(const mg_checkpoint *ck, int64_t n, mg_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* 1 if a tensor of that name exists. */
int mg_has_tensorf(const mg_checkpoint *ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- 3. Norms and embeddings ------------------------------------------------------------- */

/* out[r] = rmsnorm(x[r]) * w for n_rows rows of dim values, rows `stride` floats apart (out
 * uses the same stride; out may alias x).  Per-head q/k norm: n_rows = n_tok * n_heads,
 * dim = stride = head_dim.  w == NULL: unweighted. */
void mg_rmsnorm_rows(const mg_kernels *k, float *out, const float *x, const float *w,
                     int64_t n_rows, int64_t dim, int64_t stride, float eps);

/* out[t] = dequantised row tokens[t] of the embedding matrix [vocab, d] (ids pre-checked). */
void mg_embed_rows(const mg_matrix *emb, const int32_t *tokens, int64_t n_tok, float *out);

/* y[t] += b for every row (bias add), y rows `stride` floats apart. */
void mg_add_bias_rows(float *y, const float *b, int64_t n_tok, int64_t n, int64_t stride);

/* ---- 4. RoPE -----------------------------------------------------------------------------
 * Rotates rot_dim dims of each head starting at rot_off (qwen/glm: rot_off 0, rot_dim =
 * head_dim * partial_rotary_factor; DeepSeek-V4: the LAST r dims, interleaved pairs). */
typedef struct mg_rope {
    int rot_dim, rot_off, half;
    int interleaved;      /* 0: neox rotate-half pairs (j, j+half); 1: pairs (2j, 2j+1) */
    float *inv_freq;      /* [half] */
} mg_rope;

int mg_rope_init(mg_rope *r, int rot_dim, int rot_off, double theta, int interleaved, mg_error *err);
void mg_rope_free(mg_rope *r);
/* cos/sin for positions pos0 .. pos0+n_tok-1: each [n_tok, half] (compute once per chunk). */
void mg_rope_table(const mg_rope *r, int64_t pos0, int64_t n_tok, float *cos_t, float *sin_t);
/* Rotates n_heads heads (head_stride floats apart) of each token row (row_stride apart), token
 * t using row t of the table.  inverse rotates by -angle (DeepSeek-V4 output de-rotation). */
void mg_rope_rows(const mg_rope *r, float *x, int64_t n_tok, int64_t row_stride, int n_heads,
                  int head_stride, const float *cos_t, const float *sin_t, int inverse);

/* ---- 5. KV cache -------------------------------------------------------------------------
 * One sequence.  Layer l keeps k[l] and v[l], each [cap, row] values stored as `type` (row =
 * n_kv_heads * dim, keys stored after RoPE): fp32, or bf16 rounded to nearest even and read
 * back into fp32 for the dot products (half the bytes per token).  Without a RAM budget the
 * capacity grows by doubling up to max_pos; a budgeted model reserves max_pos at load
 * (mg_kv_reserve(kv, max_pos)): the address space is taken once, pages become resident only
 * as positions are written, and no realloc ever holds the old and new arrays together.
 * Truncation is just the caller's position counter (rows >= n_past are dead). */
typedef enum mg_kv_type { MG_KV_F32 = 0, MG_KV_BF16 = 1 } mg_kv_type;

static inline size_t mg_kv_type_bytes(mg_kv_type t) { return t == MG_KV_BF16 ? 2 : 4; }
const char *mg_kv_type_name(mg_kv_type t);
/* "f32" / "bf16" (NULL or "": f32); -1 with err set for anything else. */
int mg_kv_type_parse(const char *name, mg_kv_type *out, mg_error *err);

/* Stores n fp32 values as type t at element offset off of base. */
void mg_kv_put(mg_kv_type t, void *base, int64_t off, const float *src, int64_t n);
/* bf16 -> fp32 for n values (exact). */
void mg_kv_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);
/* The n values at element offset off of base as fp32: the stored values themselves for f32,
 * else converted into tmp (>= n floats). */
static inline const float *mg_kv_get(mg_kv_type t, const void *base, int64_t off, int64_t n, float *tmp) {
    if (t == MG_KV_F32) return (const float *)base + off;
    mg_kv_bf16_to_f32((const uint16_t *)base + off, tmp, n);
    return tmp;
}

typedef struct mg_kv_cache {
    int n_layers;
    mg_kv_type type;
    int64_t k_row, v_row;  /* values per position */
    int64_t cap, max_pos;
    void **k, **v;         /* [n_layers] arrays; v may be unused (v_row 0) */
} mg_kv_cache;

int mg_kv_init(mg_kv_cache *kv, int n_layers, int64_t k_row, int64_t v_row, int64_t max_pos,
               mg_kv_type type, mg_error *err);
/* Makes positions [0, n_pos) addressable (keeps contents). */
int mg_kv_reserve(mg_kv_cache *kv, int64_t n_pos, mg_error *err);
void mg_kv_free(mg_kv_cache *kv);
/* Writes n consecutive positions from pos of layer `layer`: k [n, k_row], v [n, v_row] (v may
 * be NULL when v_row is 0). */
void mg_kv_store(const mg_kv_cache *kv, int layer, int64_t pos, int64_t n, const float *k, const float *v);
/* Reports K and V of positions [0, n) of every layer (layer by layer, K then V) to fn; with
 * `reserve` makes them addressable first.  Returns fn's first non-zero result, or -1 + err. */
int mg_kv_regions(mg_kv_cache *kv, int64_t n, int reserve, int (*fn)(void *, void *, uint64_t), void *ctx,
                  mg_error *err);
/* Bytes one position costs across all layers (K and V). */
static inline uint64_t mg_kv_bytes_per_pos(int n_layers, int64_t k_row, int64_t v_row, mg_kv_type t) {
    return (uint64_t)n_layers * (uint64_t)(k_row + v_row) * mg_kv_type_bytes(t);
}

/* ---- 6. Attention ------------------------------------------------------------------------
 * For every new token t (absolute position pos0 + t) and query head h:
 *   keys j in [lo, pos0 + t], lo = window > 0 ? max(0, pos0 + t - window + 1) : 0
 *   s_j = scale * dot(q[t,h], K[j, h / (n_heads / n_kv)])
 *   softmax over s (plus an extra logit sinks[h] in the denominator when sinks != NULL)
 *   out[t,h] = sum_j p_j * V[j, kv head]
 * fp32 K/V: work is split over (token, head) pairs on the pool.  bf16 K/V: over (token, kv
 * head, block of that head's query heads), so each stored row is converted once per block of
 * heads, a block of positions at a time (same per-head arithmetic order as fp32). */
typedef struct mg_attn_args {
    const float *q;  int64_t q_stride;     /* [n_tok, q_stride]; head h at q + h*qk_dim */
    const void *k;   int64_t k_stride;     /* key of position j, kv head g: k + j*k_stride + g*qk_dim */
    const void *v;   int64_t v_stride;     /* value: v + j*v_stride + g*v_dim (values of kv_type) */
    float *out;      int64_t out_stride;   /* [n_tok, out_stride]; head h at out + h*v_dim */
    int64_t n_tok, pos0, window;
    int n_heads, n_kv, qk_dim, v_dim;
    float scale;
    const float *sinks;                    /* [n_heads] or NULL */
    mg_kv_type kv_type;                    /* storage of k and v (0: fp32) */
} mg_attn_args;

/* Scores of m query rows against n key rows, and values into m output rows: the table's block
 * products, or loops of its dot and axpy where it has none (core/kernels.h; DeepSeek-V4's
 * attention calls them too). */
void mg_attn_scores(const mg_kernels *k, const float *q, int64_t q_stride, int m, const float *kr, int64_t k_stride,
                    int64_t n, int64_t dim, float scale, float *s, int64_t s_stride);
void mg_attn_values(const mg_kernels *k, float *o, int64_t o_stride, int m, const float *p, int64_t p_stride,
                    const float *v, int64_t v_stride, int64_t n, int64_t dim);

/* scratch: at least mg_attention_scratch(c, a) floats. */
size_t mg_attention_scratch(const mg_compute *c, const mg_attn_args *a);
void mg_attention(const mg_compute *c, const mg_attn_args *a, float *scratch);

/* ---- 7. Batched linear jobs --------------------------------------------------------------
 * Y_i[t, :] = W_i X_i[t, :] for every job, all in one pool dispatch, work balanced by
 * rows x tokens.  This is how the experts of one layer run together. */
typedef struct mg_linear_job {
    const mg_matrix *w;
    const float *x; int64_t x_stride;
    float *y;       int64_t y_stride;
    int64_t n_tok;
} mg_linear_job;

void mg_linear_jobs(const mg_compute *c, int n_jobs, const mg_linear_job *jobs);

/* ---- 8. Dense SwiGLU MLP ------------------------------------------------------------------ */
typedef struct mg_mlp {
    mg_matrix gate, up, down; /* [f, d], [f, d], [d, f] */
} mg_mlp;

/* Binds "<prefix>.gate_proj.weight" etc. (prefix is a printf result, e.g. "model.layers.0.mlp"). */
int mg_mlp_bind(const mg_checkpoint *ck, mg_weight_census *census, const char *prefix, int64_t d,
                int64_t f, mg_mlp *m, mg_error *err);
/* out[n_tok, d] = down(swiglu(gate x, up x)); tmp >= 2 * n_tok * f floats.  limit as in
 * mg_kernels.swiglu (0: none). */
void mg_mlp_forward(const mg_compute *c, const mg_mlp *m, const float *x, int64_t n_tok,
                    float *out, float *tmp, float limit);

/* ---- 9. Routers (fp32, one token per call) ------------------------------------------------
 * ids[k], w[k] receive the selected experts and their weights (order: best first). */

/* Qwen3-MoE: p = softmax(logits over all E); top-k of p; if norm: w /= sum(w). */
void mg_route_softmax_topk(const float *logits, int n_experts, int k, int norm, int *ids, float *w);

/* GLM-4.5 / DeepSeek-V3 style: s = sigmoid(logits); choice = s + bias (bias may be NULL);
 * group score = sum of the top-2 choices in each of n_group groups; keep the topk_group best
 * groups; top-k of choice inside them; w = s[id] (unbiased); if norm: w /= (sum + 1e-20);
 * w *= scale.  scratch >= 2 * n_experts + n_group floats. */
void mg_route_sigmoid_grouped(const float *logits, const float *bias, int n_experts, int n_group,
                              int topk_group, int k, int norm, float scale, int *ids, float *w,
                              float *scratch);

/* ---- 10. Routed experts -------------------------------------------------------------------
 * out[t] += sum over j < k of w[t*k + j] * Expert_{ids[t*k + j]}(x[t]), where
 * Expert(x) = down(swiglu(gate x, up x)).  The union of ids over all n_tok tokens is fetched
 * from the store as ONE batch (mg_expert_store_fetch_begin; in waves of the cache's slot count
 * if it ever holds fewer, still reading each expert once); each expert then runs over the rows
 * of the tokens that selected it (a small matrix x batch product).  The experts already in
 * memory run first (gate/up of all of them in one dispatch, down in a second) while the missing
 * ones are read; each missing expert then runs as its read lands.  Contributions are added in
 * increasing expert id order (the order transformers' expert loop uses).  Uses buffer slots
 * [slot0, slot0 + 4).
 * group > 0: the tokens are a prefill window of consecutive groups of `group` tokens (the
 * sub-chunks its dense work runs in; the last may be shorter), and the result is bitwise that
 * of one call per group: an expert's tokens inside one group are batched exactly as that call
 * would batch them (one token alone in its group takes the n_tok = 1 kernel), while each
 * expert is still fetched once for the whole window.  group = 0: one group of n_tok.
 * shared != NULL: the shared expert (a dense SwiGLU MLP over every token, same clamp limit,
 * one product per group) rides in the same two dispatches and writes shared_out[n_tok, d]
 * (not accumulated; the caller adds it, so the summation order is the caller's).
 * poll != NULL: a prefill window whose hook is polled (mg_window_poll, layer = `layer`) between
 * groups of experts of about one sub-chunk's assignments each; a cancel there returns
 * MG_EVAL_CANCELLED with out only partly written (the window is dropped). */
struct mg_window;
typedef struct mg_moe_args {
    mg_expert_store *store;
    int layer, n_experts, k;
    const float *x;          /* [n_tok, d] */
    int64_t n_tok, d;
    int64_t group;           /* tokens per group (see above); 0: all n_tok */
    const int *ids;          /* [n_tok, k] */
    const float *w;          /* [n_tok, k] */
    float limit;             /* swiglu clamp (0: none) */
    float *out;              /* [n_tok, d], accumulated into */
    const mg_mlp *shared;    /* optional shared expert, see above */
    float *shared_out;       /* [n_tok, d] when shared != NULL */
    const float *scores;     /* optional: [n_experts] the router's values that top-k ranked for
                                the last token (handed to the store: routing trace) */
    const struct mg_window *poll; /* optional: the window whose hook is polled (see above) */
} mg_moe_args;

/* Floats of scratch mg_moe_experts takes per token of a window (k choices, intermediate width
 * f, shared expert width fs): the k outputs, the shared expert's gate/up, and a row of gathered
 * input and gate/up (the rows of one group of experts, computed at once, are at most the
 * window's tokens, when one expert takes them all, or mg_moe_fixed_floats). */
static inline uint64_t mg_moe_floats_per_token(int64_t d, int64_t k, int64_t f, int64_t fs) {
    return (uint64_t)(k * d + d + 2 * f + 2 * fs);
}
/* ... plus this, whatever the window: one group's rows (group tokens' k assignments). */
static inline uint64_t mg_moe_fixed_floats(int64_t d, int64_t k, int64_t f, int64_t group) {
    return (uint64_t)(group * k * (d + 2 * f));
}

/* 0, -1 with err set, or MG_EVAL_CANCELLED (a->poll's hook asked to stop). */
int mg_moe_experts(const mg_compute *c, const mg_moe_args *a, mg_buffers *buf, int slot0,
                   mg_error *err);

/* ---- 11. Layer-major prefill -------------------------------------------------------------
 * A prefill runs every layer over a whole window of tokens before the next layer, so each
 * routed expert of a layer is fetched once per window (not once per chunk of a pass over the
 * stack).  Inside a layer the dense work (attention, norms, projections, shared experts, the
 * router) still runs in sub-chunks of the architecture's chunk size, in position order: layer
 * l of sub-chunk j only needs layer l of the earlier positions, which the window has already
 * computed.  Windows are multiples of the chunk, so the sub-chunks are exactly the chunks a
 * pass-per-chunk prefill of the same call would run, and with mg_moe_args.group = chunk the
 * logits are bitwise the same. */
typedef struct mg_window {
    const int32_t *tokens;     /* the window's tokens */
    int64_t m, pos;            /* how many, absolute position of the first */
    int64_t t0, n;             /* offset of the window in the eval call, tokens of the call */
    int64_t chunk;             /* sub-chunk size */
    int last_only;
    float *logits;             /* the call's logits (NULL: none) */
    int64_t vocab;
    const mg_eval_hook *hook;  /* may be NULL */
    int n_layers;
} mg_window;

/* Logits of sub-chunk [c0, c0 + mc) of the window, as a pass per chunk computed them: where
 * they go (NULL: no row of this sub-chunk gets logits) and *from, its first row that does. */
float *mg_window_head(const mg_window *w, int64_t c0, int64_t mc, int64_t *from);

/* A cancel after a window's last layer: the window is complete and kept. */
#define MG_WINDOW_CANCELLED_KEPT 2

/* After layer `layer` of the window, the hook: 0 to go on, MG_EVAL_CANCELLED when it asks to
 * cancel (the window is dropped), or MG_WINDOW_CANCELLED_KEPT when it asks so after the last
 * layer.  Return what it returns. */
int mg_window_layer_done(const mg_window *w, int layer);

/* Inside layer `layer` of the window, between two pieces of its work (dense sub-chunks, groups
 * of routed experts): polls the hook (in_layer = 1).  0 to go on, or MG_EVAL_CANCELLED: the
 * window is dropped, whatever of the layer was computed.  Costs one indirect call. */
int mg_window_poll(const mg_window *w, int layer);

/* Runs an eval call [tokens, n) at position pos as windows of `window` tokens (a multiple of
 * chunk), fn(state, w, err) each: 0, -1, MG_EVAL_CANCELLED or MG_WINDOW_CANCELLED_KEPT.
 * Returns the first non-zero (both cancels as MG_EVAL_CANCELLED), with *done = the tokens of
 * the windows before it (and of it, when kept); else 0 with *done = n. */
typedef int (*mg_window_fn)(void *state, const mg_window *w, mg_error *err);
int mg_eval_windows(void *state, mg_window_fn fn, const mg_window *call, int64_t window, int64_t *done,
                    mg_error *err);

/* What a layer-major prefill window costs: the dense work runs in sub-chunks of `chunk` tokens
 * (the window is a multiple of it), and every token of the window holds bytes_per_token of
 * window-wide scratch (residual stream, MoE inputs and outputs, routing, mg_moe_experts' rows). */
typedef struct mg_prefill_cost {
    int64_t chunk;
    uint64_t bytes_per_token;
    uint64_t fixed_bytes; /* whatever the window's length (mg_moe_fixed_floats) */
} mg_prefill_cost;

/* Call once after every mg_expert_store_set: with env->ram_gb > 0 it sizes the expert cache
 * (mg_expert_store_plan + mg_expert_store_configure, experts.h) from the budget, given the
 * bytes the model holds besides the experts: other_bytes = census bytes of all bound matrices
 * (experts are subtracted here) + extra_bytes (KV cache at max_ctx + per-chunk scratch) + the
 * prefill window's scratch.  *window receives the prefill window in tokens: env->prefill_window
 * when set (rounded up to a chunk), else without a budget a fixed default and under one the
 * largest that takes at most a quarter of the cache; always a multiple of pc->chunk, at most
 * max_ctx rounded up to one.  ram_gb <= 0: resident. */
int mg_expert_store_apply_budget(const mg_arch_env *env, mg_expert_store *s, const mg_weight_census *census,
                                 uint64_t extra_bytes, const mg_prefill_cost *pc, int64_t *window, mg_error *err);

#endif
