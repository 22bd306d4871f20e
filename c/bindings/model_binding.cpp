// gateway._core.Model: the native half of gateway.engine.Engine (one model, one sequence slot).
// C errors arrive as mg_error text and leave as RuntimeError; eval releases the GIL so the
// server's event loop keeps running, and a mutex keeps two Python threads out of one slot.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings/bindings.h"

extern "C" {
#include "core/formats.h"
#include "model/arch.h"
#include "model/experts.h"
#include "model/model.h"
}

namespace py = pybind11;

namespace moegate {
namespace {

class Model {
  public:
    Model(const std::string &dir, const std::string &config_json, int n_threads, const std::string &kernels,
          int64_t max_ctx, double ram_gb, const std::string &kv_dtype, int64_t prefill_window,
          const std::string &activations) {
        mg_model_options opt{};
        opt.n_threads = n_threads;
        opt.kernels = kernels.empty() ? nullptr : kernels.c_str();
        opt.max_ctx = max_ctx;
        opt.ram_gb = ram_gb;
        opt.kv_dtype = kv_dtype.c_str();
        opt.prefill_window = prefill_window;
        opt.activations = activations.c_str();
        mg_error err{};
        {
            py::gil_scoped_release nogil;
            m_ = mg_model_open(dir.c_str(), config_json.c_str(), &opt, &err);
        }
        if (!m_) throw std::runtime_error(err.msg);
    }
    ~Model() { mg_model_close(m_); }
    Model(const Model &) = delete;
    Model &operator=(const Model &) = delete;

    py::array_t<float> eval(const std::vector<int64_t> &tokens, bool last_only) {
        return std::move(eval_hooked(tokens, last_only, py::none()).first);
    }

    // eval with a progress callable (None: none), called between layers with (layer, n_layers,
    // done, window) while the GIL is re-acquired for it alone; a truthy return cancels.  When
    // it has a `poll` attribute, that is called the same way inside a layer (layer = the one in
    // progress; between dense sub-chunks and expert groups, model.h), truthy cancelling too: a
    // cancel then takes effect within a sub-chunk, not a layer.  Without one, in-layer polls
    // return at once without taking the GIL.
    // Returns (logits, done): logits None when cancelled, done = tokens the slot kept.  An
    // exception raised by either callable cancels too and is re-raised here (the slot then
    // keeps `done` tokens, see n_past).
    std::pair<py::object, int64_t> eval_hooked(const std::vector<int64_t> &tokens, bool last_only,
                                               py::object progress) {
        const int64_t vocab = mg_model_vocab(m_);
        const int64_t n = static_cast<int64_t>(tokens.size());
        std::vector<int32_t> ids = checked_ids(tokens, vocab);
        const int64_t rows = n == 0 ? 0 : (last_only ? 1 : n);
        py::array_t<float> out({rows, vocab});
        if (n == 0) return {std::move(out), 0};
        float *dst = out.mutable_data();
        Hook hook{progress, progress.is_none() ? py::none() : py::getattr(progress, "poll", py::none()), nullptr};
        mg_eval_hook h{&Hook::call, &hook};
        int64_t done = 0;
        mg_error err{};
        const int rc = locked([&] {
            return mg_model_eval_hooked(m_, ids.data(), n, last_only ? 1 : 0, dst, progress.is_none() ? nullptr : &h,
                                        &done, &err);
        });
        if (hook.error) std::rethrow_exception(hook.error);
        if (rc == MG_EVAL_CANCELLED) return {py::none(), done};
        if (rc != 0) throw std::runtime_error(err.msg);
        return {std::move(out), done};
    }

    void truncate(int64_t n) {
        checked([&](mg_error *err) { return mg_model_truncate(m_, n, err); });
    }

    uint64_t prefix_bytes(int64_t n) {
        mg_error err{};
        const uint64_t bytes = locked([&] { return mg_model_prefix_bytes(m_, n, &err); });
        if (!bytes) throw std::runtime_error(err.msg);
        return bytes;
    }

    // The slot's first n tokens as one snapshot buffer (numpy uint8, filled without the GIL).
    py::array_t<uint8_t> save_prefix(int64_t n) {
        const uint64_t bytes = prefix_bytes(n);
        py::array_t<uint8_t> out(static_cast<py::ssize_t>(bytes));
        uint8_t *dst = out.mutable_data();
        checked([&](mg_error *err) { return mg_model_save_prefix(m_, n, dst, bytes, err); });
        return out;
    }

    // Replaces the slot with a snapshot's prefix; returns its length in tokens.
    int64_t restore_prefix(py::buffer snapshot) {
        py::buffer_info info = snapshot.request();
        if (info.ndim != 1 || info.itemsize != 1 || (info.ndim == 1 && info.strides[0] != 1))
            throw std::invalid_argument("a prefix snapshot is a contiguous 1-D byte buffer");
        int64_t n = 0;
        checked([&](mg_error *err) {
            const int rc = mg_model_restore_prefix(m_, info.ptr, static_cast<uint64_t>(info.size), err);
            n = mg_model_n_past(m_);
            return rc;
        });
        return n;
    }

    void reset() {
        locked([&] { mg_model_reset(m_); });
    }

    int64_t n_past() const { return mg_model_n_past(m_); }

    py::dict info() const {
        const mg_arch_info *ai = mg_model_info(m_);
        py::dict weights, weight_bytes;
        for (int f = 0; f < MG_FORMAT_COUNT; f++) {
            if (ai->weights.n_matrices[f] == 0) continue;
            const char *name = mg_format_name(static_cast<mg_format>(f));
            weights[name] = ai->weights.n_matrices[f];
            weight_bytes[name] = ai->weights.bytes[f];
        }
        py::dict d;
        d["arch"] = mg_model_arch(m_);
        d["vocab_size"] = mg_model_vocab(m_);
        d["n_layers"] = ai->n_layers;
        d["n_experts"] = ai->n_experts;
        d["n_experts_per_tok"] = ai->n_experts_per_tok;
        d["weights"] = weights;
        d["weight_bytes"] = weight_bytes;
        d["simd"] = mg_model_kernels(m_);
        d["activations"] = mg_model_activations(m_);
        d["int8_prefill"] = mg_model_int8_prefill(m_) != 0;
        d["threads"] = mg_model_threads(m_);
        d["max_ctx"] = mg_model_max_ctx(m_);
        d["model_bytes"] = mg_model_checkpoint_bytes(m_);
        d["kv_dtype"] = mg_model_kv_dtype(m_);
        d["kv_bytes_per_token"] = mg_model_kv_bytes_per_token(m_);
        d["kv_fixed_bytes"] = ai->kv_fixed_bytes;
        d["prefill_window"] = mg_model_prefill_window(m_);
        d["prefill_bytes_per_token"] = ai->prefill_bytes_per_token;
        d["expert_bytes"] = ai->experts ? mg_expert_store_expert_bytes(ai->experts) : 0;
        return d;
    }

    py::dict expert_stats() const {
        const mg_arch_info *ai = mg_model_info(m_);
        py::dict d;
        mg_expert_stats s{};
        if (ai->experts) s = mg_expert_store_stats(ai->experts);
        d["fetches"] = s.fetches;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["bytes_read"] = s.bytes_read;
        d["read_seconds"] = s.read_seconds;
        d["compute_seconds"] = s.compute_seconds;
        d["wait_seconds"] = s.wait_seconds;
        d["evictions"] = s.evictions;
        d["direct_reads"] = s.direct_reads;
        d["buffered_reads"] = s.buffered_reads;
        d["prefetches"] = s.prefetches;
        d["slots"] = s.slots;
        d["slot_bytes"] = s.slot_bytes;
        d["hot_set"] = s.hot_set;
        d["preloaded"] = s.preloaded;
        d["auto_prefetches"] = s.auto_prefetches;
        d["prefetch_hits"] = s.prefetch_hits;
        d["prefetches_withdrawn"] = s.prefetches_withdrawn;
        d["emulated_disk_bps"] = s.emulated_disk_bps;
        return d;
    }

    // Records every expert fetch to `path` (tools/routing_trace.py format); None stops and
    // closes the file.
    void trace_routing(const std::optional<std::string> &path) {
        checked([&](mg_error *err) { return mg_model_trace_routing(m_, path ? path->c_str() : nullptr, err); });
    }

    // Budgeted runs: seeds the cache from this history file (read now, its hot set
    // loaded now) and rewrites it when the model is freed.  No effect without a budget.
    void use_expert_history(const std::string &path, double pin_fraction) {
        checked([&](mg_error *err) { return mg_model_expert_history(m_, path.c_str(), pin_fraction, err); });
    }

    void set_expert_prefetch(int depth) {
        std::lock_guard<std::mutex> lock(mu_);
        mg_model_expert_prefetch(m_, depth);
    }

    // Rehearsals: the expert store's reads behave as from a disk of this speed (0: off).
    void emulate_disk(double bytes_per_second) {
        if (!(bytes_per_second >= 0.0) || !std::isfinite(bytes_per_second))
            throw std::invalid_argument("emulated disk speed must be a finite number >= 0");
        std::lock_guard<std::mutex> lock(mu_);
        mg_model_expert_emulate_disk(m_, bytes_per_second);
    }

  private:
    // The progress callable behind mg_eval_hook: runs with the GIL taken back for the call.
    struct Hook {
        py::object fn;
        py::object poll;  // fn.poll, or None: in-layer polls answer 0 without the GIL
        std::exception_ptr error;
        static int call(void *ctx, int layer, int n_layers, int64_t done, int64_t window, int in_layer) {
            auto *self = static_cast<Hook *>(ctx);
            if (in_layer && self->poll.is_none()) return 0;  // is_none reads the pointer: no GIL needed
            py::gil_scoped_acquire gil;
            try {
                const py::object &f = in_layer ? self->poll : self->fn;
                return py::bool_(f(layer, n_layers, done, window)) ? 1 : 0;
            } catch (...) {
                self->error = std::current_exception();
                return 1;
            }
        }
    };

    static std::vector<int32_t> checked_ids(const std::vector<int64_t> &tokens, int64_t vocab) {
        std::vector<int32_t> ids(tokens.size());
        for (size_t i = 0; i < tokens.size(); i++) {
            if (tokens[i] < 0 || tokens[i] >= vocab)
                throw std::runtime_error("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                         " is outside the vocabulary of " + std::to_string(vocab) + " tokens");
            ids[i] = static_cast<int32_t>(tokens[i]);
        }
        return ids;
    }

    // Runs f on the model without the GIL, one call at a time (a model holds one slot).
    template <class F>
    std::invoke_result_t<F> locked(F &&f) {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(mu_);
        return f();
    }

    // locked() for the C calls that return non-zero and fill err on failure; raises (with the
    // GIL held again) on failure.
    template <class F>
    void checked(F &&f) {
        mg_error err{};
        if (locked([&] { return f(&err); }) != 0) throw std::runtime_error(err.msg);
    }

    mg_model *m_ = nullptr;
    std::mutex mu_;
};

}  // namespace

void register_model(py::module_ &m) {
    py::class_<Model>(m, "Model", "One loaded model with one sequence slot (KV cache).")
        .def(py::init<const std::string &, const std::string &, int, const std::string &, int64_t, double,
                      const std::string &, int64_t, const std::string &>(),
             py::arg("path"), py::arg("config_json"), py::arg("threads") = 0, py::arg("kernels") = "",
             py::arg("max_ctx") = 0, py::arg("ram_gb") = 0.0, py::arg("kv_dtype") = "f32",
             py::arg("prefill_window") = 0, py::arg("activations") = "f32")
        .def("eval", &Model::eval, py::arg("tokens"), py::arg("last_only") = false,
             "Appends tokens; returns float32 logits [n, vocab] ([1, vocab] with last_only).")
        .def("eval_hooked", &Model::eval_hooked, py::arg("tokens"), py::arg("last_only"), py::arg("progress"),
             "eval with progress(layer, n_layers, done, window) called between layers and progress.poll (when "
             "present) inside them (truthy: cancel); "
             "returns (logits or None when cancelled, tokens kept).")

        .def("truncate", &Model::truncate, py::arg("n"))
        .def("reset", &Model::reset)
        .def("prefix_bytes", &Model::prefix_bytes, py::arg("n"))
        .def("save_prefix", &Model::save_prefix, py::arg("n"))
        .def("restore_prefix", &Model::restore_prefix, py::arg("snapshot"))
        .def_property_readonly("n_past", &Model::n_past)
        .def("info", &Model::info)
        .def("expert_stats", &Model::expert_stats)
        .def("trace_routing", &Model::trace_routing, py::arg("path"))
        .def("use_expert_history", &Model::use_expert_history, py::arg("path"), py::arg("pin_fraction") = 0.0)
        .def("set_expert_prefetch", &Model::set_expert_prefetch, py::arg("depth"))
        .def("emulate_disk", &Model::emulate_disk, py::arg("bytes_per_second"),
             "Rehearsals: expert reads complete no sooner than on a single-queue disk of this speed (0: off).");
}

}  // namespace moegate
