/* Tests for the budgeted expert store (cache mode), its replacement policies, routing trace,
 * usage history, and read errors.  Checkpoints are written into a fresh mkdtemp() folder in
 * the real safetensors layout (BF16, FP8 + fp32 block scales, FP4 + e8m0 scales, two shards);
 * every cached expert is compared byte for byte with the resident (mapped) one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/matrix.h"
#include "io/safetensors.h"
#include "model/expert_policy.h"
#include "model/experts.h"
#include "model/weights.h"
#include "check.h"

static char g_root[256];


/* ---- a deterministic generator (no global state) --------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- writing a checkpoint ----------------------------------------------------------- */

typedef struct tspec {
    char name[96];
    const char *dtype;
    int64_t r, c;   /* 2-D shape */
    size_t esize;
} tspec;

typedef struct ckspec {
    tspec t[256];
    int n;
} ckspec;

static void add(ckspec *k, const char *dtype, size_t esize, int64_t r, int64_t c, const char *fmt, int a, int b,
                const char *suffix) {
    tspec *t = &k->t[k->n++];
    snprintf(t->name, sizeof t->name, fmt, a, b, suffix);
    t->dtype = dtype;
    t->r = r;
    t->c = c;
    t->esize = esize;
}

static void write_shard(const char *dir, const char *file, const ckspec *k, uint64_t *seed) {
    size_t cap = 64 + (size_t)k->n * 200, n = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
    n += (size_t)snprintf(h + n, cap - n, "{");
    for (int i = 0; i < k->n; i++) {
        const tspec *t = &k->t[i];
        uint64_t bytes = (uint64_t)t->r * (uint64_t)t->c * t->esize;
        n += (size_t)snprintf(h + n, cap - n, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                              "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t->name, t->dtype,
                              (long long)t->r, (long long)t->c, (unsigned long long)off,
                              (unsigned long long)(off + bytes));
        off += bytes;
    }
    n += (size_t)snprintf(h + n, cap - n, "}");
    while (n % 8) h[n++] = ' ';
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    uint64_t hl = n;
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, n, f);
    unsigned char buf[4096];
    for (uint64_t w = 0; w < off; w += sizeof buf) {
        for (size_t j = 0; j < sizeof buf; j += 8) {
            uint64_t v = rng_next(seed);
            memcpy(buf + j, &v, 8);
        }
        size_t m = off - w < sizeof buf ? (size_t)(off - w) : sizeof buf;
        fwrite(buf, 1, m, f);
    }
    fclose(f);
    free(h);
}

#define L 3
#define E 8
#define D 64
#define F 32
#define P "model.layers.%d.mlp.experts.%d.%s"

/* Shard A: layer 0 BF16 (with big fillers between experts, so reads split), layer 1 FP8 with
 * fp32 block scales (expert 7: a BF16 scale, converted at load, so it stays outside the
 * cache).  Shard B: layer 2 FP4 with e8m0 group scales, tensors in a scrambled order. */
static void write_small_checkpoint(const char *dir) {
    mkdir(dir, 0700);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    ckspec *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    for (int e = 0; e < E; e++) {
        add(a, "BF16", 2, F, D, P, 0, e, "gate_proj.weight");
        add(a, "BF16", 2, F, D, P, 0, e, "up_proj.weight");
        if (e % 3 == 0) add(a, "F32", 4, 200, 100, "filler.%d.%d%s", 0, e, ""); /* 80 KB gap */
        add(a, "BF16", 2, D, F, P, 0, e, "down_proj.weight");
    }
    for (int e = 0; e < E; e++) {
        const char *names[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
        for (int m = 0; m < 3; m++) {
            int64_t r = m == 2 ? D : F, c = m == 2 ? F : D;
            add(a, "F8_E4M3", 1, r, c, P, 1, e, names[m]);
            char sname[64];
            snprintf(sname, sizeof sname, "%s_scale_inv", names[m]);
            if (e == 7) add(a, "BF16", 2, 1, 1, P, 1, e, sname);
            else add(a, "F32", 4, 1, 1, P, 1, e, sname);
        }
    }
    for (int e = E - 1; e >= 0; e--) {
        add(b, "U8", 1, D, F / 2, P, 2, e, "w2.weight");
        add(b, "F8_E8M0", 1, F, D / 32, P, 2, e, "w1.scale");
        add(b, "U8", 1, F, D / 2, P, 2, e, "w1.weight");
        add(b, "F8_E8M0", 1, D, F / 32, P, 2, e, "w2.scale");
        add(b, "U8", 1, F, D / 2, P, 2, e, "w3.weight");
        add(b, "F8_E8M0", 1, F, D / 32, P, 2, e, "w3.scale");
    }
    write_shard(dir, "a.safetensors", a, &seed);
    write_shard(dir, "b.safetensors", b, &seed);
    free(a);
    free(b);
}

static int bind_all(const mg_checkpoint *ck, mg_expert_store *s, mg_error *err) {
    char n[3][160];
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            mg_expert x;
            if (l < 2) {
                snprintf(n[0], sizeof n[0], P, l, e, "gate_proj.weight");
                snprintf(n[1], sizeof n[1], P, l, e, "up_proj.weight");
                snprintf(n[2], sizeof n[2], P, l, e, "down_proj.weight");
            } else {
                snprintf(n[0], sizeof n[0], P, l, e, "w1.weight");
                snprintf(n[1], sizeof n[1], P, l, e, "w3.weight");
                snprintf(n[2], sizeof n[2], P, l, e, "w2.weight");
            }
            if (mg_bind_matrix(ck, n[0], F, D, &x.gate, err) || mg_bind_matrix(ck, n[1], F, D, &x.up, err) ||
                mg_bind_matrix(ck, n[2], D, F, &x.down, err))
                return -1;
            mg_expert_store_set(s, l, e, &x);
        }
    return 0;
}

static size_t scale_bytes(const mg_matrix *m) {
    return mg_matrix_bytes(m) - (size_t)m->rows * mg_matrix_row_bytes(m);
}

static int same_matrix(const mg_matrix *a, const mg_matrix *b) {
    if (a->rows != b->rows || a->cols != b->cols || a->format != b->format || a->scale_kind != b->scale_kind ||
        a->scale_cols != b->scale_cols || (!a->scale) != (!b->scale))
        return 0;
    if (memcmp(a->data, b->data, (size_t)a->rows * mg_matrix_row_bytes(a))) return 0;
    return !a->scale || !memcmp(a->scale, b->scale, scale_bytes(a));
}

static int same_expert(const mg_expert *a, const mg_expert *b) {
    return same_matrix(&a->gate, &b->gate) && same_matrix(&a->up, &b->up) && same_matrix(&a->down, &b->down);
}

/* Random batches (skewed popularity, like routing) checked byte for byte. */
static void run_random(mg_expert_store *res, mg_expert_store *cache, int n_fetch, uint64_t seed, int use_next,
                       uint64_t *requests, int *distinct) {
    mg_error err = {{0}};
    unsigned char seen[L * E] = {0};
    for (int f = 0; f < n_fetch; f++) {
        int layer = (int)(rng_next(&seed) % L);
        int n = (rng_next(&seed) % 8) == 0 ? 1 + (int)(rng_next(&seed) % E) : 2;
        int ids[E], used[E] = {0}, k = 0;
        while (k < n) {
            /* expert e with weight ~ 1 / (e + 1) */
            int e = (int)(rng_next(&seed) % E);
            if (rng_next(&seed) % (uint64_t)(e + 1)) e = (int)(rng_next(&seed) % 3);
            if (used[e]) continue;
            used[e] = 1;
            ids[k++] = e;
            if (!seen[layer * E + e]++) (*distinct)++;
        }
        *requests += (uint64_t)n;
        const mg_expert *want[E], *got[E];
        CHECK(mg_expert_store_fetch(res, layer, n, ids, want, &err) == 0, "%s", err.msg);
        if (!use_next) {
            if (mg_expert_store_fetch(cache, layer, n, ids, got, &err)) {
                CHECK(0, "fetch %d: %s", f, err.msg);
                return;
            }
            for (int i = 0; i < n; i++)
                CHECK(same_expert(want[i], got[i]), "fetch %d layer %d expert %d differs", f, layer, ids[i]);
        } else {
            CHECK(mg_expert_store_fetch_begin(cache, layer, n, ids, got, &err) == 0, "%s", err.msg);
            int returned[E] = {0}, i, count = 0;
            while ((i = mg_expert_store_fetch_next(cache, &err)) >= 0) {
                CHECK(i < n && !returned[i], "index %d handed out twice or out of range", i);
                if (i >= n || returned[i]) break;
                returned[i] = 1;
                count++;
                CHECK(same_expert(want[i], got[i]), "fetch %d layer %d expert %d differs", f, layer, ids[i]);
            }
            CHECK(i == -1 && count == n, "batch ended with %d after %d of %d: %s", i, count, n, err.msg);
        }
    }
}

static void test_bitwise(const char *dir) {
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    mg_expert_store *res = mg_expert_store_create(L, E, &err);
    CHECK(res && !bind_all(ck, res, &err), "%s", err.msg);
    uint64_t slot = mg_expert_store_slot_bytes(res, ck, &err);
    CHECK(slot > 0 && slot % 4096 == 0, "slot %llu: %s", (unsigned long long)slot, err.msg);
    CHECK(mg_expert_store_expert_bytes(res) > 0, "expert bytes");
    int slot_counts[] = {E, E + 3, 2 * E, L * E, L * E + 5};
    for (int si = 0; si < 5; si++)
        for (int pol = 0; pol < 2; pol++)
            for (int mode = 0; mode < 2; mode++) {
                mg_expert_store *c = mg_expert_store_create(L, E, &err);
                CHECK(c && !bind_all(ck, c, &err), "%s", err.msg);
                mg_expert_cache_opts o = {.policy = pol, .buffered_only = mode, .io_threads = 1 + si % 3};
                int rc = mg_expert_store_configure(c, ck, slot * (uint64_t)slot_counts[si] + 100, &o, &err);
                CHECK(rc == 0, "configure %d slots: %s", slot_counts[si], err.msg);
                if (rc) {
                    mg_expert_store_free(c);
                    continue;
                }
                uint64_t requests = 0;
                int distinct = 0;
                run_random(res, c, 150, 1234 + (uint64_t)si * 7 + (uint64_t)pol, (si + pol + mode) % 2, &requests,
                           &distinct);
                mg_expert_stats st = mg_expert_store_stats(c);
                uint64_t want_slots = slot_counts[si] < L * E ? (uint64_t)slot_counts[si] : L * E;
                CHECK(st.slots == want_slots && st.slot_bytes == slot, "slots %llu", (unsigned long long)st.slots);
                CHECK(st.fetches == 150 && st.hits + st.misses == requests, "counters %llu+%llu vs %llu",
                      (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)requests);
                CHECK(st.misses >= (uint64_t)distinct && st.bytes_read >= st.misses * 1000, "misses %llu bytes %llu",
                      (unsigned long long)st.misses, (unsigned long long)st.bytes_read);
                CHECK(st.read_seconds > 0 && st.direct_reads + st.buffered_reads > 0, "read time");
                if (mode == 1) CHECK(st.direct_reads == 0, "buffered_only used O_DIRECT");
                if (slot_counts[si] >= L * E)
                    CHECK(st.misses == (uint64_t)distinct && st.evictions == 0, "a full cache reads each once: %llu vs %d",
                          (unsigned long long)st.misses, distinct);
                else
                    CHECK(st.evictions > 0, "a small cache evicts");
                mg_expert_store_free(c);
            }
    /* too small a cache is an error that says what one layer needs */
    mg_expert_store *c = mg_expert_store_create(L, E, &err);
    bind_all(ck, c, &err);
    CHECK(mg_expert_store_configure(c, ck, slot * (E - 1), NULL, &err) == -1 && strstr(err.msg, "one layer's 8 experts"),
          "%s", err.msg);
    /* the plan: from a RAM budget, with the minimum in the message */
    uint64_t cache = 0;
    CHECK(mg_expert_store_plan(c, ck, 1000000, 0, &cache, &err) == -1 && strstr(err.msg, "too small") &&
              strstr(err.msg, "the minimum is"), "%s", err.msg);
    CHECK(mg_expert_store_plan(c, ck, (uint64_t)64 << 30, (uint64_t)1 << 30, &cache, &err) == 0 &&
              cache == slot * L * E, "plan caps at the pool: %llu: %s", (unsigned long long)cache, err.msg);
    /* a batch larger than the slots is refused, not overrun */
    CHECK(mg_expert_store_configure(c, ck, slot * E, NULL, &err) == 0, "%s", err.msg);
    int all[E + 1] = {0, 1, 2, 3, 4, 5, 6, 7};
    const mg_expert *out[E + 1];
    CHECK(mg_expert_store_fetch(c, 0, E, all, out, &err) == 0, "%s", err.msg);
    CHECK(mg_expert_store_fetch(c, 1, 9, all, out, &err) == -1, "duplicate/oversize batch");
    mg_expert_store_free(c);
    mg_expert_store_free(res);
    mg_checkpoint_close(ck);
}

/* Reads that fail (file truncated after open) are errors naming the tensor and the file; the
 * store stays usable for experts that can still be read. */
static void test_truncated(const char *dir) {
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    mg_expert_store *c = mg_expert_store_create(L, E, &err);
    CHECK(!bind_all(ck, c, &err), "%s", err.msg);
    uint64_t slot = mg_expert_store_slot_bytes(c, ck, &err);
    /* LRU, so that two other layers' fetches surely evict layer 2's experts below (the
     * default policy would keep them: layer 2 is the next one the cycle visits) */
    mg_expert_cache_opts lru = {.policy = MG_EXPERT_POLICY_LRU};
    CHECK(mg_expert_store_configure(c, ck, slot * 2 * E, &lru, &err) == 0, "%s", err.msg);
    char path[600];
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    /* first a batch of five failing reads, then the bytes come back: the store must read them
     * again (a failed batch leaves no read in flight and no slot that pretends to hold them) */
    FILE *bf = fopen(path, "rb");
    static unsigned char original[1 << 20];
    size_t original_n = bf ? fread(original, 1, sizeof original, bf) : 0;
    if (bf) fclose(bf);
    CHECK(original_n > 4096 && original_n < sizeof original, "read b.safetensors: %zu", original_n);
    mg_expert_store *res = mg_expert_store_create(L, E, &err);
    CHECK(!bind_all(ck, res, &err), "%s", err.msg);
    int five[5] = {1, 3, 4, 6, 7};
    const mg_expert *got5[5], *want5[5];
    CHECK(mg_expert_store_fetch(res, 2, 5, five, want5, &err) == 0, "%s", err.msg);
    for (int round = 0; round < 2; round++) {
        CHECK(truncate(path, 4096) == 0, "truncate");
        CHECK(mg_expert_store_fetch(c, 2, 5, five, got5, &err) == -1, "read of a truncated file succeeded");
        int fd = open(path, O_WRONLY);
        CHECK(fd >= 0 && pwrite(fd, original + 4096, original_n - 4096, 4096) == (ssize_t)(original_n - 4096),
              "restore");
        if (fd >= 0) close(fd);
        err.msg[0] = 0;
        CHECK(mg_expert_store_fetch(c, 2, 5, five, got5, &err) == 0, "round %d after restore: %s", round, err.msg);
        for (int i = 0; i < 5; i++)
            CHECK(same_expert(got5[i], want5[i]), "round %d expert %d differs after restore", round, five[i]);
        /* a second round with those now cached: evict them with other layers' experts */
        int others[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        const mg_expert *got8[8];
        CHECK(mg_expert_store_fetch(c, 0, 8, others, got8, &err) == 0, "%s", err.msg);
        CHECK(mg_expert_store_fetch(c, 1, 8, others, got8, &err) == 0, "%s", err.msg);
    }
    mg_expert_store_free(res);
    CHECK(truncate(path, 4096) == 0, "truncate");
    int ids[2] = {5, 2};
    const mg_expert *out[8];
    err.msg[0] = 0;
    CHECK(mg_expert_store_fetch(c, 2, 2, ids, out, &err) == -1, "read of a truncated file succeeded");
    CHECK(strstr(err.msg, "model.layers.2.mlp.experts.") && strstr(err.msg, "b.safetensors") &&
              strstr(err.msg, "truncated"), "message: %s", err.msg);
    /* the rest still works, and the failed experts were not left behind as cached */
    CHECK(mg_expert_store_fetch(c, 0, 2, ids, out, &err) == 0, "%s", err.msg);
    CHECK(mg_expert_store_fetch(c, 2, 2, ids, out, &err) == -1, "failed expert cached");
    int r;
    CHECK(mg_expert_store_fetch_begin(c, 2, 1, ids, out, &err) == 0, "%s", err.msg);
    while ((r = mg_expert_store_fetch_next(c, &err)) >= 0) {}
    CHECK(r == -2 && strstr(err.msg, "b.safetensors"), "next: %d %s", r, err.msg);
    mg_expert_store_free(c);
    mg_checkpoint_close(ck);
}

static void request1(mg_policy *p, int layer, int key) { mg_policy_request(p, layer, 1, &key); }

static void test_policy(void) {
    mg_error err = {{0}};
    CHECK(mg_policy_create(7, 1, 4, 1, &err) == NULL && strstr(err.msg, "unknown policy"), "%s", err.msg);
    int slot_key[4] = {0, 1, 2, 3}, out[4], heap[4];
    uint32_t mark[4] = {0};
    /* LRU: requests 0,1,2,3 then 0 again: victims 1, 2 */
    mg_policy *p = mg_policy_create(MG_EXPERT_POLICY_LRU, 1, 8, 1, &err);
    for (int k = 0; k < 4; k++) request1(p, 0, k);
    request1(p, 0, 0);
    CHECK(mg_policy_victims(p, slot_key, 4, mark, 1, NULL, 1, 2, out, heap) == 2 && out[0] == 1 && out[1] == 2,
          "lru %d %d", out[0], out[1]);
    mark[1] = 5; /* in the open batch */
    CHECK(mg_policy_victims(p, slot_key, 4, mark, 5, NULL, 1, 1, out, heap) == 1 && out[0] == 2, "marked %d", out[0]);
    mark[1] = 0;
    int with_empty[4] = {0, -1, 2, 3};
    CHECK(mg_policy_victims(p, with_empty, 4, mark, 1, NULL, 1, 1, out, heap) == 1 && out[0] == 1, "empty first");
    mg_policy_free(p);

    /* NEXT_USE, one layer of 8: a key requested often survives a burst of one-off requests;
     * aging lets it go once it is no longer asked for */
    p = mg_policy_create(MG_EXPERT_POLICY_LFRU, 1, 8, 4, &err);
    CHECK(p != NULL, "%s", err.msg);
    for (int t = 0; t < 6; t++) request1(p, 0, 0);
    for (int k = 1; k < 4; k++) request1(p, 0, k);
    CHECK(mg_policy_victims(p, slot_key, 4, mark, 1, NULL, 1, 1, out, heap) == 1 && out[0] == 1,
          "next-use keeps the frequent key: %d", out[0]);
    for (int t = 0; t < 40; t++) request1(p, 0, 1 + t % 3);
    CHECK(mg_policy_victims(p, slot_key, 4, mark, 1, NULL, 1, 1, out, heap) == 1 && out[0] == 0,
          "next-use ages the old key out: %d", out[0]);
    CHECK(mg_policy_score(p, 6) == -INFINITY, "never requested: nothing known");
    float counts[8] = {0, 0, 0, 0, 0, 1000, 0, 0};
    mg_policy_seed(p, counts, NULL);
    CHECK(mg_policy_score(p, 5) > mg_policy_score(p, 1), "seeded history counts");
    {
        /* with the visits they came from, counts become rates: 10 and 5 of 20 visits -> f 0.5
         * and 0.25 (nothing learned yet: p = f, predicted distance 1 + (1/p - 1) fetches);
         * without, relative to the top count (1 and 0.5) */
        mg_policy *q = mg_policy_create(MG_EXPERT_POLICY_LFRU, 1, 8, 0, &err);
        float c2[8] = {10, 5, 0, 0, 0, 0, 0, 0}, v2[1] = {20};
        mg_policy_seed(q, c2, v2);
        CHECK(mg_policy_score(q, 0) == -2.0 && mg_policy_score(q, 1) == -4.0, "rates %g %g",
              mg_policy_score(q, 0), mg_policy_score(q, 1));
        mg_policy_free(q);
        q = mg_policy_create(MG_EXPERT_POLICY_LFRU, 1, 8, 0, &err);
        mg_policy_seed(q, c2, NULL);
        CHECK(mg_policy_score(q, 0) == -1.0 && mg_policy_score(q, 1) == -2.0, "legacy %g %g",
              mg_policy_score(q, 0), mg_policy_score(q, 1));
        mg_policy_free(q);
    }
    /* pinned keys go last, and only when allowed */
    unsigned char pinned[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    CHECK(mg_policy_victims(p, slot_key, 4, mark, 1, pinned, 1, 4, out, heap) == 4 && out[3] == 0, "pinned last");
    CHECK(mg_policy_victims(p, slot_key, 4, mark, 1, pinned, 0, 4, out, heap) == 3, "pinned excluded");
    mg_policy_free(p);

    /* NEXT_USE, 4 layers of 2 experts, every expert equally frequent: after a visit of layer 1
     * the layer just computed (1) is needed last, the next one (2) first */
    p = mg_policy_create(MG_EXPERT_POLICY_LFRU, 4, 2, 64, &err);
    for (int t = 0; t < 20; t++)
        for (int l = 0; l < 4; l++) {
            int both[2] = {2 * l, 2 * l + 1};
            mg_policy_request(p, l, 2, both);
        }
    for (int l = 0; l < 2; l++) {
        int both[2] = {2 * l, 2 * l + 1};
        mg_policy_request(p, l, 2, both);
    }
    int keys4[4] = {2, 4, 6, 0}; /* one expert of layers 1, 2, 3, 0 */
    CHECK(mg_policy_victims(p, keys4, 4, mark, 1, NULL, 1, 4, out, heap) == 4 && out[0] == 0 && out[1] == 3 &&
              out[2] == 2 && out[3] == 1,
          "layer distance order %d %d %d %d", out[0], out[1], out[2], out[3]);
    mg_policy_free(p);
}

/* Requests of one layer of 16 experts, 4 per visit: 3 of 4 choices near a hot expert that
 * moves to a random place every `phase` visits, the rest uniform (a deterministic LCG). */
static uint32_t g_lcg = 12345;
static uint32_t lcg(void) {
    g_lcg = g_lcg * 1103515245u + 12345u;
    return (g_lcg & 0x7fffffffu) >> 8;
}
/* n tokens over n_layers layers (layer l's hot expert sits 5 l further on).  trail (may be
 * NULL) sums (i % 97 + 1) * the ranking half-life in tokens after the i-th request. */
static long g_visit; /* requests made by hot_visits_layers */
static void hot_visits_layers(mg_policy *p, int n_layers, int phase, int n, double *trail) {
    int hot = 0;
    for (int t = 0; t < n; t++) {
        if (t % phase == 0) hot = (int)(lcg() % 16);
        for (int l = 0; l < n_layers; l++) {
            int keys[4], got = 0;
            while (got < 4) {
                int e = lcg() % 4 < 3 ? (hot + 5 * l + (int)(lcg() % 3)) % 16 : (int)(lcg() % 16);
                int dup = 0;
                for (int i = 0; i < got; i++) dup |= keys[i] == 16 * l + e;
                if (!dup) keys[got++] = 16 * l + e;
            }
            mg_policy_request(p, l, 4, keys);
            if (trail) *trail += (double)(g_visit % 97 + 1) * (mg_policy_half_life(p) / n_layers);
            g_visit++;
        }
    }
}
static void hot_visits(mg_policy *p, int phase, int n) { hot_visits_layers(p, 1, phase, n, NULL); }

#define REPLAY_GOLDEN "-0x1.2be67c0ecea78p+11 930240"

/* The default bank: steady routing hands the ranking to a long half-life (less noise), a hot
 * set that keeps moving to a short one; an explicit half-life stays what it was set to. */
static void test_policy_bank(void) {
    mg_error err = {{0}};
    mg_policy *p = mg_policy_create(MG_EXPERT_POLICY_LFRU, 1, 16, 0, &err);
    CHECK(p != NULL, "%s", err.msg);
    if (!p) return;
    CHECK(mg_policy_half_life(p) == 16, "the bank starts at 16 tokens: %g", mg_policy_half_life(p));
    hot_visits(p, 1 << 30, 800);
    CHECK(mg_policy_half_life(p) >= 64, "steady routing: long half-life, got %g", mg_policy_half_life(p));
    hot_visits(p, 20, 400);
    CHECK(mg_policy_half_life(p) <= 16, "drifting routing: short half-life, got %g", mg_policy_half_life(p));
    mg_policy_free(p);
    p = mg_policy_create(MG_EXPERT_POLICY_LFRU, 1, 16, 24, &err);
    hot_visits(p, 20, 100);
    CHECK(fabs(mg_policy_half_life(p) - 24) < 1e-9, "explicit half-life: %g", mg_policy_half_life(p));
    mg_policy_free(p);
    CHECK(mg_policy_create(MG_EXPERT_POLICY_LFRU, 1, 16, -1, &err) == NULL && strstr(err.msg, "half-life"),
          "%s", err.msg);

    /* tools/routing_trace.py replays this policy to the bit: the same requests (this LCG) give
     * the same scores there (tests/test_routing_trace.py checks the same two numbers) */
    g_lcg = 777;
    g_visit = 0;
    p = mg_policy_create(MG_EXPERT_POLICY_LFRU, 3, 16, 0, &err);
    double trail = 0;
    hot_visits_layers(p, 3, 1 << 30, 120, &trail);
    hot_visits_layers(p, 3, 15, 180, &trail);
    double sum = 0;
    for (int key = 0; key < 48; key++) {
        double v = mg_policy_score(p, key);
        if (isfinite(v)) sum += v;
    }
    char got[64];
    snprintf(got, sizeof got, "%a %.0f", sum, trail);
    CHECK(!strcmp(got, REPLAY_GOLDEN), "scores %s, the replay's %s", got, REPLAY_GOLDEN);
    mg_policy_free(p);
}

/* A pause between fetches, standing for the computation on the fetched experts. */
#define COMPUTE() usleep(2000)

static void test_trace_usage_prefetch(const char *dir) {
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    char trace[512], usage[512];
    snprintf(trace, sizeof trace, "%s/trace.bin", g_root);
    snprintf(usage, sizeof usage, "%s/usage.bin", g_root);
    /* trace in resident mode */
    mg_expert_store *r = mg_expert_store_create(L, E, &err);
    bind_all(ck, r, &err);
    CHECK(mg_expert_store_trace(r, trace, &err) == 0, "%s", err.msg);
    int ids[3] = {4, 1, 7};
    const mg_expert *out[E];
    float scores[E];
    for (int e = 0; e < E; e++) scores[e] = 0.25f * (float)e - 1.0f;
    mg_expert_store_fetch(r, 2, 3, ids, out, &err);
    /* with the router's scores (version 2): they follow the ids; a look-ahead hint given
     * before the fetch (version 3) follows them (wanted while tracing, even resident) */
    CHECK(mg_expert_store_wants_hints(r), "a tracing store does not want hints");
    int hint[2] = {5, 3};
    mg_expert_store_hint(r, 1, 2, hint);
    CHECK(mg_expert_store_fetch_begin_scored(r, 0, 1, ids, scores, out, &err) == 0, "%s", err.msg);
    while (mg_expert_store_fetch_next(r, &err) >= 0) {}
    mg_expert_store_free(r);
    FILE *f = fopen(trace, "rb");
    unsigned char buf[128 + 4 * E];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    uint32_t version;
    memcpy(&version, buf + 8, sizeof version);
    uint16_t rec[11], tail[4];
    memcpy(rec, buf + 24, sizeof rec);
    float got[E];
    memcpy(got, buf + 24 + 22, sizeof got);
    memcpy(tail, buf + 24 + 22 + sizeof got, sizeof tail);
    /* layer 2, 3 ids, no scores, no hint | layer 0, 1 id, E scores, a hint of 2 for layer 1 */
    CHECK(n == 24 + 14 + 10 + 4 * E + 6 && !memcmp(buf, "MGRTRACE", 8) && version == 3 && rec[0] == 2 &&
              rec[1] == 3 && rec[2] == 4 && rec[4] == 7 && rec[5] == 0 && rec[6] == 0 && rec[7] == 0 &&
              rec[8] == 1 && rec[9] == 4 && rec[10] == E && !memcmp(got, scores, sizeof got) && tail[0] == 2 &&
              tail[1] == 1 && tail[2] == 5 && tail[3] == 3,
          "trace bytes %zu", n);
    /* usage history: expert 6 of layer 1 requested most -> pinned next run */
    uint64_t slot;
    /* run 2 attaches the history after configure (what the engine does): same effect */
    for (int run = 0; run < 3; run++) {
        mg_expert_store *c = mg_expert_store_create(L, E, &err);
        bind_all(ck, c, &err);
        slot = mg_expert_store_slot_bytes(c, ck, &err);
        mg_expert_cache_opts o = {.usage_path = run < 2 ? usage : NULL, .pin_fraction = 0.1};
        CHECK(mg_expert_store_configure(c, ck, slot * 2 * E, &o, &err) == 0, "%s", err.msg);
        if (run == 2) CHECK(mg_expert_store_use_history(c, usage, 0.1, &err) == 0, "%s", err.msg);
        mg_expert_stats st = mg_expert_store_stats(c);
        CHECK(st.hot_set == (run ? 1u : 0u), "run %d pinned %llu", run, (unsigned long long)st.hot_set);
        /* the pinned expert is read at start: the first request already hits */
        CHECK(st.preloaded == st.hot_set && st.fetches == 0, "run %d preloaded %llu", run,
              (unsigned long long)st.preloaded);
        int six = 6;
        const mg_expert *want6;
        mg_expert_store *res6 = mg_expert_store_create(L, E, &err);
        bind_all(ck, res6, &err);
        mg_expert_store_fetch(res6, 1, 1, &six, &want6, &err);
        CHECK(mg_expert_store_fetch(c, 1, 1, &six, out, &err) == 0 && same_expert(out[0], want6), "%s", err.msg);
        st = mg_expert_store_stats(c);
        CHECK(st.hits == (run ? 1u : 0u) && st.misses == (run ? 0u : 1u), "run %d first fetch: %llu hits", run,
              (unsigned long long)st.hits);
        mg_expert_store_free(res6);
        for (int t = 0; t < 20; t++) {
            CHECK(mg_expert_store_fetch(c, 1, 1, &six, out, &err) == 0, "%s", err.msg);
            int other = t % E;
            mg_expert_store_fetch(c, t % L, 1, &other, out, &err);
        }
        mg_expert_store_free(c);
    }
    {
        /* the history holds the counts, then each layer's visits (aged: earlier runs half) */
        FILE *uf = fopen(usage, "rb");
        char magic[8] = {0};
        uint32_t dims[2] = {0};
        float *v = malloc(sizeof(float) * (L * E + L));
        size_t nv = 0;
        if (uf && fread(magic, 1, 8, uf) == 8 && fread(dims, 4, 2, uf) == 2) nv = fread(v, sizeof(float), L * E + L + 1, uf);
        if (uf) fclose(uf);
        CHECK(!memcmp(magic, "MGUSAGE2", 8) && dims[0] == L && dims[1] == E && nv == (size_t)(L * E + L),
              "history layout %.8s %u %u %zu", magic, dims[0], dims[1], nv);
        /* three runs of 21 fetches of layer 1 (expert 6 each time) and 7 or 6 visits of others */
        CHECK(nv == (size_t)(L * E + L) && v[L * E + 1] >= v[E + 6] && v[E + 6] > 0, "visits %g count %g",
              v[L * E + 1], v[E + 6]);
        free(v);
        /* a file of another format (here counts only, which no release wrote) is ignored */
        uf = fopen(usage, "wb");
        float counts[L * E] = {0};
        counts[3] = 50;
        uint32_t d1[2] = {L, E};
        CHECK(uf && fwrite("MGUSAGE1", 1, 8, uf) == 8 && fwrite(d1, 4, 2, uf) == 2 &&
                  fwrite(counts, sizeof(float), L * E, uf) == L * E,
              "write v1");
        if (uf) fclose(uf);
        mg_expert_store *c1 = mg_expert_store_create(L, E, &err);
        bind_all(ck, c1, &err);
        mg_expert_cache_opts o1 = {.usage_path = usage, .pin_fraction = 0.1};
        CHECK(mg_expert_store_configure(c1, ck, slot * 2 * E, &o1, &err) == 0, "%s", err.msg);
        CHECK(mg_expert_store_stats(c1).hot_set == 0, "a foreign history pins %llu",
              (unsigned long long)mg_expert_store_stats(c1).hot_set);
        mg_expert_store_free(c1);
    }
    /* prefetch: only into empty or lower-valued slots, when idle; then a hit with the same bytes */
    mg_expert_store *res = mg_expert_store_create(L, E, &err), *c = mg_expert_store_create(L, E, &err);
    bind_all(ck, res, &err);
    bind_all(ck, c, &err);
    CHECK(mg_expert_store_configure(c, ck, slot * E * L, NULL, &err) == 0, "%s", err.msg);
    int pf[2] = {3, 5};
    int started = mg_expert_store_prefetch(c, 2, 2, pf);
    CHECK(started >= 1, "prefetch started %d", started);
    const mg_expert *want[2];
    mg_expert_store_fetch(res, 2, 2, pf, want, &err);
    CHECK(mg_expert_store_fetch(c, 2, 2, pf, out, &err) == 0, "%s", err.msg);
    CHECK(same_expert(out[0], want[0]) && same_expert(out[1], want[1]), "prefetched bytes");
    mg_expert_stats st = mg_expert_store_stats(c);
    CHECK(st.prefetches == (uint64_t)started && st.hits == (uint64_t)started, "prefetch hits %llu",
          (unsigned long long)st.hits);
    CHECK(st.prefetch_hits == (uint64_t)started, "hits on prefetched experts %llu of %d",
          (unsigned long long)st.prefetch_hits, started);
    CHECK(mg_expert_store_fetch(c, 2, 2, pf, out, &err) == 0, "%s", err.msg);
    CHECK(mg_expert_store_stats(c).prefetch_hits == (uint64_t)started, "a second request counted as a prefetch hit");
    mg_expert_store_free(c);
    /* the store's read-ahead: layer 1's experts 4 and 6 are requested often; a one-off batch
     * of layer 2 pushes them out; hinted before the next fetch of layer 0, they are read back
     * behind that fetch's reads (while the caller computes), so layer 1's fetch hits.  The
     * store reads ahead only as much as its disk sat idle: a pause after each fetch stands for
     * the computation */
    c = mg_expert_store_create(L, E, &err);
    bind_all(ck, c, &err);
    CHECK(mg_expert_store_configure(c, ck, slot * E, NULL, &err) == 0, "%s", err.msg);
    CHECK(!mg_expert_store_wants_hints(c), "hints wanted with read-ahead off");
    mg_expert_store_set_prefetch(c, 2);
    CHECK(mg_expert_store_wants_hints(c), "hints not wanted with read-ahead on");
    int l0[2] = {1, 2}, l1[2] = {4, 6}, l2[E] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int t = 0; t < 5; t++) { /* hinted right each time: the hint's ranks earn their accuracy */
        mg_expert_store_hint(c, 1, 2, l1);
        CHECK(mg_expert_store_fetch(c, 0, 2, l0, out, &err) == 0, "%s", err.msg);
        COMPUTE();
        CHECK(mg_expert_store_fetch(c, 1, 2, l1, out, &err) == 0, "%s", err.msg);
        COMPUTE();
    }
    CHECK(mg_expert_store_fetch(c, 2, E, l2, out, &err) == 0, "%s", err.msg);
    COMPUTE();
    uint64_t ahead_before = mg_expert_store_stats(c).auto_prefetches;
    CHECK(mg_expert_store_fetch(c, 0, 2, l0, out, &err) == 0, "%s", err.msg);
    COMPUTE();
    CHECK(mg_expert_store_stats(c).auto_prefetches == ahead_before, "read ahead without a hint");
    mg_expert_store_hint(c, 1, 2, l1);
    CHECK(mg_expert_store_fetch(c, 0, 2, l0, out, &err) == 0, "%s", err.msg);
    COMPUTE();
    uint64_t hits_before = mg_expert_store_stats(c).hits, pf_hits_before = mg_expert_store_stats(c).prefetch_hits;
    CHECK(mg_expert_store_stats(c).auto_prefetches - ahead_before == 2, "read ahead %llu of 2 hinted",
          (unsigned long long)(mg_expert_store_stats(c).auto_prefetches - ahead_before));
    CHECK(mg_expert_store_fetch(c, 1, 2, l1, out, &err) == 0, "%s", err.msg);
    COMPUTE();
    mg_expert_store_fetch(res, 1, 2, l1, want, &err);
    CHECK(same_expert(out[0], want[0]) && same_expert(out[1], want[1]), "read-ahead bytes");
    st = mg_expert_store_stats(c);
    CHECK(st.hits - hits_before == 2, "read-ahead hits %llu", (unsigned long long)(st.hits - hits_before));
    CHECK(st.prefetch_hits - pf_hits_before == 2, "hits on read-ahead %llu",
          (unsigned long long)(st.prefetch_hits - pf_hits_before));
    CHECK(st.auto_prefetches <= st.prefetches, "read-aheads are prefetches");
    /* a rank of hint that never comes true stops being read: expert 7 is hinted first for
     * layer 1 each token and never requested there; after a few misses it is not read ahead */
    int wrong[2] = {7, 4};
    uint64_t last_reads = 0;
    for (int t = 0; t < 12; t++) {
        uint64_t before = mg_expert_store_stats(c).auto_prefetches;
        mg_expert_store_hint(c, 1, 2, wrong);
        CHECK(mg_expert_store_fetch(c, 0, 2, l0, out, &err) == 0, "%s", err.msg);
        COMPUTE();
        CHECK(mg_expert_store_fetch(c, 1, 2, l1, out, &err) == 0, "%s", err.msg);
        COMPUTE();
        CHECK(mg_expert_store_fetch(c, 2, 1, l2 + 7, out, &err) == 0, "%s", err.msg); /* evicts 7 again */
        last_reads = mg_expert_store_stats(c).auto_prefetches - before;
    }
    CHECK(last_reads == 0, "a hint rank that never comes true is still read ahead (%llu)",
          (unsigned long long)last_reads);
    mg_expert_store_free(c);
    mg_expert_store_free(res);
    mg_checkpoint_close(ck);
}

/* RSS stays within the cache: expert bytes come through the slots, never the mapping. */
static uint64_t status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t v = 0;
    size_t fl = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl)) v = strtoull(line + fl, NULL, 10);
    if (f) fclose(f);
    return v;
}

static void test_rss(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/big", g_root);
    mkdir(dir, 0700);
    ckspec *k = calloc(1, sizeof *k);
    const int d = 512, w = 256, BL = 4; /* 4 layers: the pool is > 3x a one-layer cache */
    for (int l = 0; l < BL; l++)
        for (int e = 0; e < E; e++) {
            add(k, "BF16", 2, w, d, P, l, e, "gate_proj.weight");
            add(k, "BF16", 2, w, d, P, l, e, "up_proj.weight");
            add(k, "BF16", 2, d, w, P, l, e, "down_proj.weight");
        }
    uint64_t seed = 77;
    write_shard(dir, "m.safetensors", k, &seed);
    free(k);
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    mg_expert_store *c = mg_expert_store_create(BL, E, &err);
    for (int l = 0; l < BL; l++)
        for (int e = 0; e < E; e++) {
            mg_expert x;
            char n[160];
            snprintf(n, sizeof n, P, l, e, "gate_proj.weight");
            mg_bind_matrix(ck, n, w, d, &x.gate, &err);
            snprintf(n, sizeof n, P, l, e, "up_proj.weight");
            mg_bind_matrix(ck, n, w, d, &x.up, &err);
            snprintf(n, sizeof n, P, l, e, "down_proj.weight");
            mg_bind_matrix(ck, n, d, w, &x.down, &err);
            mg_expert_store_set(c, l, e, &x);
        }
    uint64_t pool = mg_expert_store_expert_bytes(c), slot = mg_expert_store_slot_bytes(c, ck, &err);
    uint64_t file_before = status_kb("RssFile:"), rss_before = status_kb("VmRSS:");
    CHECK(mg_expert_store_configure(c, ck, slot * E, NULL, &err) == 0, "%s", err.msg);
    uint64_t seed2 = 5;
    double sum = 0;
    for (int t = 0; t < 200; t++) {
        int ids[2] = {(int)(rng_next(&seed2) % E), 0};
        ids[1] = (ids[0] + 1 + (int)(rng_next(&seed2) % (E - 1))) % E;
        const mg_expert *out[2];
        if (mg_expert_store_fetch(c, t % BL, 2, ids, out, &err)) {
            CHECK(0, "%s", err.msg);
            break;
        }
        sum += mg_matrix_get(&out[0]->down, 1, 2) + mg_matrix_get(&out[1]->gate, 3, 4);
    }
    mg_expert_stats st = mg_expert_store_stats(c);
    uint64_t file_growth = (status_kb("RssFile:") - file_before) * 1024;
    uint64_t growth = (status_kb("VmRSS:") - rss_before) * 1024;
    printf("rss test: %llu reads (%llu O_DIRECT), %.1f MB in %.4f s, hit rate %.2f\n",
           (unsigned long long)(st.direct_reads + st.buffered_reads), (unsigned long long)st.direct_reads,
           st.bytes_read / 1e6, st.read_seconds, (double)st.hits / (double)(st.hits + st.misses));
    CHECK(pool >= 3 * slot * E, "pool %llu is at least 3x the cache", (unsigned long long)pool);
    CHECK(st.bytes_read > pool, "every expert streamed: %llu", (unsigned long long)st.bytes_read);
    CHECK(file_growth < ((uint64_t)1 << 20), "mapped expert bytes touched: %llu", (unsigned long long)file_growth);
    CHECK(growth < slot * E + ((uint64_t)4 << 20), "RSS grew %llu for a %llu cache", (unsigned long long)growth,
          (unsigned long long)(slot * E));
    CHECK(isfinite(sum) || isnan(sum), "values read");
    mg_expert_store_free(c);
    mg_checkpoint_close(ck);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

int main(void) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_root, sizeof g_root, "%s/mg_expert_XXXXXX", base);
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ck", g_root);
    write_small_checkpoint(dir);
    test_policy();
    test_policy_bank();
    test_bitwise(dir);
    test_trace_usage_prefetch(dir);
    test_rss();
    test_truncated(dir); /* last: it damages the checkpoint */
    nftw(g_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
