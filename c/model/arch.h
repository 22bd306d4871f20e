/* The per-architecture plugin interface.
 *
 * model.c owns what every architecture shares: the checkpoint mapping, the parsed normalised
 * config, the thread pool + kernel table (mg_compute), the position counter n_past, and the
 * generic argument checks (token ids inside the vocabulary, n_past + n <= max_ctx,
 * truncate never beyond n_past).  An architecture file (moe_transformer.c for qwen3_moe and
 * glm4_moe, deepseek_v4.c for deepseek_v4) implements one `mg_arch` table:
 *
 *   load      builds the arch state from the checkpoint and config (binds every tensor,
 *             checks every shape, allocates the KV cache for env->max_ctx positions)
 *   eval      runs n tokens at positions [pos, pos + n); tokens are already validated; a
 *             prefill runs layer by layer over windows (blocks.h, section 11), calling the
 *             hook between layers and polling it inside them (between dense sub-chunks and
 *             expert groups: mg_window_poll, mg_moe_args.poll)
 *   truncate  forgets positions >= n (n <= current n_past, already validated)
 *   free      releases the state (NULL-safe)
 *   info      fixed facts about the loaded model (filled once after load)
 *   prefix_regions  the memory positions [0, n) left in the state, for prefix snapshots
 *             (model.c copies them out; to restore it copies them back and calls truncate(n),
 *             which rebuilds whatever else derives from them)
 *
 * Registering an architecture = one `extern const mg_arch` below + one line in model.c's
 * registry.  The name is the "arch" field of the normalised config. */
#ifndef MG_ARCH_H
#define MG_ARCH_H

#include <stdint.h>
#include "core/linear.h"
#include "core/status.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/experts.h"
#include "model/model.h"

/* Everything a loader may read.  All pointers outlive the arch state (model.c frees them
 * after arch->free). */
typedef struct mg_arch_env {
    const mg_checkpoint *ck;     /* the mapped checkpoint folder */
    const mg_json *config;       /* the normalised config object (see python/gateway/model_config) */
    const mg_compute *compute;   /* thread pool + kernel table used by every linear */
    int64_t max_ctx;             /* positions the sequence slot must hold (already resolved > 0) */
    double ram_gb;               /* <= 0: no budget (expert-store sizing) */
    int kv_type;                 /* mg_kv_type (blocks.h): how the KV state stores its rows */
    int64_t prefill_window;      /* tokens per layer-major prefill window asked for; <= 0: auto */
} mg_arch_env;

/* Bound weight matrices by stored format: what `Engine.info["weights"]` reports. */
typedef struct mg_weight_census {
    int64_t n_matrices[MG_FORMAT_COUNT];
    uint64_t bytes[MG_FORMAT_COUNT];
} mg_weight_census;

typedef struct mg_arch_info {
    int64_t vocab;               /* logits per position */
    int n_layers;                /* decoder layers actually run (MTP layers excluded) */
    int n_experts;               /* routed experts per MoE layer (0 if none) */
    int n_experts_per_tok;
    mg_weight_census weights;
    const mg_expert_store *experts; /* for mg_expert_store_stats(); may be NULL */
    int kv_type;                 /* mg_kv_type of the KV state */
    uint64_t kv_bytes_per_token; /* what one more position of context costs (what --ram counts) */
    uint64_t kv_fixed_bytes;     /* what the slot costs whatever the context (a ring of recent rows) */
    int64_t prefill_window;      /* tokens evaluated layer by layer at once (counted under --ram) */
    uint64_t prefill_bytes_per_token; /* scratch one token of that window holds */
} mg_arch_info;

/* Called once per region, in a fixed order; non-zero stops the walk (and is returned). */
typedef int (*mg_region_fn)(void *ctx, void *ptr, uint64_t bytes);

typedef struct mg_arch {
    const char *name;
    void *(*load)(const mg_arch_env *env, mg_error *err);            /* NULL + err on failure */
    /* logits: [n, vocab] or, with last_only, [1, vocab] for the last token only.  On error the
     * state must stay usable: positions >= pos are treated as never written.  hook may be
     * NULL; when it cancels, returns MG_EVAL_CANCELLED with *done tokens kept (positions
     * >= pos + *done never written).  done is never NULL. */
    int (*eval)(void *state, const int32_t *tokens, int64_t n, int64_t pos, int last_only,
                float *logits, const mg_eval_hook *hook, int64_t *done, mg_error *err);
    int (*truncate)(void *state, int64_t n, mg_error *err);
    void (*free)(void *state);
    void (*info)(const void *state, mg_arch_info *out);
    /* With `reserve`, first makes room for n positions (a restore writes into the regions). */
    int (*prefix_regions)(void *state, int64_t n, int reserve, mg_region_fn fn, void *ctx, mg_error *err);
} mg_arch;

extern const mg_arch mg_arch_qwen3_moe;   /* moe_transformer.c */
extern const mg_arch mg_arch_glm4_moe;    /* moe_transformer.c */
extern const mg_arch mg_arch_deepseek_v4; /* deepseek_v4.c */

/* Small helpers for loaders reading the normalised config: a missing field or a wrong type
 * is an error naming the field (every field is explicit in the normalised config).
 * Implemented in model.c. */
int mg_config_int(const mg_json *cfg, const char *key, int64_t *out, mg_error *err);
int mg_config_num(const mg_json *cfg, const char *key, double *out, mg_error *err);
int mg_config_bool(const mg_json *cfg, const char *key, int *out, mg_error *err);
/* An array of integers: *out malloc'd (caller frees), *n its length. */
int mg_config_int_array(const mg_json *cfg, const char *key, int64_t **out, int64_t *n,
                        mg_error *err);

/* Extra queries on an open model for the binding and tests (model.h keeps the core API).
 * Implemented in model.c. */
const mg_arch_info *mg_model_info(const mg_model *m);
uint64_t mg_model_checkpoint_bytes(const mg_model *m); /* bytes of all mapped shards */

/* Settings of the model's expert store (experts.h), applied after open by the binding: the
 * arch state owns the store; these are the changes it accepts while loaded.  A model without
 * a store: trace and history fail with an error, prefetch and the disk model do nothing. */
int mg_model_trace_routing(mg_model *m, const char *path, mg_error *err); /* NULL: stop, flush */
int mg_model_expert_history(mg_model *m, const char *path, double pin_fraction, mg_error *err);
void mg_model_expert_prefetch(mg_model *m, int depth);
void mg_model_expert_emulate_disk(mg_model *m, double bytes_per_second); /* rehearsals; 0: off */

#endif
