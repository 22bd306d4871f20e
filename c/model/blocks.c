/* Shared building blocks of the decoder forward passes (see blocks.h for the map). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (core/clock.h) */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "core/clock.h"
#include "core/formats.h"
#include "core/ops.h"
#include "model/blocks.h"
#include "model/weights.h"

/* ---- 1. Scratch buffers ------------------------------------------------------------------ */

float *mg_buf(mg_buffers *b, int slot, size_t n, mg_error *err) {
    if (slot < 0 || slot >= MG_BUF_SLOTS) {
        mg_fail(err, "internal: scratch slot %d out of range", slot);
        return NULL;
    }
    if (n == 0) n = 1;
    if (b->cap[slot] >= n) return b->p[slot];
    size_t cap = b->cap[slot] ? b->cap[slot] : 1024;
    while (cap < n) cap *= 2;
    size_t bytes = (cap * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (!p) {
        mg_fail(err, "out of memory for a %zu-byte scratch buffer", bytes);
        return NULL;
    }
    free(b->p[slot]); /* contents need not survive growth: callers fill after asking */
    b->p[slot] = p;
    b->cap[slot] = cap;
    return p;
}

void mg_buffers_free(mg_buffers *b) {
    for (int i = 0; i < MG_BUF_SLOTS; i++) {
        free(b->p[i]);
        b->p[i] = NULL;
        b->cap[i] = 0;
    }
}

/* ---- 2. Binding helpers ------------------------------------------------------------------ */

int mg_bind_matrixf(const mg_checkpoint *ck, mg_weight_census *census, int64_t rows, int64_t cols,
                    mg_matrix *out, mg_error *err, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (mg_bind_matrix(ck, name, rows, cols, out, err) != 0) return -1;
    if (census && out->format < MG_FORMAT_COUNT) {
        census->n_matrices[out->format]++;
        census->bytes[out->format] += mg_matrix_bytes(out);
    }
    return 0;
}

float *mg_bind_vectorf(const mg_checkpoint *ck, int64_t n, mg_error *err, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return mg_bind_vector(ck, name, n, err);
}

int mg_has_tensorf(const mg_checkpoint *ck, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return mg_checkpoint_find(ck, name) != NULL;
}

/* ---- 3. Norms and embeddings ------------------------------------------------------------- */

void mg_rmsnorm_rows(const mg_kernels *k, float *out, const float *x, const float *w,
                     int64_t n_rows, int64_t dim, int64_t stride, float eps) {
    for (int64_t r = 0; r < n_rows; r++) k->rmsnorm(out + r * stride, x + r * stride, w, dim, eps);
}

void mg_embed_rows(const mg_matrix *emb, const int32_t *tokens, int64_t n_tok, float *out) {
    for (int64_t t = 0; t < n_tok; t++) mg_matrix_row_f32(emb, tokens[t], out + t * emb->cols);
}

void mg_add_bias_rows(float *y, const float *b, int64_t n_tok, int64_t n, int64_t stride) {
    for (int64_t t = 0; t < n_tok; t++) {
        float *row = y + t * stride;
        for (int64_t i = 0; i < n; i++) row[i] += b[i];
    }
}

/* ---- 4. RoPE ----------------------------------------------------------------------------- */

int mg_rope_init(mg_rope *r, int rot_dim, int rot_off, double theta, int interleaved, mg_error *err) {
    memset(r, 0, sizeof *r);
    if (rot_dim < 0 || rot_dim % 2) return mg_fail(err, "rotary dims %d must be even", rot_dim);
    r->rot_dim = rot_dim;
    r->rot_off = rot_off;
    r->half = rot_dim / 2;
    r->interleaved = interleaved;
    r->inv_freq = malloc(sizeof(float) * (size_t)(r->half ? r->half : 1));
    if (!r->inv_freq) return mg_fail(err, "out of memory (rope)");
    mg_rope_inv_freq(r->inv_freq, rot_dim, theta);
    return 0;
}

void mg_rope_free(mg_rope *r) {
    free(r->inv_freq);
    r->inv_freq = NULL;
}

void mg_rope_table(const mg_rope *r, int64_t pos0, int64_t n_tok, float *cos_t, float *sin_t) {
    for (int64_t t = 0; t < n_tok; t++)
        mg_rope_cos_sin(cos_t + t * r->half, sin_t + t * r->half, r->inv_freq, r->half, pos0 + t);
}

void mg_rope_rows(const mg_rope *r, float *x, int64_t n_tok, int64_t row_stride, int n_heads,
                  int head_stride, const float *cos_t, const float *sin_t, int inverse) {
    if (r->half == 0) return;
    for (int64_t t = 0; t < n_tok; t++)
        mg_rope_apply(x + t * row_stride, n_heads, head_stride, r->rot_off, r->half,
                      cos_t + t * r->half, sin_t + t * r->half, r->interleaved, inverse);
}

/* ---- 5. KV cache ------------------------------------------------------------------------- */

const char *mg_kv_type_name(mg_kv_type t) { return t == MG_KV_BF16 ? "bf16" : "f32"; }

int mg_kv_type_parse(const char *name, mg_kv_type *out, mg_error *err) {
    if (!name || !name[0] || strcmp(name, "f32") == 0) *out = MG_KV_F32;
    else if (strcmp(name, "bf16") == 0) *out = MG_KV_BF16;
    else return mg_fail(err, "unknown KV cache type '%s' (use f32 or bf16)", name);
    return 0;
}

void mg_kv_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) { /* a shift per value: the compiler vectorises this loop */
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

void mg_kv_put(mg_kv_type t, void *base, int64_t off, const float *src, int64_t n) {
    if (t == MG_KV_F32) {
        memcpy((float *)base + off, src, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *d = (uint16_t *)base + off;
    for (int64_t i = 0; i < n; i++) d[i] = mg_f32_to_bf16(src[i]);
}

int mg_kv_init(mg_kv_cache *kv, int n_layers, int64_t k_row, int64_t v_row, int64_t max_pos,
               mg_kv_type type, mg_error *err) {
    memset(kv, 0, sizeof *kv);
    kv->n_layers = n_layers;
    kv->type = type;
    kv->k_row = k_row;
    kv->v_row = v_row;
    kv->max_pos = max_pos;
    kv->k = calloc((size_t)n_layers, sizeof(void *));
    kv->v = calloc((size_t)n_layers, sizeof(void *));
    if (!kv->k || !kv->v) {
        mg_kv_free(kv);
        return mg_fail(err, "out of memory (kv cache)");
    }
    return 0;
}

int mg_kv_reserve(mg_kv_cache *kv, int64_t n_pos, mg_error *err) {
    if (n_pos <= kv->cap) return 0;
    if (n_pos > kv->max_pos)
        return mg_fail(err, "context of %lld positions exceeds the cache limit of %lld",
                       (long long)n_pos, (long long)kv->max_pos);
    int64_t cap = kv->cap ? kv->cap : 64;
    while (cap < n_pos) cap *= 2;
    if (cap > kv->max_pos) cap = kv->max_pos;
    const size_t es = mg_kv_type_bytes(kv->type);
    for (int l = 0; l < kv->n_layers; l++) {
        void *nk = kv->k_row ? realloc(kv->k[l], (size_t)cap * (size_t)kv->k_row * es) : NULL;
        if (kv->k_row && !nk)
            return mg_fail(err, "out of memory growing the kv cache to %lld positions", (long long)cap);
        if (kv->k_row) kv->k[l] = nk;
        void *nv = kv->v_row ? realloc(kv->v[l], (size_t)cap * (size_t)kv->v_row * es) : NULL;
        if (kv->v_row && !nv)
            return mg_fail(err, "out of memory growing the kv cache to %lld positions", (long long)cap);
        if (kv->v_row) kv->v[l] = nv;
    }
    kv->cap = cap;
    return 0;
}

int mg_kv_regions(mg_kv_cache *kv, int64_t n, int reserve, int (*fn)(void *, void *, uint64_t), void *ctx,
                  mg_error *err) {
    if (reserve && mg_kv_reserve(kv, n, err)) return -1;
    if (n > kv->cap) return mg_fail(err, "kv cache: %lld positions asked, %lld held", (long long)n, (long long)kv->cap);
    const uint64_t es = mg_kv_type_bytes(kv->type);
    for (int l = 0; l < kv->n_layers; l++) {
        int rc = 0;
        if (kv->k_row && (rc = fn(ctx, kv->k[l], (uint64_t)n * (uint64_t)kv->k_row * es))) return rc;
        if (kv->v_row && (rc = fn(ctx, kv->v[l], (uint64_t)n * (uint64_t)kv->v_row * es))) return rc;
    }
    return 0;
}

void mg_kv_store(const mg_kv_cache *kv, int layer, int64_t pos, int64_t n, const float *k, const float *v) {
    if (kv->k_row) mg_kv_put(kv->type, kv->k[layer], pos * kv->k_row, k, n * kv->k_row);
    if (kv->v_row) mg_kv_put(kv->type, kv->v[layer], pos * kv->v_row, v, n * kv->v_row);
}

void mg_kv_free(mg_kv_cache *kv) {
    for (int l = 0; l < kv->n_layers && kv->k; l++) free(kv->k[l]);
    for (int l = 0; l < kv->n_layers && kv->v; l++) free(kv->v[l]);
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
    kv->cap = 0;
}

/* ---- 6. Attention ------------------------------------------------------------------------ */

#define KV_BLOCK 32 /* bf16 rows converted per step (a block of K or V rows stays in L1) */

typedef struct {
    const mg_attn_args *a;
    const mg_kernels *k;
    float *scratch;
    int64_t per_worker;
    int heads_per_item; /* query heads one work item covers (a slice of one kv group) */
    int items_per_group;
    int tokens_per_item; /* a block of consecutive tokens */
} attn_job;

void mg_attn_scores(const mg_kernels *k, const float *q, int64_t q_stride, int m, const float *kr,
                    int64_t k_stride, int64_t n, int64_t dim, float scale, float *s, int64_t s_stride) {
    if (k->attn_scores) {
        k->attn_scores(q, q_stride, m, kr, k_stride, n, dim, scale, s, s_stride);
        return;
    }
    for (int i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) s[i * s_stride + j] = k->dot(q + i * q_stride, kr + j * k_stride, dim) * scale;
}

void mg_attn_values(const mg_kernels *k, float *o, int64_t o_stride, int m, const float *p, int64_t p_stride,
                    const float *v, int64_t v_stride, int64_t n, int64_t dim) {
    if (k->attn_values) {
        k->attn_values(o, o_stride, m, p, p_stride, v, v_stride, n, dim);
        return;
    }
    for (int i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) k->axpy(o + i * o_stride, p[i * p_stride + j], v + j * v_stride, dim);
}

/* Rows [j, j + n) of kv head g of a cache of `type` as floats: in place for fp32, converted
 * into buf (n x dim) for bf16.  Returns the first row; *stride the floats between rows. */
static const float *kv_rows(mg_kv_type type, const void *base, int64_t row_stride, int g, int dim, int64_t j,
                            int64_t n, float *buf, int64_t *stride) {
    if (type == MG_KV_F32) {
        *stride = row_stride;
        return (const float *)base + j * row_stride + (int64_t)g * dim;
    }
    for (int64_t r = 0; r < n; r++)
        mg_kv_bf16_to_f32((const uint16_t *)base + (j + r) * row_stride + (int64_t)g * dim, buf + r * dim, dim);
    *stride = dim;
    return buf;
}

/* The keys token t attends to: positions [*lo, pos0 + t], a window's worth at most. */
static int64_t attn_span(const mg_attn_args *a, int64_t t, int64_t *lo) {
    const int64_t pos = a->pos0 + t;
    *lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    return pos - *lo + 1;
}

/* One product of attn_group over the block's joint span: the scores (values 0) into s, or the
 * values (values 1) from the probabilities in s into the outputs. */
static void attn_pass(const mg_attn_args *a, const mg_kernels *kern, int64_t t0, int64_t t1, int g, int h0, int nh,
                      float *s, int64_t s_row, int values) {
    const int dk = a->qk_dim, dv = a->v_dim, dim = values ? dv : dk;
    float *buf = s + (t1 - t0) * nh * s_row;
    int64_t first;
    attn_span(a, t0, &first);
    const int64_t last = a->pos0 + t1 - 1;
    for (int64_t j0 = first; j0 <= last; j0 += KV_BLOCK) {
        const int64_t nb = last + 1 - j0 < KV_BLOCK ? last + 1 - j0 : KV_BLOCK;
        int64_t stride;
        const float *rows = kv_rows(a->kv_type, values ? a->v : a->k, values ? a->v_stride : a->k_stride, g, dim,
                                    j0, nb, buf, &stride);
        for (int64_t t = t0; t < t1; t++) {
            int64_t lo;
            const int64_t n = attn_span(a, t, &lo), end = lo + n; /* end: one past the token's span */
            const int64_t j = j0 > lo ? j0 : lo, je = j0 + nb < end ? j0 + nb : end;
            if (j >= je) continue;
            float *st = s + (t - t0) * nh * s_row + (j - lo);
            if (values)
                mg_attn_values(kern, a->out + t * a->out_stride + (int64_t)h0 * dv, dv, nh, st, s_row,
                               rows + (j - j0) * stride, stride, je - j, dv);
            else
                mg_attn_scores(kern, a->q + t * a->q_stride + (int64_t)h0 * dk, dk, nh, rows + (j - j0) * stride,
                               stride, je - j, dk, a->scale, st, s_row);
        }
    }
}

/* Query heads [h0, h1) of kv group g for tokens [t0, t1).  s: (t1 - t0) * (h1 - h0) score rows
 * of s_row floats (token by token, its heads in order; position lo + j of a token's span at
 * column j), then KV_BLOCK converted rows (bf16 caches).  Keys, then values, go by blocks of
 * KV_BLOCK rows over the tokens' joint span, each block used by every token and head of the
 * item while it is in L1: in a prefill, a block of tokens reads the cache once where a token at
 * a time read all of it per token (at a 4096-token prompt, attention was 71 % of a prefill and
 * its key loads waited on memory).  Per row: the scaled scores, a softmax (with the head's
 * sink), the probabilities' sum of values in position order.  A row's results do not depend on
 * the tokens or heads beside it (the block products' contract, core/kernels.h, whatever keys
 * share a call; values in position order from the loaded output), so they are bit for bit
 * those of one token at a time. */
static void attn_group(const mg_attn_args *a, const mg_kernels *kern, int64_t t0, int64_t t1, int g, int h0,
                       int h1, float *s, int64_t s_row) {
    const int nh = h1 - h0, dv = a->v_dim;
    attn_pass(a, kern, t0, t1, g, h0, nh, s, s_row, 0);
    for (int64_t t = t0; t < t1; t++) {
        int64_t lo;
        const int64_t n = attn_span(a, t, &lo);
        for (int i = 0; i < nh; i++) {
            kern->softmax(s + ((t - t0) * nh + i) * s_row, n, a->sinks ? a->sinks[h0 + i] : -INFINITY);
            memset(a->out + t * a->out_stride + (int64_t)(h0 + i) * dv, 0, sizeof(float) * (size_t)dv);
        }
    }
    attn_pass(a, kern, t0, t1, g, h0, nh, s, s_row, 1);
}

static void attn_task(void *ctx, int worker, int n_workers) {
    const attn_job *job = ctx;
    const mg_attn_args *a = job->a;
    float *s = job->scratch + (int64_t)worker * job->per_worker;
    const int hpg = a->n_heads / a->n_kv, per = job->items_per_group;
    const int64_t n_blocks = (a->n_tok + job->tokens_per_item - 1) / job->tokens_per_item;
    /* items by turns, not in ranges: with a causal mask a later token costs more, and the last
     * items of a prefill would fall to one worker */
    for (int64_t i = worker; i < n_blocks * a->n_kv * per; i += n_workers) {
        const int64_t tb = i / ((int64_t)a->n_kv * per);
        const int g = (int)(i / per % a->n_kv), b = (int)(i % per);
        const int h0 = g * hpg + b * job->heads_per_item;
        const int h1 = h0 + job->heads_per_item < (g + 1) * hpg ? h0 + job->heads_per_item : (g + 1) * hpg;
        const int64_t t0 = tb * job->tokens_per_item;
        const int64_t t1 = t0 + job->tokens_per_item < a->n_tok ? t0 + job->tokens_per_item : a->n_tok;
        if (h0 < h1) attn_group(a, job->k, t0, t1, g, h0, h1, s, a->pos0 + a->n_tok);
    }
}

/* Score rows a worker keeps at most (floats): the token blocks shrink for long contexts. */
enum { ATTN_SCORE_FLOATS = 4 << 20, ATTN_TOKENS = 64 };

/* Work items: blocks of up to ATTN_TOKENS tokens (at most n_tok), and each kv group's heads cut
 * into slices so that there are at least as many (block, group, slice) items as workers (decode
 * with few kv heads still uses them all). */
static attn_job attn_plan(const mg_compute *c, const mg_attn_args *a, float *scratch) {
    attn_job job = {a, c->k, scratch, a->pos0 + a->n_tok, 1, 1, 1};
    const int threads = mg_pool_threads(c->pool), hpg = a->n_heads / a->n_kv;
    const int64_t span = a->pos0 + a->n_tok; /* a score row's floats */
    int64_t tpi = ATTN_SCORE_FLOATS / ((int64_t)hpg * span);
    tpi = tpi > ATTN_TOKENS ? ATTN_TOKENS : tpi > a->n_tok ? a->n_tok : tpi < 1 ? 1 : tpi;
    /* twice as many (block, group) items as workers: a causal prefill's blocks cost unequally */
    while (tpi > 1 && (a->n_tok + tpi - 1) / tpi * a->n_kv < 2 * threads) tpi /= 2;
    job.tokens_per_item = (int)tpi;
    const int64_t groups = (a->n_tok + tpi - 1) / tpi * a->n_kv;
    int per = groups >= threads ? 1 : (int)((threads + groups - 1) / groups);
    if (per > hpg) per = hpg;
    job.heads_per_item = (hpg + per - 1) / per;
    job.items_per_group = (hpg + job.heads_per_item - 1) / job.heads_per_item;
    const int64_t dmax = a->qk_dim > a->v_dim ? a->qk_dim : a->v_dim;
    job.per_worker = tpi * job.heads_per_item * span + (a->kv_type == MG_KV_F32 ? 0 : KV_BLOCK * dmax);
    return job;
}

size_t mg_attention_scratch(const mg_compute *c, const mg_attn_args *a) {
    attn_job job = attn_plan(c, a, NULL);
    return (size_t)mg_pool_threads(c->pool) * (size_t)job.per_worker;
}

void mg_attention(const mg_compute *c, const mg_attn_args *a, float *scratch) {
    attn_job job = attn_plan(c, a, scratch);
    mg_pool_run(c->pool, attn_task, &job);
}

/* ---- 7. Batched linear jobs -------------------------------------------------------------- */

typedef struct {
    const mg_kernels *k;
    int act_int8; /* fast activations (mg_compute.act_int8): chooses the entry per matrix */
    int n;
    const mg_linear_job *jobs;
    int64_t total_cost;
    const mg_q8_act *const *xq; /* per job: its x quantised (int8 activations), NULL: fp32 */
} jobs_ctx;

/* Cost of one output row (core/linear.h's estimate: bytes streamed + multiply-adds), so that
 * jobs of different formats and token counts (routed fp4 experts next to an fp8 shared expert)
 * are balanced by work, not by rows.  Jobs without tokens cost nothing. */
static int64_t row_cost(const mg_linear_job *j) { return j->n_tok > 0 ? mg_linear_row_cost(j->w, j->n_tok) : 0; }

/* First row of job j whose cost start is >= the global cost point C (job starts at `base`),
 * rounded up to 16 rows; every worker computes boundaries the same way, so ranges tile. */
static int64_t row_at(const mg_linear_job *j, int64_t base, int64_t C) {
    if (C <= base) return 0;
    int64_t rc = row_cost(j);
    int64_t r = (C - base + rc - 1) / rc;
    r = (r + 15) / 16 * 16;
    return r < j->w->rows ? r : j->w->rows;
}

static void jobs_task(void *ctx, int worker, int n_workers) {
    const jobs_ctx *jc = ctx;
    int64_t c0 = jc->total_cost * worker / n_workers;
    int64_t c1 = worker == n_workers - 1 ? jc->total_cost : jc->total_cost * (worker + 1) / n_workers;
    int64_t base = 0;
    for (int i = 0; i < jc->n; i++) {
        const mg_linear_job *j = &jc->jobs[i];
        int64_t cost = j->w->rows * row_cost(j);
        if (j->n_tok > 0 && base < c1 && base + cost > c0) {
            int64_t r0 = row_at(j, base, c0);
            int64_t r1 = worker == n_workers - 1 ? j->w->rows : row_at(j, base, c1);
            if (r0 < r1)
                mg_linear_rows(jc->k, jc->act_int8, j->w, j->x, j->x_stride, jc->xq ? jc->xq[i] : NULL, j->n_tok, j->y, j->y_stride,
                               r0, r1);
        }
        base += cost;
    }
}

/* Same input: jobs a and b read the same x rows (e.g. an expert's gate and up). */
static int same_input(const mg_linear_job *a, const mg_linear_job *b) {
    return a->x == b->x && a->x_stride == b->x_stride && a->n_tok == b->n_tok && a->w->cols == b->w->cols;
}

/* int8 activations: every distinct input of the jobs that take the int8 path quantised once,
 * before the rows are split over the pool, into one buffer (mg_q8_buffer) that the caller frees
 * after the dispatch; NULL when no job takes it (or out of memory: then all stay fp32). */
static const mg_q8_act *const *quantize_inputs(const mg_compute *c, int n_jobs, const mg_linear_job *jobs) {
    size_t bytes = 0;
    int any = 0;
    for (int i = 0; i < n_jobs; i++) {
        if (!mg_linear_q8_applies(c, jobs[i].w, jobs[i].n_tok)) continue;
        any = 1;
        bytes += (mg_q8_act_bytes(jobs[i].n_tok, jobs[i].w->cols) + 63) & ~(size_t)63;
    }
    if (!any) return NULL;
    const size_t head = ((size_t)n_jobs * (sizeof(mg_q8_act *) + sizeof(mg_q8_act)) + 63) & ~(size_t)63;
    char *mem = mg_q8_buffer(head + bytes);
    if (!mem) return NULL;
    const mg_q8_act **xq = (const mg_q8_act **)mem;
    mg_q8_act *acts = (mg_q8_act *)(mem + (size_t)n_jobs * sizeof(mg_q8_act *));
    char *data = mem + head;
    for (int i = 0; i < n_jobs; i++) {
        xq[i] = NULL;
        if (!mg_linear_q8_applies(c, jobs[i].w, jobs[i].n_tok)) continue;
        for (int j = 0; j < i && !xq[i]; j++)
            if (xq[j] && same_input(&jobs[i], &jobs[j])) xq[i] = xq[j];
        if (xq[i]) continue;
        mg_q8_quantize(jobs[i].x, jobs[i].x_stride, jobs[i].n_tok, jobs[i].w->cols, data, &acts[i],
                       c->k->q8_quantize_row);
        xq[i] = &acts[i];
        data += (mg_q8_act_bytes(jobs[i].n_tok, jobs[i].w->cols) + 63) & ~(size_t)63;
    }
    return xq;
}

void mg_linear_jobs(const mg_compute *c, int n_jobs, const mg_linear_job *jobs) {
    jobs_ctx jc = {c->k, c->act_int8, n_jobs, jobs, 0, NULL};
    for (int i = 0; i < n_jobs; i++) jc.total_cost += jobs[i].w->rows * row_cost(&jobs[i]);
    if (jc.total_cost == 0) return;
    jc.xq = quantize_inputs(c, n_jobs, jobs);
    if (c->traffic) {
        uint64_t bytes = 0;
        for (int i = 0; i < n_jobs; i++) bytes += jobs[i].n_tok > 0 ? mg_matrix_bytes(jobs[i].w) : 0;
        mg_traffic_add(c, bytes);
    }
    mg_pool_run(c->pool, jobs_task, &jc);
    free((void *)jc.xq);  /* quantize_inputs' one buffer: the pointer table at its start */
}

/* ---- 8. Dense SwiGLU MLP ----------------------------------------------------------------- */

int mg_mlp_bind(const mg_checkpoint *ck, mg_weight_census *census, const char *prefix, int64_t d,
                int64_t f, mg_mlp *m, mg_error *err) {
    if (mg_bind_matrixf(ck, census, f, d, &m->gate, err, "%s.gate_proj.weight", prefix)) return -1;
    if (mg_bind_matrixf(ck, census, f, d, &m->up, err, "%s.up_proj.weight", prefix)) return -1;
    if (mg_bind_matrixf(ck, census, d, f, &m->down, err, "%s.down_proj.weight", prefix)) return -1;
    return 0;
}

void mg_mlp_forward(const mg_compute *c, const mg_mlp *m, const float *x, int64_t n_tok,
                    float *out, float *tmp, float limit) {
    int64_t f = m->gate.rows;
    float *g = tmp, *u = tmp + n_tok * f;
    const mg_matrix *ws[2] = {&m->gate, &m->up};
    float *ys[2] = {g, u};
    mg_linear_multi(c, 2, ws, x, n_tok, ys);
    c->k->swiglu(g, g, u, n_tok * f, limit);
    mg_linear(c, &m->down, g, n_tok, out);
}

/* ---- 9. Routers -------------------------------------------------------------------------- */

void mg_route_softmax_topk(const float *logits, int n_experts, int k, int norm, int *ids, float *w) {
    /* softmax is monotonic, so the top-k of the logits are the top-k of the probabilities;
     * the probabilities themselves need the full normaliser. */
    float mx = logits[0];
    for (int e = 1; e < n_experts; e++) mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < n_experts; e++) sum += expf(logits[e] - mx);
    mg_topk(logits, n_experts, k, ids);
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        w[j] = expf(logits[ids[j]] - mx) / sum;
        wsum += w[j];
    }
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= wsum;
}

void mg_route_sigmoid_grouped(const float *logits, const float *bias, int n_experts, int n_group,
                              int topk_group, int k, int norm, float scale, int *ids, float *w,
                              float *scratch) {
    float *s = scratch, *choice = scratch + n_experts, *gscore = scratch + 2 * n_experts;
    for (int e = 0; e < n_experts; e++) {
        s[e] = mg_sigmoid(logits[e]);
        choice[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    if (n_group > 1 && topk_group < n_group) {
        int per = n_experts / n_group;
        for (int g = 0; g < n_group; g++) {
            int top2[2];
            mg_topk(choice + g * per, per, 2, top2);
            gscore[g] = choice[g * per + top2[0]] + choice[g * per + top2[1]];
        }
        int keep[64], *kp = keep, *heap = NULL;
        if (topk_group > 64) kp = heap = malloc(sizeof(int) * (size_t)topk_group);
        if (!kp) kp = keep, topk_group = topk_group > 64 ? 64 : topk_group;
        mg_topk(gscore, n_group, topk_group, kp);
        for (int g = 0; g < n_group; g++) {
            int kept = 0;
            for (int i = 0; i < topk_group; i++) kept |= kp[i] == g;
            if (!kept)
                for (int e = g * per; e < (g + 1) * per; e++) choice[e] = -INFINITY;
        }
        free(heap);
    }
    mg_topk(choice, n_experts, k, ids);
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        w[j] = s[ids[j]];
        wsum += w[j];
    }
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= (wsum + 1e-20f);
    for (int j = 0; j < k; j++) w[j] *= scale;
}

/* ---- 10. Routed experts ------------------------------------------------------------------ */

/* Which rows each expert computes, and how they are batched.
 *
 * The assignments (token, choice) are grouped by expert in increasing id, tokens ascending.
 * The linear kernels give a token's output bitwise the same however tokens are batched when
 * n_tok > 1, but n_tok == 1 takes the decode kernel (another summation order).  So that a
 * window of many groups (prefill sub-chunks) gives exactly the bits of running each group on
 * its own, an expert's rows are split: the tokens of groups where the expert has >= 2
 * assignments run as ONE batch (the first multi[e] rows of its segment), and each assignment
 * that is alone in its group runs as its own n_tok = 1 product (the rows after). */
typedef struct moe_plan {
    int nu;                     /* experts with at least one assignment */
    int *count, *start, *multi; /* [E] each: rows, first row, rows of the batched part */
    int *uid;                   /* [nu] those experts, increasing id */
    int *order;                 /* [A] row -> assignment index (token * k + choice) */
} moe_plan;

/* Moves the rows of expert e whose group holds a single one of its assignments behind the
 * others (stable), and records how many stay in front. */
static void moe_split_lone(const mg_moe_args *a, moe_plan *p, int e, int64_t group, int *tmp) {
    const int s = p->start[e], n = p->count[e];
    int n_multi = 0, n_lone = 0;
    for (int i = 0; i < n;) {
        int64_t g = (p->order[s + i] / a->k) / group;
        int j = i + 1;
        while (j < n && (p->order[s + j] / a->k) / group == g) j++;
        if (j - i == 1) tmp[n_lone++] = p->order[s + i];
        else
            for (int q = i; q < j; q++) p->order[s + n_multi++] = p->order[s + q];
        i = j;
    }
    memcpy(p->order + s + n_multi, tmp, sizeof(int) * (size_t)n_lone);
    p->multi[e] = n_multi;
}

/* ib: 4 * E + 2 * A ints (the last A are scratch). */
static int moe_plan_build(const mg_moe_args *a, int *ib, moe_plan *p, mg_error *err) {
    const int E = a->n_experts;
    const int64_t A = a->n_tok * a->k, group = a->group > 0 ? a->group : a->n_tok;
    p->count = ib; p->start = ib + E; p->multi = ib + 2 * E; p->uid = ib + 3 * E; p->order = ib + 4 * E;
    int *fill = p->order + A; /* scratch: A ints */
    memset(p->count, 0, sizeof(int) * (size_t)E);
    for (int64_t i = 0; i < A; i++) {
        int e = a->ids[i];
        if (e < 0 || e >= E) return mg_fail(err, "internal: expert id %d out of range [0, %d) at layer %d", e, E, a->layer);
        p->count[e]++;
    }
    p->nu = 0;
    int64_t off = 0;
    for (int e = 0; e < E; e++) {
        p->start[e] = (int)off;
        off += p->count[e];
        if (p->count[e]) p->uid[p->nu++] = e;
    }
    memcpy(fill, p->start, sizeof(int) * (size_t)E);
    for (int64_t i = 0; i < A; i++) p->order[fill[a->ids[i]]++] = (int)i;
    for (int j = 0; j < p->nu; j++) moe_split_lone(a, p, p->uid[j], group, fill);
    return 0;
}

/* What one wave of expert computation needs: the routed experts are computed in waves (the
 * cached ones, then each missing one as its read lands), every expert writing only its own
 * rows of y, so how they are grouped into dispatches never changes a bit of the result.  A
 * group's gathered inputs and gate/up rows live only while it is computed: xl, g and u hold
 * rows_cap rows (moe_rows_cap), so a window's scratch grows by the outputs y alone, k rows of
 * d per token, not by k rows of d + 2 f more. */
typedef struct moe_wave_ctx {
    const mg_compute *c;
    const mg_moe_args *a;
    const moe_plan *p;
    const mg_expert *const *ex; /* member index (into p->uid) -> descriptor */
    int gather;                 /* 1: rows gathered into xl; 0: every row reads a->x (one token) */
    float *xl;                  /* [rows_cap, d] the group's gathered inputs */
    float *g, *u, *y;           /* g, u: [rows_cap, fmax] the group's; y: [A, d] every row's */
    int64_t fmax, rows_cap;
    float *sg, *su;             /* shared expert gate/up rows (NULL: none) */
    mg_linear_job *jobs;        /* room for moe_job_room() */
} moe_wave_ctx;

static int64_t moe_groups(const mg_moe_args *a) {
    const int64_t group = a->group > 0 ? a->group : a->n_tok;
    return (a->n_tok + group - 1) / group;
}

static int64_t moe_job_room(const mg_moe_args *a) {
    return 2 * ((int64_t)a->n_experts + a->n_tok * a->k + moe_groups(a)) + 2;
}

/* Appends W's products for expert e's rows: the batched part as one job, each lone row as its
 * own.  Its i-th row reads x + i * xs and writes y + i * ys. */
static int add_expert_jobs(mg_linear_job *jobs, int nj, const moe_plan *p, int e, const mg_matrix *w,
                           const float *x, int64_t xs, int64_t x_stride, float *y, int64_t ys, int64_t y_stride) {
    const int64_t m = p->multi[e];
    if (m) jobs[nj++] = (mg_linear_job){w, x, x_stride, y, y_stride, m};
    for (int64_t i = m; i < p->count[e]; i++) jobs[nj++] = (mg_linear_job){w, x + i * xs, x_stride, y + i * ys, y_stride, 1};
    return nj;
}

/* The shared expert's product W over each group of tokens (as many tokens per job as the
 * group had when it was its own chunk). */
static int add_shared_jobs(mg_linear_job *jobs, int nj, const mg_moe_args *a, const mg_matrix *w, const float *x,
                           int64_t x_stride, float *y, int64_t y_stride) {
    const int64_t T = a->n_tok, group = a->group > 0 ? a->group : T;
    for (int64_t t0 = 0; t0 < T; t0 += group)
        jobs[nj++] = (mg_linear_job){w, x + t0 * x_stride, x_stride, y + t0 * y_stride, y_stride,
                                     T - t0 < group ? T - t0 : group};
    return nj;
}

/* gate/up of the members sel[0..n) (and of the shared expert when with_shared) in one
 * dispatch, then swiglu, then their down projections in a second.  Their rows (at most
 * rows_cap) are gathered into xl and g/u in member order. */
static void moe_wave(const moe_wave_ctx *w, const int *sel, int n, int with_shared) {
    const mg_moe_args *a = w->a;
    const moe_plan *p = w->p;
    const int64_t T = a->n_tok, d = a->d, fmax = w->fmax;
    const mg_mlp *sh = with_shared ? a->shared : NULL;
    const int64_t fs = sh ? sh->gate.rows : 0;
    mg_linear_job *jobs = w->jobs;
    int nj = 0;
    int64_t l = 0; /* the member's first row in xl and g/u */
    for (int j = 0; j < n; j++) {
        const int i = sel[j], e = p->uid[i];
        const float *x = a->x;
        if (w->gather) {
            for (int64_t r = 0; r < p->count[e]; r++)
                memcpy(w->xl + (l + r) * d, a->x + (p->order[p->start[e] + r] / a->k) * d, sizeof(float) * (size_t)d);
            x = w->xl + l * d;
        }
        nj = add_expert_jobs(jobs, nj, p, e, &w->ex[i]->gate, x, w->gather ? d : 0, d, w->g + l * fmax, fmax, fmax);
        nj = add_expert_jobs(jobs, nj, p, e, &w->ex[i]->up, x, w->gather ? d : 0, d, w->u + l * fmax, fmax, fmax);
        l += p->count[e];
    }
    if (sh) {
        nj = add_shared_jobs(jobs, nj, a, &sh->gate, a->x, d, w->sg, fs);
        nj = add_shared_jobs(jobs, nj, a, &sh->up, a->x, d, w->su, fs);
    }
    if (!nj) return;
    mg_linear_jobs(w->c, nj, jobs);
    nj = 0;
    l = 0;
    for (int j = 0; j < n; j++) {
        const int i = sel[j], e = p->uid[i];
        const int64_t f = w->ex[i]->gate.rows;
        for (int64_t r = l; r < l + p->count[e]; r++)
            w->c->k->swiglu(w->g + r * fmax, w->g + r * fmax, w->u + r * fmax, f, a->limit);
        nj = add_expert_jobs(jobs, nj, p, e, &w->ex[i]->down, w->g + l * fmax, fmax, fmax, w->y + p->start[e] * d, d, d);
        l += p->count[e];
    }
    if (sh) {
        w->c->k->swiglu(w->sg, w->sg, w->su, T * fs, a->limit);
        nj = add_shared_jobs(jobs, nj, a, &sh->down, w->sg, fs, a->shared_out, d);
    }
    mg_linear_jobs(w->c, nj, jobs);
}

/* The end of the group of members sel[j0..) computed at once (and between two polls): at most
 * rows_cap rows (about one sub-chunk's assignments; at least one member). */
static int moe_group_end(const moe_wave_ctx *w, const int *sel, int j0, int n) {
    if (j0 >= n) return n;
    const int64_t budget = w->rows_cap;
    int64_t rows = w->p->count[w->p->uid[sel[j0]]];
    int j1 = j0 + 1;
    while (j1 < n && rows + w->p->count[w->p->uid[sel[j1]]] <= budget) rows += w->p->count[w->p->uid[sel[j1++]]];
    return j1;
}

/* Checks the shapes of members [i0, i1) (registered ones: readable before their bytes) and
 * returns their widest intermediate size, or -1 with err set. */
static int64_t moe_check_shapes(const mg_moe_args *a, const moe_plan *p, const mg_expert **ex, int i0, int i1,
                                mg_error *err) {
    int64_t fmax = 0;
    for (int i = i0; i < i1; i++) {
        const mg_expert *x = ex[i];
        if (x->gate.cols != a->d || x->up.rows != x->gate.rows || x->down.cols != x->gate.rows || x->down.rows != a->d) {
            mg_fail(err, "expert %d of layer %d has inconsistent shapes", p->uid[i], a->layer);
            return -1;
        }
        if (x->gate.rows > fmax) fmax = x->gate.rows;
    }
    return fmax;
}

/* Computes members sel[0..n) in groups of about one sub-chunk's assignments, the window's hook
 * polled between groups (and before the first when poll_first); the shared expert rides in
 * the first group (with_shared), which runs even when n is 0.  Returns 1 when cancelled. */
static int moe_compute_groups(const moe_wave_ctx *w, const int *sel, int n, int with_shared, int poll_first) {
    const mg_moe_args *a = w->a;
    int j0 = 0;
    do {
        const int j1 = moe_group_end(w, sel, j0, n);
        if ((j0 > 0 || poll_first) && mg_window_poll(a->poll, a->layer)) return 1;
        moe_wave(w, sel + j0, j1 - j0, with_shared && j0 == 0);
        j0 = j1;
    } while (j0 < n);
    return 0;
}

/* One fetch of members [i0, i1) (fetch_begin / fetch_poll / fetch_next, experts.h).  First
 * whatever is in memory when the reads are issued: the cached members, read-aheads that have
 * landed, and the shared expert (the first fetch's), all computed while the other reads run;
 * then each remaining member as it lands (the window's hook polled before each).  A member
 * whose read-ahead is still in flight counts as a hit in the store's statistics but is waited
 * for like a miss, never before the work that is ready.  The resident store has everything in
 * memory.  Every expert writes only its own rows, so the grouping changes no bit of the
 * result.  The store is told the time spent computing and the time spent waiting for reads
 * (its compute_seconds and wait_seconds: the split of a decoded token's time, with the dense
 * work the rest). */
static int moe_fetch_wave(moe_wave_ctx *w, mg_buffers *buf, int slot, const mg_expert **ex, int *sel, int i0,
                          int i1, int with_shared, mg_error *err) {
    const mg_moe_args *a = w->a;
    const int n = i1 - i0;
    double t = mg_wall_seconds(), waited = 0.0, computed = 0.0;
    if (mg_expert_store_fetch_begin_scored(a->store, a->layer, n, w->p->uid + i0, a->scores, ex + i0, err) != 0)
        return -1;
    const int64_t fmax = moe_check_shapes(a, w->p, ex, i0, i1, err);
    float *gu = fmax < 0 ? NULL : mg_buf(buf, slot, (size_t)(2 * w->rows_cap * fmax), err);
    if (!gu) {
        while (mg_expert_store_fetch_next(a->store, err) >= 0) {} /* close the batch */
        return -1;
    }
    w->g = gu;
    w->u = gu + w->rows_cap * fmax;
    w->fmax = fmax;
    int got = 0, r;
    while ((r = mg_expert_store_fetch_poll(a->store, err)) >= 0) sel[got++] = i0 + r;
    if (r == -2) return -1;
    double now = mg_wall_seconds();
    waited += now - t; /* issuing the reads, and any eviction that had to wait */
    /* A resident layer is one fetch of every expert: without the groups a cancel would wait
     * for all of it. */
    int cancelled = moe_compute_groups(w, sel, got, with_shared, 0);
    t = mg_wall_seconds();
    computed += t - now;
    while (!cancelled && r != -1 && (r = mg_expert_store_fetch_next(a->store, err)) >= 0) {
        int i = i0 + r;
        now = mg_wall_seconds();
        waited += now - t;
        cancelled = moe_compute_groups(w, &i, 1, 0, 1);
        t = mg_wall_seconds();
        computed += t - now;
    }
    if (cancelled) {
        /* Close the batch: reads already issued land in the cache (a later fetch may use them),
         * and the store never sees a batch left open by a cancel. */
        mg_error ignored;
        while (mg_expert_store_fetch_next(a->store, &ignored) >= 0) {}
        mg_expert_store_note_times(a->store, computed, waited);
        return MG_EVAL_CANCELLED;
    }
    waited += mg_wall_seconds() - t;
    mg_expert_store_note_times(a->store, computed, waited);
    return r == -2 ? -1 : 0;
}

/* Members fetched at once: every one when they fit the cache's slots (always, for one layer:
 * the plan keeps at least n_experts slots), else waves of `slots` (each expert still read once). */
static int moe_fetch_cap(const mg_expert_store *s, int nu) {
    const uint64_t slots = mg_expert_store_stats(s).slots;
    return slots && slots < (uint64_t)nu ? (int)slots : nu;
}

/* Rows a group of members holds at once (moe_group_end): one sub-chunk's assignments
 * (group * k; all of them without groups), or the most any one expert has. */
static int64_t moe_rows_cap(const mg_moe_args *a, const moe_plan *p) {
    const int64_t A = a->n_tok * a->k;
    int64_t cap = a->group > 0 && a->group * a->k < A ? a->group * a->k : A;
    for (int j = 0; j < p->nu; j++)
        if (p->count[p->uid[j]] > cap) cap = p->count[p->uid[j]];
    return cap;
}

int mg_moe_experts(const mg_compute *c, const mg_moe_args *a, mg_buffers *buf, int slot0,
                   mg_error *err) {
    const int E = a->n_experts;
    const int64_t T = a->n_tok, d = a->d, A = T * a->k; /* A: (token, choice) assignments */
    if (T == 0) return 0;
    int *ib = malloc(sizeof(int) * (size_t)(4 * E + 2 * A + E));
    const mg_expert **ex = malloc(sizeof(*ex) * (size_t)E);
    mg_linear_job *jobs = malloc(sizeof(*jobs) * (size_t)moe_job_room(a));
    int rc = -1;
    moe_plan p;
    if (!ib || !ex || !jobs) {
        mg_fail(err, "out of memory (moe bookkeeping)");
        goto done;
    }
    int *sel = ib + 4 * E + 2 * A;
    if (moe_plan_build(a, ib, &p, err)) goto done;
    /* One token whose experts are distinct reads x directly; otherwise rows are gathered. */
    const int gather = T > 1 || p.nu < A;
    const int64_t rows_cap = moe_rows_cap(a, &p);
    float *xl = gather ? mg_buf(buf, slot0, (size_t)(rows_cap * d), err) : NULL;
    if (gather && !xl) goto done;
    float *y = mg_buf(buf, slot0 + 2, (size_t)(A * d), err);
    if (!y) goto done;
    const mg_mlp *sh = a->shared;
    const int64_t fs = sh ? sh->gate.rows : 0;
    float *sg = NULL;
    if (sh) {
        if (sh->gate.cols != d || sh->up.rows != fs || sh->down.cols != fs || sh->down.rows != d || !a->shared_out) {
            mg_fail(err, "internal: shared expert of layer %d has inconsistent shapes", a->layer);
            goto done;
        }
        if (!(sg = mg_buf(buf, slot0 + 3, (size_t)(2 * T * fs), err))) goto done;
    }
    moe_wave_ctx w = {c, a, &p, ex, gather, xl, NULL, NULL, y, 0, rows_cap,
                      sg, sg ? sg + T * fs : NULL, jobs};
    const int cap = moe_fetch_cap(a->store, p.nu);
    for (int i0 = 0; i0 < p.nu; i0 += cap) {
        if (i0 > 0 && mg_window_poll(a->poll, a->layer)) {
            rc = MG_EVAL_CANCELLED;
            goto done;
        }
        const int wrc = moe_fetch_wave(&w, buf, slot0 + 1, ex, sel, i0, i0 + cap < p.nu ? i0 + cap : p.nu, i0 == 0, err);
        if (wrc) {
            rc = wrc;
            goto done;
        }
    }
    /* Scatter in expert order, so each token's sum runs in increasing expert id. */
    for (int64_t q = 0; q < A; q++) {
        int64_t t = p.order[q] / a->k;
        c->k->axpy(a->out + t * d, a->w[p.order[q]], y + q * d, d);
    }
    rc = 0;
done:
    free(ib);
    free(ex);
    free(jobs);
    return rc;
}

/* ---- 11. Layer-major prefill ------------------------------------------------------------ */

float *mg_window_head(const mg_window *w, int64_t c0, int64_t mc, int64_t *from) {
    const int64_t g = w->t0 + c0; /* the sub-chunk's offset in the call */
    const int last = g + mc == w->n;
    *from = mc;
    if (!w->logits) return NULL;
    if (!w->last_only) {
        *from = 0;
        return w->logits + g * w->vocab;
    }
    if (!last) return NULL;
    *from = mc - 1;
    return w->logits;
}

int mg_window_layer_done(const mg_window *w, int layer) {
    if (!w->hook || !w->hook->fn || w->hook->fn(w->hook->ctx, layer, w->n_layers, w->t0, w->m, 0) == 0) return 0;
    return layer + 1 == w->n_layers ? MG_WINDOW_CANCELLED_KEPT : MG_EVAL_CANCELLED;
}

int mg_window_poll(const mg_window *w, int layer) {
    if (!w || !w->hook || !w->hook->fn) return 0;
    return w->hook->fn(w->hook->ctx, layer, w->n_layers, w->t0, w->m, 1) ? MG_EVAL_CANCELLED : 0;
}

int mg_eval_windows(void *state, mg_window_fn fn, const mg_window *call, int64_t window, int64_t *done,
                    mg_error *err) {
    for (int64_t t0 = 0; t0 < call->n; t0 += window) {
        mg_window w = *call;
        w.t0 = t0;
        w.m = call->n - t0 < window ? call->n - t0 : window;
        w.tokens = call->tokens + t0;
        w.pos = call->pos + t0;
        int rc = fn(state, &w, err);
        if (rc) {
            *done = rc == MG_WINDOW_CANCELLED_KEPT ? t0 + w.m : t0;
            return rc == MG_WINDOW_CANCELLED_KEPT ? MG_EVAL_CANCELLED : rc;
        }
    }
    *done = call->n;
    return 0;
}

/* The window a prefill without a budget runs in: experts are mapped, so a window only saves
 * their decoding per chunk; 2048 tokens keep its scratch near 1 GB at DeepSeek-V4-Flash size. */
#define PREFILL_WINDOW_RESIDENT 2048
/* Under a budget the window may take this share of what would otherwise cache experts: a token
 * of window saves re-reading every expert for prompts longer than the window, a slot of cache
 * buys decode hits. */
#define PREFILL_WINDOW_SHARE 4

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* The window asked for (or the resident default), a multiple of the chunk, at most max_ctx
 * rounded up to one. */
static int64_t window_cap(const mg_arch_env *env, const mg_prefill_cost *pc, int64_t want) {
    const int64_t cap = round_up(env->max_ctx, pc->chunk);
    want = round_up(want > 0 ? want : pc->chunk, pc->chunk);
    return want < cap ? want : cap;
}

/* Plans the cache with a window of w tokens counted; *cache receives its bytes. */
static int plan_with_window(const mg_arch_env *env, const mg_expert_store *s, uint64_t other,
                            const mg_prefill_cost *pc, int64_t w, uint64_t *cache, mg_error *err) {
    return mg_expert_store_plan(s, env->ck, (uint64_t)(env->ram_gb * 1e9), other + pc->fixed_bytes + (uint64_t)w * pc->bytes_per_token,
                                cache, err);
}

int mg_expert_store_apply_budget(const mg_arch_env *env, mg_expert_store *s, const mg_weight_census *census,
                                 uint64_t extra_bytes, const mg_prefill_cost *pc, int64_t *window, mg_error *err) {
    *window = window_cap(env, pc, env->prefill_window > 0 ? env->prefill_window : PREFILL_WINDOW_RESIDENT);
    if (env->ram_gb <= 0) return 0;
    uint64_t bound = 0;
    for (int f = 0; f < MG_FORMAT_COUNT; f++) bound += census->bytes[f];
    uint64_t experts = mg_expert_store_expert_bytes(s);
    uint64_t other = (bound > experts ? bound - experts : 0) + extra_bytes;
    uint64_t cache = 0;
    if (env->prefill_window <= 0) {
        /* one chunk of window is the least; then a share of the cache that leaves, in chunks */
        if (plan_with_window(env, s, other, pc, pc->chunk, &cache, err)) return -1;
        const int64_t more = (int64_t)(cache / PREFILL_WINDOW_SHARE / (pc->bytes_per_token ? pc->bytes_per_token : 1));
        *window = window_cap(env, pc, pc->chunk + more / pc->chunk * pc->chunk);
    }
    mg_error ignored;
    if (plan_with_window(env, s, other, pc, *window, &cache, env->prefill_window > 0 ? err : &ignored)) {
        if (env->prefill_window > 0) return -1;
        *window = pc->chunk; /* the share left less than one layer's experts: the least window */
        if (plan_with_window(env, s, other, pc, *window, &cache, err)) return -1;
    }
    mg_expert_cache_opts opts;
    memset(&opts, 0, sizeof opts);
    return mg_expert_store_configure(s, env->ck, cache, &opts, err);
}
