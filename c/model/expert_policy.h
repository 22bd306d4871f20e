/* Replacement policies for the expert cache.
 *
 * A policy keeps one score per expert key (layer * n_experts + expert), also for experts not
 * in the cache, so that history survives eviction.  The victim is always the cached expert
 * with the lowest score; an empty slot scores -inf.  Both policies reduce to that rule:
 *   LRU   score = the clock value of the last request (one tick per fetch batch).
 *   LFRU  two tiers.  Experts requested within the last `window` ticks (one token by default)
 *         are protected and ranked by recency, as in LRU; the others are ranked by the log2 of
 *         an exponentially decayed request count and are evicted first.  That count is stored
 *         time-shifted, v = now/H + log2(count(now)), so scores never need rescaling: aging is
 *         implicit and the order of two stored scores does not change as time passes.
 *         A request at time t sets v = t/H + log2(2^(v_old - t/H) + 1).
 * (On synthetic decode traces plain LFU lost to LRU at one token's worth of slots; the
 * recency tier makes LFRU match LRU there and beat it at larger caches.)
 * tools/routing_trace.py replays the same two rules (and Belady's optimum) in Python. */
#ifndef MG_EXPERT_POLICY_H
#define MG_EXPERT_POLICY_H

#include <stdint.h>
#include "core/status.h"

typedef struct mg_policy mg_policy;

/* kind: MG_EXPERT_POLICY_* (experts.h).  half_life (> 0) and window in ticks (LFRU only). */
mg_policy *mg_policy_create(int kind, int n_keys, double half_life, double window, mg_error *err);
void mg_policy_free(mg_policy *p);

void mg_policy_tick(mg_policy *p);                     /* a new fetch batch starts */
void mg_policy_touch(mg_policy *p, int key);           /* key was requested (hit or miss) */
void mg_policy_seed(mg_policy *p, int key, double count); /* as if requested `count` times now */
double mg_policy_score(const mg_policy *p, int key);
/* 1 when key was requested within the window (LFRU's protected tier; LRU: within one tick). */
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
