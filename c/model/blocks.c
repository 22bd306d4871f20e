/* Shared building blocks of the decoder forward passes (see blocks.h for the map). */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
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
    int heads_per_item; /* bf16: query heads one work item covers (a slice of one kv group) */
    int items_per_group;
} attn_job;

static void attn_one(const mg_attn_args *a, const mg_kernels *kern, int64_t t, int h, float *s) {
    int64_t pos = a->pos0 + t;
    int64_t lo = 0;
    if (a->window > 0 && pos - a->window + 1 > 0) lo = pos - a->window + 1;
    int g = h / (a->n_heads / a->n_kv);
    const float *q = a->q + t * a->q_stride + (int64_t)h * a->qk_dim;
    const float *K = a->k, *V = a->v;
    int64_t n = pos - lo + 1;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const float *kr = K + (lo + j) * a->k_stride + (int64_t)g * a->qk_dim;
        s[j] = kern->dot(q, kr, a->qk_dim) * a->scale;
        if (s[j] > mx) mx = s[j];
    }
    float sink = a->sinks ? a->sinks[h] : -INFINITY;
    if (sink > mx) mx = sink;
    float sum = a->sinks ? expf(sink - mx) : 0.0f;
    for (int64_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    float *o = a->out + t * a->out_stride + (int64_t)h * a->v_dim;
    memset(o, 0, sizeof(float) * (size_t)a->v_dim);
    for (int64_t j = 0; j < n; j++) {
        const float *vr = V + (lo + j) * a->v_stride + (int64_t)g * a->v_dim;
        kern->axpy(o, s[j] * inv, vr, a->v_dim);
    }
}

/* bf16 K/V: query heads [h0, h1) of kv group g for token t.  s: (h1 - h0) score rows of
 * pos0 + n_tok floats, then KV_BLOCK converted rows.  Per head the operations (dot of the
 * converted key, softmax, axpy of the converted value in position order) are attn_one's. */
static void attn_group_bf16(const mg_attn_args *a, const mg_kernels *kern, int64_t t, int g, int h0, int h1,
                            float *s, int64_t s_row) {
    const int64_t pos = a->pos0 + t;
    const int64_t lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0, n = pos - lo + 1;
    const uint16_t *K = a->k, *V = a->v;
    const int nh = h1 - h0, dk = a->qk_dim, dv = a->v_dim;
    float *rows = s + (int64_t)nh * s_row;
    for (int64_t j0 = 0; j0 < n; j0 += KV_BLOCK) {
        const int64_t nb = n - j0 < KV_BLOCK ? n - j0 : KV_BLOCK;
        for (int64_t j = 0; j < nb; j++)
            mg_kv_bf16_to_f32(K + (lo + j0 + j) * a->k_stride + (int64_t)g * dk, rows + j * dk, dk);
        for (int i = 0; i < nh; i++) {
            const float *q = a->q + t * a->q_stride + (int64_t)(h0 + i) * dk;
            float *si = s + i * s_row + j0;
            for (int64_t j = 0; j < nb; j++) si[j] = kern->dot(q, rows + j * dk, dk) * a->scale;
        }
    }
    for (int i = 0; i < nh; i++) {
        float *si = s + i * s_row;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = si[j] > mx ? si[j] : mx;
        float sink = a->sinks ? a->sinks[h0 + i] : -INFINITY;
        if (sink > mx) mx = sink;
        float sum = a->sinks ? expf(sink - mx) : 0.0f;
        for (int64_t j = 0; j < n; j++) {
            si[j] = expf(si[j] - mx);
            sum += si[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) si[j] *= inv;
        memset(a->out + t * a->out_stride + (int64_t)(h0 + i) * dv, 0, sizeof(float) * (size_t)dv);
    }
    for (int64_t j0 = 0; j0 < n; j0 += KV_BLOCK) {
        const int64_t nb = n - j0 < KV_BLOCK ? n - j0 : KV_BLOCK;
        for (int64_t j = 0; j < nb; j++)
            mg_kv_bf16_to_f32(V + (lo + j0 + j) * a->v_stride + (int64_t)g * dv, rows + j * dv, dv);
        for (int i = 0; i < nh; i++) {
            float *o = a->out + t * a->out_stride + (int64_t)(h0 + i) * dv;
            const float *si = s + i * s_row + j0;
            for (int64_t j = 0; j < nb; j++) kern->axpy(o, si[j], rows + j * dv, dv);
        }
    }
}

static void attn_task(void *ctx, int worker, int n_workers) {
    const attn_job *job = ctx;
    const mg_attn_args *a = job->a;
    int64_t begin, end;
    float *s = job->scratch + (int64_t)worker * job->per_worker;
    if (a->kv_type == MG_KV_F32) {
        mg_split_range(a->n_tok * a->n_heads, 1, worker, n_workers, &begin, &end);
        for (int64_t i = begin; i < end; i++) attn_one(a, job->k, i / a->n_heads, (int)(i % a->n_heads), s);
        return;
    }
    const int hpg = a->n_heads / a->n_kv, per = job->items_per_group;
    mg_split_range(a->n_tok * a->n_kv * per, 1, worker, n_workers, &begin, &end);
    for (int64_t i = begin; i < end; i++) {
        const int64_t t = i / ((int64_t)a->n_kv * per);
        const int g = (int)(i / per % a->n_kv), b = (int)(i % per);
        const int h0 = g * hpg + b * job->heads_per_item;
        const int h1 = h0 + job->heads_per_item < (g + 1) * hpg ? h0 + job->heads_per_item : (g + 1) * hpg;
        if (h0 < h1) attn_group_bf16(a, job->k, t, g, h0, h1, s, a->pos0 + a->n_tok);
    }
}

/* bf16 work items: each kv group's heads are cut into slices so that there are at least as
 * many (token, group, slice) items as workers (decode with few kv heads still uses them all). */
static attn_job attn_plan(const mg_compute *c, const mg_attn_args *a, float *scratch) {
    attn_job job = {a, c->k, scratch, a->pos0 + a->n_tok, 1, 1};
    if (a->kv_type == MG_KV_F32) return job;
    const int threads = mg_pool_threads(c->pool), hpg = a->n_heads / a->n_kv;
    const int64_t groups = a->n_tok * a->n_kv;
    int per = groups >= threads ? 1 : (int)((threads + groups - 1) / groups);
    if (per > hpg) per = hpg;
    job.heads_per_item = (hpg + per - 1) / per;
    job.items_per_group = (hpg + job.heads_per_item - 1) / job.heads_per_item;
    const int64_t dmax = a->qk_dim > a->v_dim ? a->qk_dim : a->v_dim;
    job.per_worker = (int64_t)job.heads_per_item * (a->pos0 + a->n_tok) + KV_BLOCK * dmax;
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
    int n;
    const mg_linear_job *jobs;
    int64_t total_cost;
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
                jc->k->linear[j->w->format](j->w, j->x, j->x_stride, j->n_tok, j->y, j->y_stride, r0, r1);
        }
        base += cost;
    }
}

void mg_linear_jobs(const mg_compute *c, int n_jobs, const mg_linear_job *jobs) {
    jobs_ctx jc = {c->k, n_jobs, jobs, 0};
    for (int i = 0; i < n_jobs; i++) jc.total_cost += jobs[i].w->rows * row_cost(&jobs[i]);
    if (jc.total_cost == 0) return;
    if (c->traffic) {
        uint64_t bytes = 0;
        for (int i = 0; i < n_jobs; i++) bytes += jobs[i].n_tok > 0 ? mg_matrix_bytes(jobs[i].w) : 0;
        mg_traffic_add(c, bytes);
    }
    mg_pool_run(c->pool, jobs_task, &jc);
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

/* What one wave of expert computation needs: the routed experts are computed in waves (the
 * cached ones, then each missing one as its read lands), every expert writing only its own
 * rows of g/u/y, so how they are grouped into dispatches never changes a bit of the result. */
typedef struct moe_wave_ctx {
    const mg_compute *c;
    const mg_moe_args *a;
    const mg_expert *const *ex; /* batch index -> descriptor */
    const int *uid, *start, *count;
    const float *xg;            /* gathered rows (n_tok > 1) */
    float *g, *u, *y;
    int64_t fmax;
    float *sg, *su;             /* shared expert gate/up rows (NULL: none) */
    mg_linear_job *jobs;        /* room for 2 * n_experts + 2 */
} moe_wave_ctx;

/* gate/up of the batch members sel[0..n) (and of the shared expert when with_shared) in one
 * dispatch, then swiglu, then their down projections in a second. */
static void moe_wave(const moe_wave_ctx *w, const int *sel, int n, int with_shared) {
    const mg_moe_args *a = w->a;
    const int64_t T = a->n_tok, d = a->d, fmax = w->fmax;
    const mg_mlp *sh = with_shared ? a->shared : NULL;
    const int64_t fs = sh ? sh->gate.rows : 0;
    mg_linear_job *jobs = w->jobs;
    int nj = 0;
    for (int j = 0; j < n; j++) {
        int i = sel[j], e = w->uid[i];
        const float *xin = T > 1 ? w->xg + (int64_t)w->start[e] * d : a->x;
        jobs[nj++] = (mg_linear_job){&w->ex[i]->gate, xin, d, w->g + (int64_t)w->start[e] * fmax, fmax, w->count[e]};
        jobs[nj++] = (mg_linear_job){&w->ex[i]->up, xin, d, w->u + (int64_t)w->start[e] * fmax, fmax, w->count[e]};
    }
    if (sh) {
        jobs[nj++] = (mg_linear_job){&sh->gate, a->x, d, w->sg, fs, T};
        jobs[nj++] = (mg_linear_job){&sh->up, a->x, d, w->su, fs, T};
    }
    if (!nj) return;
    mg_linear_jobs(w->c, nj, jobs);
    nj = 0;
    for (int j = 0; j < n; j++) {
        int i = sel[j], e = w->uid[i];
        int64_t f = w->ex[i]->gate.rows;
        for (int64_t r = w->start[e]; r < w->start[e] + w->count[e]; r++)
            w->c->k->swiglu(w->g + r * fmax, w->g + r * fmax, w->u + r * fmax, f, a->limit);
        jobs[nj++] = (mg_linear_job){&w->ex[i]->down, w->g + (int64_t)w->start[e] * fmax, fmax,
                                     w->y + (int64_t)w->start[e] * d, d, w->count[e]};
    }
    if (sh) {
        w->c->k->swiglu(w->sg, w->sg, w->su, T * fs, a->limit);
        jobs[nj++] = (mg_linear_job){&sh->down, w->sg, fs, a->shared_out, d, T};
    }
    mg_linear_jobs(w->c, nj, jobs);
}

int mg_moe_experts(const mg_compute *c, const mg_moe_args *a, mg_buffers *buf, int slot0,
                   mg_error *err) {
    const int E = a->n_experts, K = a->k;
    const int64_t T = a->n_tok, d = a->d, A = T * K; /* A: (token, choice) assignments */
    if (T == 0) return 0;
    /* Integer bookkeeping lives in one int buffer: count[E] | start[E] | uid[E] | sel[E] | order[A]. */
    int *ib = malloc(sizeof(int) * (size_t)(4 * E + A));
    const mg_expert **ex = malloc(sizeof(*ex) * (size_t)E);
    mg_linear_job *jobs = malloc(sizeof(*jobs) * (size_t)(2 * E + 2));
    if (!ib || !ex || !jobs) {
        free(ib); free(ex); free(jobs);
        return mg_fail(err, "out of memory (moe bookkeeping)");
    }
    int *count = ib, *start = ib + E, *uid = ib + 2 * E, *sel = ib + 3 * E, *order = ib + 4 * E;
    memset(count, 0, sizeof(int) * (size_t)E);
    for (int64_t i = 0; i < A; i++) {
        int e = a->ids[i];
        if (e < 0 || e >= E) {
            free(ib); free(ex); free(jobs);
            return mg_fail(err, "internal: expert id %d out of range [0, %d) at layer %d", e, E, a->layer);
        }
        count[e]++;
    }
    int nu = 0;
    int64_t off = 0;
    for (int e = 0; e < E; e++) {
        start[e] = (int)off;
        off += count[e];
        if (count[e]) uid[nu++] = e;
    }
    /* order: assignments grouped by expert (ascending id), tokens ascending within a group */
    {
        int *fill = malloc(sizeof(int) * (size_t)E);
        if (!fill) {
            free(ib); free(ex); free(jobs);
            return mg_fail(err, "out of memory (moe bookkeeping)");
        }
        memcpy(fill, start, sizeof(int) * (size_t)E);
        for (int64_t i = 0; i < A; i++) order[fill[a->ids[i]]++] = (int)i;
        free(fill);
    }
    int rc = -1;
    /* The fetch is split (experts.h): the cached experts are computed while the missing ones
     * are read.  How many are cached is this batch's miss count (the store's statistics); the
     * resident store never misses. */
    mg_expert_stats before = mg_expert_store_stats(a->store);
    if (mg_expert_store_fetch_begin_scored(a->store, a->layer, nu, uid, a->scores, ex, err) != 0) goto done;
    int n_now = nu;
    if (before.slots) {
        uint64_t missed = mg_expert_store_stats(a->store).misses - before.misses;
        n_now = missed < (uint64_t)nu ? nu - (int)missed : 0;
    }
    int64_t fmax = 0;
    for (int i = 0; i < nu; i++) { /* shapes are the registered ones: readable before the bytes */
        const mg_expert *x = ex[i];
        if (x->gate.cols != d || x->up.rows != x->gate.rows || x->down.cols != x->gate.rows ||
            x->down.rows != d) {
            mg_fail(err, "expert %d of layer %d has inconsistent shapes", uid[i], a->layer);
            goto done;
        }
        if (x->gate.rows > fmax) fmax = x->gate.rows;
    }
    /* Decode with one token: every expert reads x directly, no gather. */
    float *xg = NULL;
    if (T > 1) {
        if (!(xg = mg_buf(buf, slot0, (size_t)(A * d), err))) goto done;
        for (int64_t i = 0; i < A; i++) memcpy(xg + i * d, a->x + (order[i] / K) * d, sizeof(float) * (size_t)d);
    }
    float *gu = mg_buf(buf, slot0 + 1, (size_t)(2 * A * fmax), err);
    float *y = gu ? mg_buf(buf, slot0 + 2, (size_t)(A * d), err) : NULL;
    if (!gu || !y) goto done;
    /* The shared expert's gate/up (all tokens) join the first wave's routed ones: one dispatch,
     * not two (and it is computed while the misses are read). */
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
    moe_wave_ctx w = {c, a, ex, uid, start, count, xg, gu, gu + A * fmax, y, fmax,
                      sg, sg ? sg + T * fs : NULL, jobs};
    /* Wave 1: what is in memory now (everything, for the resident store or an all-hit batch:
     * then the two dispatches are the whole layer). */
    int got = 0, r = 0;
    while (got < n_now && (r = mg_expert_store_fetch_next(a->store, err)) >= 0) sel[got++] = r;
    if (r == -2) goto done;
    moe_wave(&w, sel, got, 1);
    /* Then each missing expert as its read lands, while the others are still being read. */
    while ((r = mg_expert_store_fetch_next(a->store, err)) >= 0) moe_wave(&w, &r, 1, 0);
    if (r == -2) goto done;
    /* Scatter in expert order, so each token's sum runs in increasing expert id. */
    for (int64_t q = 0; q < A; q++) {
        int64_t t = order[q] / K;
        c->k->axpy(a->out + t * d, a->w[order[q]], y + q * d, d);
    }
    rc = 0;
done:
    free(ib);
    free(ex);
    free(jobs);
    return rc;
}

/* The cache-mode entry points of experts.h may not be linked in yet (written concurrently);
 * weak references keep the store resident until they are. */
extern int mg_expert_store_plan(const mg_expert_store *s, const mg_checkpoint *ck, uint64_t ram_bytes,
                                uint64_t other_bytes, uint64_t *cache_bytes, mg_error *err)
    __attribute__((weak));
extern int mg_expert_store_configure(mg_expert_store *s, const mg_checkpoint *ck, uint64_t cache_bytes,
                                     const mg_expert_cache_opts *opts, mg_error *err) __attribute__((weak));
extern uint64_t mg_expert_store_expert_bytes(const mg_expert_store *s) __attribute__((weak));

int mg_expert_store_apply_budget(const mg_arch_env *env, mg_expert_store *s,
                                 const mg_weight_census *census, uint64_t extra_bytes, mg_error *err) {
    if (env->ram_gb <= 0) return 0;
    if (!mg_expert_store_plan || !mg_expert_store_configure || !mg_expert_store_expert_bytes) return 0;
    uint64_t bound = 0;
    for (int f = 0; f < MG_FORMAT_COUNT; f++) bound += census->bytes[f];
    uint64_t experts = mg_expert_store_expert_bytes(s);
    uint64_t other = (bound > experts ? bound - experts : 0) + extra_bytes;
    uint64_t cache = 0;
    mg_expert_cache_opts opts;
    memset(&opts, 0, sizeof opts);
    if (mg_expert_store_plan(s, env->ck, (uint64_t)(env->ram_gb * 1e9), other, &cache, err)) return -1;
    return mg_expert_store_configure(s, env->ck, cache, &opts, err);
}
