/* LRU and predicted-next-use ranks, and victim selection by a bounded max-heap. */
#include "model/expert_policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/experts.h"

#define STICKY_DECAY 0.99 /* per fetch, for the stickiness sums */
/* The default bank of half-lives, in tokens (the first one serves until the errors differ). */
static const double BANK_TOKENS[MG_POLICY_MAX_MODELS] = {16, 8, 32, 64, 128};
#define ERR_HALF_LIFE_TOKENS 8.0 /* memory of the bank's prediction errors */
#define HINT_DECAY 0.98 /* per hint of a layer and rank: a memory of about 50 tokens */
#define HINT_PRIOR 0.5  /* a rank never measured counts as one hint, half right */

/* One estimate of the next-use model: f at one half-life, and its own stickiness. */
typedef struct nu_model {
    double life;                     /* half-life of f, in fetches */
    double alpha;                    /* weight of one visit in f (from the half-life) */
    double *f;                       /* [n_keys] moving share of its layer's visits requesting it */
    double reused, expected, trials; /* decayed stickiness sums */
    double w;                        /* stickiness estimate in [0, 1] */
    double err;                      /* decayed squared error of its visit predictions */
} nu_model;

struct mg_policy {
    int kind;
    int n_layers, n_experts, n_keys;
    uint64_t now;         /* fetch batches so far */
    int layer;            /* layer of the latest batch (-1: none yet) */
    double *last;         /* [n_keys] tick of the last request; -inf: never */
    unsigned char *used;  /* [n_keys] NEXT_USE: requested at its layer's latest visit */
    unsigned char *req;   /* [n_experts] scratch: requested by the current batch */
    unsigned char *hinted; /* [n_keys] NEXT_USE: 1 + rank in the hint for its layer's next visit; 0: none */
    double *hint_hit, *hint_n; /* [n_layers * MG_POLICY_HINT_RANKS] decayed: hints of that layer and
                                  rank that came true, hints given */
    int n_models, best;   /* NEXT_USE: the bank, and the model that ranks (lowest err) */
    double err_decay;     /* per fetch */
    nu_model m[MG_POLICY_MAX_MODELS];
};

size_t mg_policy_bytes_per_key(void) {
    return sizeof(double) * (1 + MG_POLICY_MAX_MODELS) + 2; /* last, f of each model, used, hinted */
}

mg_policy *mg_policy_create(int kind, int n_layers, int n_experts, double half_life, mg_error *err) {
    if (kind != MG_EXPERT_POLICY_LFRU && kind != MG_EXPERT_POLICY_LRU) {
        mg_fail(err, "expert cache: unknown policy %d", kind);
        return NULL;
    }
    if (n_layers <= 0 || n_experts <= 0 || !(half_life >= 0) || !isfinite(half_life)) {
        mg_fail(err, "expert cache: invalid policy size %d x %d or half-life %g", n_layers, n_experts, half_life);
        return NULL;
    }
    int n_keys = n_layers * n_experts;
    int n_models = kind == MG_EXPERT_POLICY_LRU ? 0 : half_life > 0 ? 1 : MG_POLICY_MAX_MODELS;
    mg_policy *p = calloc(1, sizeof *p);
    int ok = p != NULL;
    if (ok) {
        p->last = malloc(sizeof(double) * (size_t)n_keys);
        p->used = calloc((size_t)n_keys, 1);
        p->req = calloc((size_t)n_experts, 1);
        p->hinted = calloc((size_t)n_keys, 1);
        p->hint_hit = calloc((size_t)n_layers * MG_POLICY_HINT_RANKS, sizeof(double));
        p->hint_n = calloc((size_t)n_layers * MG_POLICY_HINT_RANKS, sizeof(double));
        ok = p->last && p->used && p->req && p->hinted && p->hint_hit && p->hint_n;
        p->n_models = n_models;
        for (int i = 0; i < n_models && ok; i++) ok = (p->m[i].f = calloc((size_t)n_keys, sizeof(double))) != NULL;
    }
    if (!ok) {
        mg_policy_free(p);
        mg_fail(err, "expert cache: out of memory (policy)");
        return NULL;
    }
    p->kind = kind;
    p->n_layers = n_layers;
    p->n_experts = n_experts;
    p->n_keys = n_keys;
    /* a half-life of h fetches = h / n_layers visits of a layer */
    for (int i = 0; i < n_models; i++) {
        double h = half_life > 0 ? half_life : BANK_TOKENS[i] * n_layers;
        p->m[i].life = h;
        p->m[i].alpha = 1.0 - exp2(-(double)n_layers / h);
    }
    p->err_decay = exp2(-1.0 / (ERR_HALF_LIFE_TOKENS * n_layers));
    p->layer = -1;
    for (int i = 0; i < n_keys; i++) p->last[i] = -INFINITY;
    return p;
}

void mg_policy_free(mg_policy *p) {
    if (!p) return;
    free(p->last);
    for (int i = 0; i < MG_POLICY_MAX_MODELS; i++) free(p->m[i].f);
    free(p->used);
    free(p->req);
    free(p->hinted);
    free(p->hint_hit);
    free(p->hint_n);
    free(p);
}

/* Probability that a visit of its layer requests the key, by one model. */
static double visit_prob(const nu_model *m, double f, int used) {
    return used ? f + m->w * (1.0 - f) : (1.0 - m->w) * f;
}

/* One model learns from the visit of `layer` (req[]): first the squared error of what it
 * predicted for this visit and the stickiness sums (against f and used of the previous visit),
 * then f moves on. */
static void model_update(mg_policy *p, nu_model *m, int layer, double err_decay) {
    const int E = p->n_experts, base = layer * E;
    const unsigned char *used = p->used + base;
    double *f = m->f + base;
    double sq = 0, reused = 0, expected = 0, trials = 0;
    for (int e = 0; e < E; e++) {
        double d = visit_prob(m, f[e], used[e]) - (p->req[e] ? 1.0 : 0.0);
        sq += d * d;
    }
    for (int e = 0; e < E; e++)
        if (used[e]) {
            trials += 1.0;
            expected += f[e];
            reused += p->req[e] ? 1.0 : 0.0;
        }
    m->err = m->err * err_decay + sq;
    m->reused = m->reused * STICKY_DECAY + reused;
    m->expected = m->expected * STICKY_DECAY + expected;
    m->trials = m->trials * STICKY_DECAY + trials;
    const double keep = 1.0 - m->alpha;
    for (int e = 0; e < E; e++) f[e] = p->req[e] ? f[e] * keep + m->alpha : f[e] * keep;
    double room = m->trials - m->expected;
    double w = room > 0 ? (m->reused - m->expected) / room : 0.0;
    m->w = w < 0 ? 0.0 : w > 1 ? 1.0 : w;
}

/* Every model of the bank learns from the visit; then used moves on and the model with the
 * lowest error (the first on ties) ranks from now on. */
static void next_use_update(mg_policy *p, int layer) {
    for (int i = 0; i < p->n_models; i++) model_update(p, &p->m[i], layer, p->err_decay);
    memcpy(p->used + (size_t)layer * p->n_experts, p->req, (size_t)p->n_experts);
    int best = 0;
    for (int i = 1; i < p->n_models; i++)
        if (p->m[i].err < p->m[best].err) best = i;
    p->best = best;
}

void mg_policy_request(mg_policy *p, int layer, int n, const int *keys) {
    if (layer < 0 || layer >= p->n_layers) return;
    p->now++;
    p->layer = layer;
    const int base = layer * p->n_experts;
    memset(p->req, 0, (size_t)p->n_experts);
    for (int i = 0; i < n; i++) {
        int key = keys[i];
        if (key < base || key >= base + p->n_experts) continue;
        p->last[key] = (double)p->now;
        p->req[key - base] = 1;
    }
    if (p->kind == MG_EXPERT_POLICY_LFRU) {
        /* how often each rank of this layer's hint came true; then the hint is spent */
        unsigned char *hinted = p->hinted + base;
        double h[MG_POLICY_HINT_RANKS] = {0}, g[MG_POLICY_HINT_RANKS] = {0};
        for (int e = 0; e < p->n_experts; e++)
            if (hinted[e]) {
                g[hinted[e] - 1] += 1.0;
                h[hinted[e] - 1] += p->req[e] ? 1.0 : 0.0;
                hinted[e] = 0;
            }
        double *hit = p->hint_hit + (size_t)layer * MG_POLICY_HINT_RANKS;
        double *given = p->hint_n + (size_t)layer * MG_POLICY_HINT_RANKS;
        for (int r = 0; r < MG_POLICY_HINT_RANKS; r++)
            if (g[r] > 0) {
                hit[r] = hit[r] * HINT_DECAY + h[r];
                given[r] = given[r] * HINT_DECAY + g[r];
            }
        next_use_update(p, layer);
    }
}

void mg_policy_hint(mg_policy *p, int layer, int n, const int *keys) {
    if (p->kind != MG_EXPERT_POLICY_LFRU || layer < 0 || layer >= p->n_layers) return;
    const int base = layer * p->n_experts;
    memset(p->hinted + base, 0, (size_t)p->n_experts);
    for (int i = n - 1; i >= 0; i--) /* backwards: a repeated key keeps its best rank */
        if (keys[i] >= base && keys[i] < base + p->n_experts)
            p->hinted[keys[i]] = (unsigned char)(1 + (i < MG_POLICY_HINT_RANKS ? i : MG_POLICY_HINT_RANKS - 1));
}

double mg_policy_hint_accuracy(const mg_policy *p, int key) {
    if (p->kind != MG_EXPERT_POLICY_LFRU || key < 0 || key >= p->n_keys || !p->hinted[key]) return 0.0;
    size_t i = (size_t)(key / p->n_experts) * MG_POLICY_HINT_RANKS + (p->hinted[key] - 1);
    return (p->hint_hit[i] + HINT_PRIOR) / (p->hint_n[i] + 1.0);
}

void mg_policy_seed(mg_policy *p, const float *counts, const float *visits) {
    if (p->kind != MG_EXPERT_POLICY_LFRU || !counts) return;
    const int E = p->n_experts;
    for (int l = 0; l < p->n_layers; l++) {
        double top = 0;
        for (int e = 0; e < E; e++) {
            double c = counts[l * E + e];
            if (isfinite(c) && c > top) top = c;
        }
        /* the share of the layer's visits that requested the expert, what f estimates; a
         * history without visits: relative to the most requested expert (an overestimate) */
        double v = visits ? visits[l] : 0;
        double per = isfinite(v) && v >= top && v > 0 ? v : top;
        if (!(per > 0)) continue;
        for (int e = 0; e < E; e++) {
            double c = counts[l * E + e];
            if (isfinite(c) && c > 0)
                for (int i = 0; i < p->n_models; i++) p->m[i].f[l * E + e] = c / per;
        }
    }
}

/* NEXT_USE: predicted fetches until key is requested again (+inf: no estimate). */
static double next_use(const mg_policy *p, int key) {
    const nu_model *m = &p->m[p->best];
    double prob = visit_prob(m, m->f[key], p->used[key]);
    if (p->hinted[key]) {
        double h = mg_policy_hint_accuracy(p, key);
        if (h > prob) prob = h;
    }
    if (!(prob > 0)) return INFINITY;
    const int L = p->n_layers;
    int delta = p->layer < 0 ? L : ((key / p->n_experts - p->layer) % L + L) % L;
    if (delta == 0) delta = L;
    return (double)delta + (double)L * (1.0 / prob - 1.0);
}

double mg_policy_half_life(const mg_policy *p) {
    if (p->kind != MG_EXPERT_POLICY_LFRU) return 0;
    return p->m[p->best].life;
}

double mg_policy_score(const mg_policy *p, int key) {
    if (key < 0 || key >= p->n_keys) return -INFINITY;
    if (p->kind == MG_EXPERT_POLICY_LRU) return p->last[key];
    return -next_use(p, key);
}

int mg_policy_recent(const mg_policy *p, int key) {
    if (key < 0 || key >= p->n_keys) return 0;
    if (p->kind == MG_EXPERT_POLICY_LRU) return p->last[key] >= (double)p->now;
    return p->used[key];
}

/* Eviction rank of a slot as (tier, value): lower evicted first.  Empty slots come first;
 * then the policy's score (LRU: last request; NEXT_USE: minus the predicted next use). */
static void slot_rank(const mg_policy *p, const int *slot_key, int i, double *tier, double *value) {
    int key = slot_key[i];
    if (key < 0) {
        *tier = -INFINITY;
        *value = 0;
    } else {
        *tier = 0;
        *value = mg_policy_score(p, key);
    }
}

/* (tier, value, slot) order: a before b when it should be evicted first. */
static int evict_before(const mg_policy *p, const int *slot_key, int a, int b) {
    double ta, va, tb, vb;
    slot_rank(p, slot_key, a, &ta, &va);
    slot_rank(p, slot_key, b, &tb, &vb);
    if (ta != tb) return ta < tb;
    if (va != vb) return va < vb;
    return a < b;
}

/* heap[0] is the candidate evicted last among those kept (max of the order). */
static void sift_down(const mg_policy *p, const int *slot_key, int *heap, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && evict_before(p, slot_key, heap[top], heap[l])) top = l;
        if (r < n && evict_before(p, slot_key, heap[top], heap[r])) top = r;
        if (top == i) return;
        int t = heap[i];
        heap[i] = heap[top];
        heap[top] = t;
        i = top;
    }
}

static void sift_up(const mg_policy *p, const int *slot_key, int *heap, int i) {
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!evict_before(p, slot_key, heap[parent], heap[i])) return;
        int t = heap[i];
        heap[i] = heap[parent];
        heap[parent] = t;
        i = parent;
    }
}

/* The m lowest eligible slots (pinned_pass: only pinned ones, else only unpinned ones),
 * written in eviction order; returns the count. */
static int select_pass(const mg_policy *p, const int *slot_key, int n_slots, const uint32_t *mark,
                       uint32_t epoch, const unsigned char *pinned, int pinned_pass, int m,
                       int *out, int *heap) {
    int n = 0;
    for (int i = 0; i < n_slots; i++) {
        if (mark && mark[i] == epoch) continue;
        int is_pinned = pinned && slot_key[i] >= 0 && pinned[slot_key[i]];
        if (is_pinned != pinned_pass) continue;
        if (n < m) {
            heap[n] = i;
            sift_up(p, slot_key, heap, n++);
        } else if (evict_before(p, slot_key, i, heap[0])) {
            heap[0] = i;
            sift_down(p, slot_key, heap, n, 0);
        }
    }
    /* heap sort: pop the max to the back */
    for (int k = n; k > 0; k--) {
        out[k - 1] = heap[0];
        heap[0] = heap[k - 1];
        sift_down(p, slot_key, heap, k - 1, 0);
    }
    return n;
}

int mg_policy_victims(const mg_policy *p, const int *slot_key, int n_slots, const uint32_t *mark,
                      uint32_t epoch, const unsigned char *pinned, int allow_pinned, int m,
                      int *out, int *scratch) {
    if (m <= 0) return 0;
    int got = select_pass(p, slot_key, n_slots, mark, epoch, pinned, 0, m, out, scratch);
    if (got < m && pinned && allow_pinned)
        got += select_pass(p, slot_key, n_slots, mark, epoch, pinned, 1, m - got, out + got, scratch);
    return got;
}
