/* Attention over the KV cache (model/blocks.c, mg_attention): a prefill's tokens go in blocks
 * that read each block of cached rows once for all of them, and the result must be bit for bit
 * that of one token at a time (each token alone, as a decode step computes it).  Checked on
 * every table this CPU runs, 1-3 workers, fp32 and bf16 caches, head groups of 1, 3 and 8 query
 * heads (and a slice count that does not divide them), key and value widths that differ and are
 * not multiples of a vector, token counts inside one block and across several, a cache already
 * holding positions (pos0 > 0), sliding windows shorter and longer than the prompt, attention
 * sinks, and a context long enough that the blocks shrink to bound the score rows.  Also against
 * a double-precision softmax attention (|err| <= 1e-5 * sum_j p_j |v_j| + 1e-6), and the output
 * row's gaps stay untouched. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "core/threadpool.h"
#include "model/blocks.h"
#include "check.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float rnd_sym(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

typedef struct {
    int n_heads, n_kv, qk_dim, v_dim;
    int64_t n_tok, pos0, window;
    mg_kv_type kv;
    int sinks;
} shape;

/* The rows of position j of a cache of type t, floats: in place or converted. */
static double cache_at(mg_kv_type t, const void *base, int64_t off) {
    if (t == MG_KV_F32) return ((const float *)base)[off];
    float f;
    mg_kv_bf16_to_f32((const uint16_t *)base + off, &f, 1);
    return f;
}

/* One shape on one table and pool: blocked against one token at a time (bits) and against the
 * double-precision reference. */
static void check_shape(const mg_compute *c, const shape *sh) {
    const int64_t span = sh->pos0 + sh->n_tok, ks = (int64_t)sh->n_kv * sh->qk_dim, vs = (int64_t)sh->n_kv * sh->v_dim;
    const int64_t qs = (int64_t)sh->n_heads * sh->qk_dim + 3, os = (int64_t)sh->n_heads * sh->v_dim + 5;
    const size_t es = mg_kv_type_bytes(sh->kv);
    void *k = malloc((size_t)(span * ks) * es), *v = malloc((size_t)(span * vs) * es);
    float *row = malloc(sizeof(float) * (size_t)(ks > vs ? ks : vs));
    for (int64_t p = 0; p < span; p++) {
        for (int64_t i = 0; i < ks; i++) row[i] = 2.0f * rnd_sym();
        mg_kv_put(sh->kv, k, p * ks, row, ks);
        for (int64_t i = 0; i < vs; i++) row[i] = rnd_sym();
        mg_kv_put(sh->kv, v, p * vs, row, vs);
    }
    float *q = malloc(sizeof(float) * (size_t)(sh->n_tok * qs)), sinks[64];
    for (int64_t i = 0; i < sh->n_tok * qs; i++) q[i] = rnd_sym();
    for (int h = 0; h < sh->n_heads; h++) sinks[h] = 2.0f * rnd_sym();
    float *out = malloc(sizeof(float) * (size_t)(sh->n_tok * os)), *one = malloc(sizeof(float) * (size_t)(sh->n_tok * os));
    for (int64_t i = 0; i < sh->n_tok * os; i++) out[i] = one[i] = 12345.0f; /* the gaps must keep it */

    mg_attn_args a = {
        .q = q, .q_stride = qs, .k = k, .k_stride = ks, .v = v, .v_stride = vs, .out = out, .out_stride = os,
        .n_tok = sh->n_tok, .pos0 = sh->pos0, .window = sh->window, .n_heads = sh->n_heads, .n_kv = sh->n_kv,
        .qk_dim = sh->qk_dim, .v_dim = sh->v_dim, .scale = 1.0f / sqrtf((float)sh->qk_dim),
        .sinks = sh->sinks ? sinks : NULL, .kv_type = sh->kv,
    };
    float *scratch = malloc(sizeof(float) * mg_attention_scratch(c, &a));
    mg_attention(c, &a, scratch);
    free(scratch);
    for (int64_t t = 0; t < sh->n_tok; t++) { /* each token alone, as a decode step */
        mg_attn_args b = a;
        b.q = q + t * qs, b.out = one + t * os, b.n_tok = 1, b.pos0 = sh->pos0 + t;
        float *s1 = malloc(sizeof(float) * mg_attention_scratch(c, &b));
        mg_attention(c, &b, s1);
        free(s1);
    }
    CHECK(!memcmp(out, one, sizeof(float) * (size_t)(sh->n_tok * os)),
          "%s, %d workers: blocked = one token at a time (heads %d/%d, dims %d/%d, %lld tokens at %lld, window %lld, "
          "kv %s, sinks %d)",
          c->k->name, mg_pool_threads(c->pool), sh->n_heads, sh->n_kv, sh->qk_dim, sh->v_dim, (long long)sh->n_tok,
          (long long)sh->pos0, (long long)sh->window, mg_kv_type_name(sh->kv), sh->sinks);

    int ok = 1, gaps = 1;
    double *p = malloc(sizeof(double) * (size_t)span);
    for (int64_t t = 0; t < sh->n_tok; t++) {
        const int64_t pos = sh->pos0 + t;
        const int64_t lo = sh->window > 0 && pos - sh->window + 1 > 0 ? pos - sh->window + 1 : 0;
        for (int h = 0; h < sh->n_heads; h++) {
            const int g = h / (sh->n_heads / sh->n_kv);
            double mx = sh->sinks ? sinks[h] : -INFINITY, sum = 0;
            for (int64_t j = lo; j <= pos; j++) {
                double d = 0;
                for (int c2 = 0; c2 < sh->qk_dim; c2++)
                    d += (double)q[t * qs + h * sh->qk_dim + c2] * cache_at(sh->kv, k, j * ks + g * sh->qk_dim + c2);
                p[j] = d * a.scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = lo; j <= pos; j++) sum += p[j] = exp(p[j] - mx);
            if (sh->sinks) sum += exp(sinks[h] - mx);
            for (int c2 = 0; c2 < sh->v_dim; c2++) {
                double want = 0, mag = 0;
                for (int64_t j = lo; j <= pos; j++) {
                    const double vj = cache_at(sh->kv, v, j * vs + g * sh->v_dim + c2);
                    want += p[j] / sum * vj, mag += p[j] / sum * fabs(vj);
                }
                ok &= fabs(out[t * os + h * sh->v_dim + c2] - want) <= 1e-5 * mag + 1e-6;
            }
        }
        for (int64_t c2 = (int64_t)sh->n_heads * sh->v_dim; c2 < os; c2++) gaps &= out[t * os + c2] == 12345.0f;
    }
    CHECK(ok, "%s: against double precision (heads %d/%d, %lld tokens at %lld, window %lld, kv %s)", c->k->name,
          sh->n_heads, sh->n_kv, (long long)sh->n_tok, (long long)sh->pos0, (long long)sh->window,
          mg_kv_type_name(sh->kv));
    CHECK(gaps, "%s: the output rows' gaps untouched", c->k->name);
    free(p), free(k), free(v), free(row), free(q), free(out), free(one);
}

int main(void) {
    const mg_kernels *tables[4];
    int n = 0;
    tables[n++] = mg_kernels_scalar();
    const char *simd[] = {"avx2", "avx512", "neon"};
    for (int i = 0; i < 3; i++)
        if (mg_kernels_named(simd[i])) tables[n++] = mg_kernels_named(simd[i]);
    static const shape shapes[] = {
        /* heads, kv, qk, v, tokens, pos0, window, kv type, sinks */
        {8, 4, 64, 64, 40, 0, 0, MG_KV_F32, 0},   {8, 4, 64, 64, 17, 37, 0, MG_KV_BF16, 0},
        {6, 2, 40, 24, 16, 5, 0, MG_KV_F32, 1},   {3, 3, 17, 33, 5, 70, 0, MG_KV_BF16, 1},
        {8, 1, 32, 32, 33, 3, 7, MG_KV_F32, 1},   {8, 1, 32, 32, 21, 60, 50, MG_KV_BF16, 0},
        {16, 2, 128, 128, 1, 90, 0, MG_KV_F32, 0}, {16, 2, 128, 128, 2, 0, 0, MG_KV_BF16, 0},
    };
    for (int ti = 0; ti < n; ti++)
        for (int w = 1; w <= 3; w++) {
            mg_error err = {0};
            mg_pool *pool = mg_pool_create(w, &err);
            CHECK(pool != NULL, "pool: %s", err.msg);
            if (!pool) continue;
            const mg_compute c = {pool, tables[ti], NULL, 0};
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) check_shape(&c, &shapes[si]);
            mg_pool_destroy(pool);
        }
    /* a context long enough that a block of 16 tokens' score rows would pass the bound: the
     * blocks shrink (8 heads x 36000 positions: 14 tokens), on the fastest table */
    mg_error err = {0};
    mg_pool *pool = mg_pool_create(2, &err);
    if (pool) {
        const mg_compute c = {pool, tables[n - 1], NULL, 0};
        const shape long_ctx = {8, 1, 16, 16, 30, 36000, 0, MG_KV_BF16, 0};
        check_shape(&c, &long_ctx);
        mg_pool_destroy(pool);
    }
    printf("test_attention: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
