/* One loaded model with one sequence slot (its KV state).  Architectures plug in through
 * mg_arch (arch.h); this is the interface the Python binding uses. */
#ifndef MG_MODEL_H
#define MG_MODEL_H

#include <stdint.h>
#include "core/status.h"

typedef struct mg_model mg_model;

typedef struct mg_model_options {
    int n_threads;          /* <= 0: all cores */
    const char *kernels;    /* NULL: best for this CPU; else "scalar", "avx2", "neon" */
    int64_t max_ctx;        /* tokens the slot may hold; <= 0: the model's own limit */
    double ram_gb;          /* <= 0: no budget */
    const char *kv_dtype;   /* KV cache storage: NULL / "" / "f32", or "bf16" (half the bytes) */
    int64_t prefill_window; /* tokens a prefill evaluates layer by layer at once; <= 0: sized
                               from the budget (a fixed default without one) */
    const char *activations; /* NULL / "" / "f32": fp32 activations (the default: logits equal
                                transformers' on dequantised weights); "int8": the ggml block
                                formats and native FP4 with int8 activations (core/q8_act.h) */
} mg_model_options;

/* dir: checkpoint folder; config_json: the normalised config (gateway/model_config.py),
 * which names the architecture in "arch". */
mg_model *mg_model_open(const char *dir, const char *config_json, const mg_model_options *opt,
                        mg_error *err);
void mg_model_close(mg_model *m);

/* Appends tokens to the slot.  logits receives [n, vocab] floats, or [1, vocab] for the last
 * token when last_only (the head is then computed for that token alone). */
int mg_model_eval(mg_model *m, const int32_t *tokens, int64_t n, int last_only, float *logits,
                  mg_error *err);

/* Progress and cancellation of a long eval.  A prefill runs layer by layer over windows of
 * mg_model_prefill_window() tokens; after layer `layer` (of n_layers) of the window covering
 * tokens [done, done + window) of the call, fn is called with in_layer = 0.  Tokens [0, done)
 * are complete, and after the last layer so is the window.  Inside a layer fn is also polled,
 * with in_layer = 1 and `layer` the layer in progress: between its dense sub-chunks and between
 * its groups of routed experts, so that a cancel takes effect within about one sub-chunk's
 * time (one layer of a long window takes a minute at DeepSeek-V4-Flash size).  A non-zero
 * return cancels: the eval stops there and the slot holds exactly the tokens of the complete
 * windows (the current one too when the cancel came after its last layer; never after an
 * in-layer poll).  fn must not call into the model; a poll should be cheap. */
typedef int (*mg_eval_progress_fn)(void *ctx, int layer, int n_layers, int64_t done, int64_t window, int in_layer);
typedef struct mg_eval_hook {
    mg_eval_progress_fn fn;
    void *ctx;
} mg_eval_hook;

#define MG_EVAL_CANCELLED 1

/* mg_model_eval with a hook (NULL: none).  Returns 0, -1 with err set (the slot as before the
 * call), or MG_EVAL_CANCELLED: *done (never NULL) tokens of the call were kept (n_past grew by
 * that many: whole windows) and logits were not written. */
int mg_model_eval_hooked(mg_model *m, const int32_t *tokens, int64_t n, int last_only, float *logits,
                         const mg_eval_hook *hook, int64_t *done, mg_error *err);
int64_t mg_model_prefill_window(const mg_model *m);

int64_t mg_model_n_past(const mg_model *m);
int64_t mg_model_vocab(const mg_model *m);
int64_t mg_model_max_ctx(const mg_model *m);
const char *mg_model_arch(const mg_model *m);
const char *mg_model_kernels(const mg_model *m);
int mg_model_threads(const mg_model *m);
const char *mg_model_kv_dtype(const mg_model *m);        /* "f32" or "bf16" */
const char *mg_model_activations(const mg_model *m);     /* "f32" or "int8" */
/* 1: int8 activations in prefill too (the kernels have an int8 GEMM); 0: decode only, or f32. */
int mg_model_int8_prefill(const mg_model *m);
uint64_t mg_model_kv_bytes_per_token(const mg_model *m); /* KV state bytes per position */

/* Keeps the first n tokens: evaluating after this gives the same logits as a fresh run. */
int mg_model_truncate(mg_model *m, int64_t n, mg_error *err);
void mg_model_reset(mg_model *m);

/* Prefix snapshots: the slot's state for its first n tokens as one self-checking buffer, so a
 * conversation the slot had to leave can come back without prefilling it again.  Restoring
 * replaces the slot with exactly that prefix (n_past = n); evaluating after it gives the same
 * logits as a fresh run.  prefix_bytes returns 0 (+ err) on error. */
uint64_t mg_model_prefix_bytes(mg_model *m, int64_t n, mg_error *err);
int mg_model_save_prefix(mg_model *m, int64_t n, void *out, uint64_t cap, mg_error *err);
int mg_model_restore_prefix(mg_model *m, const void *in, uint64_t bytes, mg_error *err);

#endif
