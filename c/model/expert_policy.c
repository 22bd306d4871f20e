/* LRU and frequency-with-aging scores, and victim selection by a bounded max-heap. */
#include "model/expert_policy.h"

#include <math.h>
#include <stdlib.h>

#include "model/experts.h"

struct mg_policy {
    int kind;
    int n_keys;
    double inv_half_life; /* 1 / H */
    double window;        /* LFRU: requests this recent (in ticks) are in the protected tier */
    uint64_t now;
    double *score;        /* [n_keys]; -inf: never requested */
    double *last;         /* [n_keys] tick of the last request; -inf: never */
};

mg_policy *mg_policy_create(int kind, int n_keys, double half_life, double window, mg_error *err) {
    if (kind != MG_EXPERT_POLICY_LFRU && kind != MG_EXPERT_POLICY_LRU) {
        mg_fail(err, "expert cache: unknown policy %d", kind);
        return NULL;
    }
    if (n_keys <= 0 || !(half_life > 0) || !isfinite(half_life)) {
        mg_fail(err, "expert cache: invalid policy size %d or half-life %g", n_keys, half_life);
        return NULL;
    }
    mg_policy *p = calloc(1, sizeof *p);
    if (p) {
        p->score = malloc(sizeof(double) * (size_t)n_keys);
        p->last = malloc(sizeof(double) * (size_t)n_keys);
    }
    if (!p || !p->score || !p->last) {
        mg_policy_free(p);
        mg_fail(err, "expert cache: out of memory (policy)");
        return NULL;
    }
    p->kind = kind;
    p->n_keys = n_keys;
    p->inv_half_life = 1.0 / half_life;
    p->window = window > 0 ? window : 0;
    for (int i = 0; i < n_keys; i++) p->score[i] = p->last[i] = -INFINITY;
    return p;
}

void mg_policy_free(mg_policy *p) {
    if (!p) return;
    free(p->score);
    free(p->last);
    free(p);
}

void mg_policy_tick(mg_policy *p) { p->now++; }

/* v = t/H + log2(2^(v_old - t/H) + w): w more requests at time t on top of the decayed past. */
static void add_requests(mg_policy *p, int key, double w) {
    double t = (double)p->now * p->inv_half_life;
    double old = p->score[key];
    double past = old == -INFINITY ? 0.0 : exp2(old - t);
    p->score[key] = t + log2(past + w);
}

void mg_policy_touch(mg_policy *p, int key) {
    if (key < 0 || key >= p->n_keys) return;
    p->last[key] = (double)p->now;
    if (p->kind == MG_EXPERT_POLICY_LRU) p->score[key] = (double)p->now;
    else add_requests(p, key, 1.0);
}

void mg_policy_seed(mg_policy *p, int key, double count) {
    if (key < 0 || key >= p->n_keys || !(count > 0) || !isfinite(count)) return;
    if (p->kind == MG_EXPERT_POLICY_LFRU) add_requests(p, key, count);
}

double mg_policy_score(const mg_policy *p, int key) {
    return key >= 0 && key < p->n_keys ? p->score[key] : -INFINITY;
}

int mg_policy_recent(const mg_policy *p, int key) {
    if (key < 0 || key >= p->n_keys) return 0;
    double window = p->kind == MG_EXPERT_POLICY_LFRU ? p->window : 1.0;
    return p->last[key] > (double)p->now - window;
}

/* Eviction rank of a slot as (tier, value): lower evicted first.  Empty slots come first;
 * LRU ranks by last request; LFRU puts experts requested within the window in a protected
 * tier ranked by recency, and the rest below it, ranked by decayed frequency. */
static void slot_rank(const mg_policy *p, const int *slot_key, int i, double *tier, double *value) {
    int key = slot_key[i];
    if (key < 0) {
        *tier = -INFINITY;
        *value = 0;
    } else if (p->kind == MG_EXPERT_POLICY_LRU) {
        *tier = p->last[key];
        *value = 0;
    } else {
        int recent = p->last[key] > (double)p->now - p->window;
        *tier = recent;
        *value = recent ? p->last[key] : p->score[key];
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
