/* mg_model: the architecture registry, the shared compute environment and the generic checks
 * around the per-architecture plugins (arch.h). */
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/model.h"

/* Resolved context when neither the options nor a sane model limit give one. */
#define DEFAULT_MAX_CTX 32768

struct mg_model {
    const mg_arch *arch;
    void *state;
    mg_checkpoint *ck;
    mg_json *config;
    mg_pool *pool;
    mg_compute compute;
    int64_t n_past, max_ctx;
    mg_arch_info info;
    uint64_t checkpoint_bytes;
};

static const mg_arch *find_arch(const char *name) {
    const mg_arch *table[] = {&mg_arch_qwen3_moe, &mg_arch_glm4_moe, &mg_arch_deepseek_v4};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i]->name, name) == 0) return table[i];
    return NULL;
}

/* ---- config helpers (arch.h) ---- */

static const mg_json *field(const mg_json *cfg, const char *key, mg_json_type type, const char *what,
                            mg_error *err) {
    const mg_json *v = mg_json_get(cfg, key);
    if (!v) {
        mg_fail(err, "normalised config: missing field '%s'", key);
        return NULL;
    }
    if (mg_json_type_of(v) != type) {
        mg_fail(err, "normalised config: field '%s' must be %s", key, what);
        return NULL;
    }
    return v;
}

int mg_config_int(const mg_json *cfg, const char *key, int64_t *out, mg_error *err) {
    const mg_json *v = field(cfg, key, MG_JSON_NUMBER, "an integer", err);
    if (!v) return -1;
    if (!mg_json_is_integer(v)) return mg_fail(err, "normalised config: field '%s' must be an integer", key);
    *out = mg_json_int(v);
    return 0;
}

int mg_config_num(const mg_json *cfg, const char *key, double *out, mg_error *err) {
    const mg_json *v = field(cfg, key, MG_JSON_NUMBER, "a number", err);
    if (!v) return -1;
    *out = mg_json_number(v);
    return 0;
}

int mg_config_bool(const mg_json *cfg, const char *key, int *out, mg_error *err) {
    const mg_json *v = field(cfg, key, MG_JSON_BOOL, "true or false", err);
    if (!v) return -1;
    *out = mg_json_bool(v);
    return 0;
}

int mg_config_int_array(const mg_json *cfg, const char *key, int64_t **out, int64_t *n, mg_error *err) {
    const mg_json *v = field(cfg, key, MG_JSON_ARRAY, "an array of integers", err);
    if (!v) return -1;
    size_t len = mg_json_len(v);
    int64_t *a = malloc(sizeof(int64_t) * (len ? len : 1));
    if (!a) return mg_fail(err, "out of memory");
    for (size_t i = 0; i < len; i++) {
        const mg_json *it = mg_json_at(v, i);
        if (mg_json_type_of(it) != MG_JSON_NUMBER || !mg_json_is_integer(it)) {
            free(a);
            return mg_fail(err, "normalised config: field '%s' must be an array of integers", key);
        }
        a[i] = mg_json_int(it);
    }
    *out = a;
    *n = (int64_t)len;
    return 0;
}

/* ---- model ---- */

mg_model *mg_model_open(const char *dir, const char *config_json, const mg_model_options *opt,
                        mg_error *err) {
    mg_model_options defaults = {0};
    if (!opt) opt = &defaults;
    mg_model *m = calloc(1, sizeof *m);
    if (!m) {
        mg_fail(err, "out of memory");
        return NULL;
    }
    if (!config_json) {
        mg_fail(err, "no model config given");
        goto fail;
    }
    if (!(m->config = mg_json_parse(config_json, strlen(config_json), err))) goto fail;
    if (mg_json_type_of(m->config) != MG_JSON_OBJECT) {
        mg_fail(err, "normalised config: not a JSON object");
        goto fail;
    }
    const mg_json *arch_name = mg_json_get(m->config, "arch");
    if (!arch_name || mg_json_type_of(arch_name) != MG_JSON_STRING) {
        mg_fail(err, "normalised config: missing string field 'arch'");
        goto fail;
    }
    if (!(m->arch = find_arch(mg_json_string(arch_name)))) {
        mg_fail(err, "architecture '%s' is not built into this engine", mg_json_string(arch_name));
        goto fail;
    }
    const mg_kernels *k = opt->kernels && opt->kernels[0] ? mg_kernels_named(opt->kernels) : mg_kernels_best();
    if (!k) {
        mg_fail(err, "kernel table '%s' is unknown or not supported by this CPU (use scalar, avx2, avx512 or neon)",
                opt->kernels);
        goto fail;
    }
    int act_int8 = 0;
    if (opt->activations && opt->activations[0] && strcmp(opt->activations, "f32")) {
        if (strcmp(opt->activations, "int8")) {
            mg_fail(err, "activations '%s' is unknown (use f32 or int8)", opt->activations);
            goto fail;
        }
        act_int8 = 1;
    }
    int64_t max_ctx = opt->max_ctx;
    if (max_ctx <= 0) {
        int64_t model_limit = 0;
        const mg_json *mp = mg_json_get(m->config, "max_position_embeddings");
        if (mp && mg_json_type_of(mp) == MG_JSON_NUMBER) model_limit = mg_json_int(mp);
        max_ctx = model_limit > 0 && model_limit < DEFAULT_MAX_CTX ? model_limit : DEFAULT_MAX_CTX;
    }
    m->max_ctx = max_ctx;
    mg_kv_type kv_type;
    if (mg_kv_type_parse(opt->kv_dtype, &kv_type, err)) goto fail;
    if (!(m->ck = mg_checkpoint_open(dir, err))) goto fail;
    m->checkpoint_bytes = mg_checkpoint_total_bytes(m->ck);
    if (!(m->pool = mg_pool_create(opt->n_threads, err))) goto fail;
    m->compute.pool = m->pool;
    m->compute.k = k;
    m->compute.act_int8 = act_int8;
    mg_arch_env env = {m->ck, m->config, &m->compute, max_ctx, opt->ram_gb, (int)kv_type, opt->prefill_window};
    if (!(m->state = m->arch->load(&env, err))) goto fail;
    m->arch->info(m->state, &m->info);
    return m;
fail:
    mg_model_close(m);
    return NULL;
}

void mg_model_close(mg_model *m) {
    if (!m) return;
    if (m->state) m->arch->free(m->state);
    if (m->pool) mg_pool_destroy(m->pool);
    if (m->ck) mg_checkpoint_close(m->ck);
    if (m->config) mg_json_free(m->config);
    free(m);
}

int mg_model_eval_hooked(mg_model *m, const int32_t *tokens, int64_t n, int last_only, float *logits,
                         const mg_eval_hook *hook, int64_t *done, mg_error *err) {
    *done = 0;
    if (n < 0) return mg_fail(err, "negative token count %lld", (long long)n);
    if (n == 0) return 0;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->info.vocab)
            return mg_fail(err, "token id %d at index %lld is outside the vocabulary of %lld tokens",
                           (int)tokens[i], (long long)i, (long long)m->info.vocab);
    if (m->n_past + n > m->max_ctx)
        return mg_fail(err, "context overflow: %lld cached + %lld new tokens exceed max_ctx %lld",
                       (long long)m->n_past, (long long)n, (long long)m->max_ctx);
    int rc = m->arch->eval(m->state, tokens, n, m->n_past, last_only, logits, hook, done, err);
    if (rc == 0 || rc == MG_EVAL_CANCELLED) m->n_past += rc ? *done : n;
    else *done = 0;
    return rc == 0 || rc == MG_EVAL_CANCELLED ? rc : -1;
}

int mg_model_eval(mg_model *m, const int32_t *tokens, int64_t n, int last_only, float *logits,
                  mg_error *err) {
    int64_t done;
    return mg_model_eval_hooked(m, tokens, n, last_only, logits, NULL, &done, err);
}

int64_t mg_model_prefill_window(const mg_model *m) { return m->info.prefill_window; }

int64_t mg_model_n_past(const mg_model *m) { return m->n_past; }
int64_t mg_model_vocab(const mg_model *m) { return m->info.vocab; }
int64_t mg_model_max_ctx(const mg_model *m) { return m->max_ctx; }
const char *mg_model_arch(const mg_model *m) { return m->arch->name; }
const char *mg_model_kernels(const mg_model *m) { return m->compute.k->name; }
int mg_model_threads(const mg_model *m) { return mg_pool_threads(m->pool); }
const char *mg_model_activations(const mg_model *m) { return m->compute.act_int8 ? "int8" : "f32"; }
int mg_model_int8_prefill(const mg_model *m) { return m->compute.act_int8 && m->compute.k->linear_q8_gemm; }
const char *mg_model_kv_dtype(const mg_model *m) { return mg_kv_type_name((mg_kv_type)m->info.kv_type); }
uint64_t mg_model_kv_bytes_per_token(const mg_model *m) { return m->info.kv_bytes_per_token; }

int mg_model_truncate(mg_model *m, int64_t n, mg_error *err) {
    if (n < 0 || n > m->n_past)
        return mg_fail(err, "cannot truncate to %lld tokens: the slot holds %lld", (long long)n,
                       (long long)m->n_past);
    if (m->arch->truncate(m->state, n, err)) return -1;
    m->n_past = n;
    return 0;
}

void mg_model_reset(mg_model *m) { mg_model_truncate(m, 0, NULL); }

const mg_arch_info *mg_model_info(const mg_model *m) { return &m->info; }
uint64_t mg_model_checkpoint_bytes(const mg_model *m) { return m->checkpoint_bytes; }

/* The arch state owns the store and lends it read-only through info (for statistics);
 * tracing, history and prefetch are settings the store itself allows while loaded, so the
 * model, which owns the arch state, may change them. */
static mg_expert_store *expert_store(mg_model *m) { return (mg_expert_store *)m->info.experts; }

int mg_model_trace_routing(mg_model *m, const char *path, mg_error *err) {
    mg_expert_store *s = expert_store(m);
    if (!s) return path ? mg_fail(err, "architecture '%s' has no routed experts to trace", m->arch->name) : 0;
    return mg_expert_store_trace(s, path, err);
}

int mg_model_expert_history(mg_model *m, const char *path, double pin_fraction, mg_error *err) {
    mg_expert_store *s = expert_store(m);
    if (!s) return mg_fail(err, "architecture '%s' has no routed experts", m->arch->name);
    return mg_expert_store_use_history(s, path, pin_fraction, err);
}

void mg_model_expert_prefetch(mg_model *m, int depth) {
    mg_expert_store *s = expert_store(m);
    if (s) mg_expert_store_set_prefetch(s, depth);
}

void mg_model_expert_emulate_disk(mg_model *m, double bytes_per_second) {
    mg_expert_store *s = expert_store(m);
    if (s) mg_expert_store_emulate_disk(s, bytes_per_second);
}

/* ---- prefix snapshots ------------------------------------------------------------------------
 * A snapshot is a header plus the arch's prefix regions for positions [0, n), in walk order.
 * The fingerprint keeps a snapshot from being restored into a different model or KV type. */
#define PREFIX_MAGIC "MGPREFX1"

typedef struct prefix_header {
    char magic[8];
    uint64_t n, payload, fingerprint;
} prefix_header;

static uint64_t mix64(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

static uint64_t fingerprint(const mg_model *m) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *c = m->arch->name; *c; c++) h = mix64(h, (unsigned char)*c);
    h = mix64(h, (uint64_t)m->info.vocab);
    h = mix64(h, (uint64_t)m->info.n_layers);
    h = mix64(h, (uint64_t)m->info.kv_type);
    h = mix64(h, m->info.kv_bytes_per_token);
    h = mix64(h, m->info.kv_fixed_bytes);
    return mix64(h, m->checkpoint_bytes);
}

typedef struct region_copy {
    char *at;
    uint64_t left, total;
    int restore; /* 1: regions <- buffer, 0: buffer <- regions, -1: count only */
} region_copy;

static int copy_region(void *ctx, void *ptr, uint64_t bytes) {
    region_copy *c = ctx;
    c->total += bytes;
    if (c->restore < 0) return 0;
    if (bytes > c->left) return 1;
    if (c->restore) memcpy(ptr, c->at, (size_t)bytes);
    else memcpy(c->at, ptr, (size_t)bytes);
    c->at += bytes;
    c->left -= bytes;
    return 0;
}

static int check_prefix_support(const mg_model *m, mg_error *err) {
    return m->arch->prefix_regions ? 0 : mg_fail(err, "architecture '%s' has no prefix snapshots", m->arch->name);
}

uint64_t mg_model_prefix_bytes(mg_model *m, int64_t n, mg_error *err) {
    if (check_prefix_support(m, err)) return 0;
    if (n < 0 || n > m->n_past) {
        mg_fail(err, "cannot snapshot %lld tokens: the slot holds %lld", (long long)n, (long long)m->n_past);
        return 0;
    }
    region_copy c = {NULL, 0, 0, -1};
    if (m->arch->prefix_regions(m->state, n, 0, copy_region, &c, err)) return 0;
    return sizeof(prefix_header) + c.total;
}

int mg_model_save_prefix(mg_model *m, int64_t n, void *out, uint64_t cap, mg_error *err) {
    uint64_t need = mg_model_prefix_bytes(m, n, err);
    if (!need) return -1;
    if (cap < need) return mg_fail(err, "prefix snapshot needs %llu bytes, got %llu", (unsigned long long)need,
                                   (unsigned long long)cap);
    prefix_header h;
    memcpy(h.magic, PREFIX_MAGIC, 8);
    h.n = (uint64_t)n;
    h.payload = need - sizeof h;
    h.fingerprint = fingerprint(m);
    memcpy(out, &h, sizeof h);
    region_copy c = {(char *)out + sizeof h, h.payload, 0, 0};
    int rc = m->arch->prefix_regions(m->state, n, 0, copy_region, &c, err);
    if (rc > 0 || (rc == 0 && c.left)) return mg_fail(err, "prefix snapshot: the state changed size while copied");
    return rc ? -1 : 0;
}

int mg_model_restore_prefix(mg_model *m, const void *in, uint64_t bytes, mg_error *err) {
    if (check_prefix_support(m, err)) return -1;
    prefix_header h;
    if (bytes < sizeof h) return mg_fail(err, "prefix snapshot: %llu bytes is too short", (unsigned long long)bytes);
    memcpy(&h, in, sizeof h);
    if (memcmp(h.magic, PREFIX_MAGIC, 8) != 0) return mg_fail(err, "prefix snapshot: not a snapshot");
    if (h.fingerprint != fingerprint(m))
        return mg_fail(err, "prefix snapshot: taken from a different model or KV dtype");
    if (h.payload != bytes - sizeof h) return mg_fail(err, "prefix snapshot: truncated or padded");
    if (h.n > (uint64_t)m->max_ctx)
        return mg_fail(err, "prefix snapshot of %llu tokens exceeds max_ctx %lld", (unsigned long long)h.n,
                       (long long)m->max_ctx);
    const int64_t n = (int64_t)h.n;
    /* From here on the slot is overwritten: on any failure it is left empty, never half old. */
    region_copy c = {(char *)in + sizeof h, h.payload, 0, 1};
    int rc = m->arch->prefix_regions(m->state, n, 1, copy_region, &c, err);
    if (rc > 0 || (rc == 0 && c.left)) rc = mg_fail(err, "prefix snapshot: its size does not match this model's state");
    if (rc == 0) rc = m->arch->truncate(m->state, n, err);
    if (rc) {
        m->arch->truncate(m->state, 0, NULL);
        m->n_past = 0;
        return -1;
    }
    m->n_past = n;
    return 0;
}
