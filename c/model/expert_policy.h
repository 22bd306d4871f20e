/* Replacement policies for the expert cache.
 *
 * A policy keeps its statistics per expert key (layer * n_experts + expert), also for experts
 * not in the cache, so that history survives eviction.  The victim is always the cached
 * expert ranked lowest; an empty slot ranks below everything.
 *   LRU       rank = the tick of the last request (one tick per fetch batch).
 *   NEXT_USE  (MG_EXPERT_POLICY_LFRU, the default kind) evicts the expert whose next request
 *             is predicted furthest away, an online approximation of Belady's optimum built
 *             on how decode walks the model: every token visits layers 0..L-1 in order, so
 *             an expert of layer m is next wanted at the next visit of m (delta fetches from
 *             the current layer l: (m - l) mod L, L for l itself) or one of the visits after.
 *             With p the probability that a visit of m requests it, the predicted distance is
 *                 delta + L * (1/p - 1)           (geometric number of missed visits)
 *             and the largest is evicted first (p = 0: never, or long ago: first).
 *             p mixes two estimates, per key:  f, the share of m's visits that requested it
 *             (exponential moving average over visits), and whether the last visit of m
 *             requested it (routing is sticky from one token to the next), weighted by w, the
 *             measured stickiness: p = f + w (1 - f) after a request at the last visit,
 *             (1 - w) f otherwise (a two-state Markov model).  w is estimated online from how
 *             often last visit's experts come back beyond what f predicts:
 *             w = (reused - expected) / (trials - expected), clamped to [0, 1], sums decayed by
 *             0.99 per fetch.  At a cache of one layer's experts LRU only keeps last token's
 *             routing; this keeps the experts likely to be asked for next.
 *             How fast f should forget depends on the run: routing that drifts wants a short
 *             half-life, steady routing a long one (less noise in the ranking).  By default a
 *             bank of models runs side by side, f at half-lives of 16, 8, 32, 64 and 128 tokens
 *             (each with its own w), each scored on every visit by the squared error of the
 *             p it predicted for each expert of the layer (decayed, half-life 8 tokens); the
 *             model with the lowest error ranks (the first on ties, 16 tokens at the start).
 *             An explicit half-life runs that one model alone.
 * tools/routing_trace.py replays the same rules (and Belady's optimum) in Python, to the bit:
 * change both together. */
#ifndef MG_EXPERT_POLICY_H
#define MG_EXPERT_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

typedef struct mg_policy mg_policy;

#define MG_POLICY_MAX_MODELS 5 /* NEXT_USE: models in the default bank */
#define MG_POLICY_HINT_RANKS 16 /* NEXT_USE: hint ranks measured apart */

/* kind: MG_EXPERT_POLICY_* (experts.h).  half_life in fetches (NEXT_USE only): > 0 runs that
 * one model, 0 the default bank. */
mg_policy *mg_policy_create(int kind, int n_layers, int n_experts, double half_life, mg_error *err);
void mg_policy_free(mg_policy *p);

/* Bytes the policy keeps per key (at most), for the budget plan. */
size_t mg_policy_bytes_per_key(void);
/* A fetch batch of `layer` requested keys[0..n) (full keys; repeats count once). */
void mg_policy_request(mg_policy *p, int layer, int n, const int *keys);
/* NEXT_USE: keys[0..n) of `layer`, best first, are predicted for that layer's next visit (the
 * layer's router applied one layer early, see experts.h).  Until that visit a hinted key's
 * request probability is at least its hint accuracy; the visit then scores the hint (per
 * layer and rank, decayed by HINT_DECAY per hint) and spends it.  A new hint for the layer
 * replaces the old.  LRU: ignored.  Without hints the ranks are exactly as described above. */
void mg_policy_hint(mg_policy *p, int layer, int n, const int *keys);
/* A hinted key's measured accuracy: (hits + 1/2) / (hints + 1) of its layer and rank (ranks
 * from MG_POLICY_HINT_RANKS - 1 on share one count); 0 when the key is not hinted. */
double mg_policy_hint_accuracy(const mg_policy *p, int key);
/* Seeds the statistics from request counts of earlier runs (counts[n_keys], >= 0) and the
 * number of visits of each layer they came from (visits[n_layers], may be NULL): each key's f
 * becomes its count over its layer's visits (over the largest count of its layer when visits
 * are unknown, 0, or fewer than that count).  NEXT_USE only. */
void mg_policy_seed(mg_policy *p, const float *counts, const float *visits);
/* NEXT_USE: the half-life (fetches) of the model that ranks now; 0 for LRU. */
double mg_policy_half_life(const mg_policy *p);
/* How much the policy wants to keep key now (higher: keep); -inf when it knows nothing of it. */
double mg_policy_score(const mg_policy *p, int key);
/* 1 when key was requested at the latest visit of its layer (LRU: by the latest batch). */
int mg_policy_recent(const mg_policy *p, int key);

/* Chooses up to m victims among n_slots slots (slot_key[i] < 0: empty) and writes their slot
 * indices to out[] in eviction order (lowest rank first, ties to the lower slot index).
 * Slots with mark[i] == epoch are never chosen (the open batch, reads in flight); slots whose
 * key is pinned (pinned[key] != 0, pinned may be NULL) only when nothing else is left, unless
 * allow_pinned is 0.  scratch holds m ints.  Returns how many were found (< m only when too
 * few slots are eligible).  O(n_slots log m). */
int mg_policy_victims(const mg_policy *p, const int *slot_key, int n_slots, const uint32_t *mark,
                      uint32_t epoch, const unsigned char *pinned, int allow_pinned, int m,
                      int *out, int *scratch);

#endif
