// Kernel entry points for tests and benchmarks: every kernel table this CPU runs, the threaded
// linear layer (mg_linear through the thread pool), the scalar dequantiser, and the vector ops.
// Nothing here is on the Engine's path; it exists so Python can check and time the kernels.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bindings.h"

extern "C" {
#include "core/cpu.h"
#include "core/formats.h"
#include "core/kernels.h"
#include "core/linear.h"
#include "core/matrix.h"
#include "core/threadpool.h"
}

namespace py = pybind11;

namespace moegate {
namespace {

using f32_array = py::array_t<float, py::array::c_style | py::array::forcecast>;

const mg_kernels *table_by_name(const std::string &name) {
    const mg_kernels *k = mg_kernels_named(name.c_str());
    if (!k) throw std::invalid_argument("kernel table '" + name + "' is unknown or not supported by this CPU");
    return k;
}

mg_format format_by_name(const std::string &name) {
    for (int f = 0; f < MG_FORMAT_COUNT; f++)
        if (name == mg_format_name(static_cast<mg_format>(f))) return static_cast<mg_format>(f);
    if (name == "fp8") return MG_FP8_E4M3;
    if (name == "fp4") return MG_FP4_E2M1;
    throw std::invalid_argument("unknown weight format '" + name +
                                "' (f32, bf16, f16, fp8_e4m3, fp4_e2m1, q8_0, q4_0, q5_0, q4_k, q5_k, q6_k, mxfp4, "
                                "iq4_nl, iq4_xs, q4_1, q5_1, q2_k, q3_k, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m)");
}

const char *const kScaleNames[] = {"none", "f32_block128", "e8m0_block128", "e8m0_g32", "f32_row"};
static_assert(sizeof kScaleNames / sizeof *kScaleNames == MG_SCALE_KIND_COUNT, "a name per scale kind");

mg_scale_kind scale_by_name(const std::string &name) {
    for (int k = 0; k < MG_SCALE_KIND_COUNT; k++)
        if (name == kScaleNames[k]) return static_cast<mg_scale_kind>(k);
    throw std::invalid_argument("unknown scale kind '" + name + "' (none, f32_block128, e8m0_block128, e8m0_g32, f32_row)");
}

// One pool per thread count, created on first use and kept for the process: creating threads
// per call would dominate small benchmarks.  The mutex also serialises use of each pool, which
// runs one task at a time.
struct PoolCache {
    std::mutex mu;
    std::map<int, mg_pool *> pools;
};

PoolCache &pool_cache() {
    static PoolCache *cache = new PoolCache();  // never destroyed: workers may outlive static teardown
    return *cache;
}

mg_pool *pool_for(int threads) {
    PoolCache &c = pool_cache();
    auto it = c.pools.find(threads);
    if (it != c.pools.end()) return it->second;
    mg_error err{};
    mg_pool *p = mg_pool_create(threads, &err);
    if (!p) throw std::runtime_error(std::string("thread pool: ") + err.msg);
    c.pools[threads] = p;
    return p;
}

// A view of numpy-owned bytes as an mg_matrix, with every size checked.
mg_matrix make_matrix(const std::string &fmt, const std::string &scale_kind, const py::array &data,
                      const py::object &scale, int64_t rows, int64_t cols) {
    mg_matrix m{};
    m.format = format_by_name(fmt);
    m.scale_kind = scale_by_name(scale_kind);
    m.rows = rows;
    m.cols = cols;
    if (rows <= 0 || cols <= 0) throw std::invalid_argument("rows and cols must be positive");
    if (m.format == MG_FP4_E2M1 && cols % 2) throw std::invalid_argument("fp4_e2m1 needs an even number of columns");
    if (mg_format_is_ggml_block(m.format)) { /* raw GGUF block bytes: whole, self-scaled blocks */
        int64_t e, b;
        mg_format_block(m.format, &e, &b);
        if (cols % e) throw std::invalid_argument(fmt + " needs cols to be a multiple of " + std::to_string(e));
        if (m.scale_kind != MG_SCALE_NONE) throw std::invalid_argument(fmt + " blocks carry their own scales: scale kind must be 'none'");
    }
    if (m.scale_kind == MG_SCALE_E8M0_G32 && cols % 32)
        throw std::invalid_argument("e8m0_g32 scales need cols to be a multiple of 32");
    if (!(data.flags() & py::array::c_style)) throw std::invalid_argument("weight data must be C-contiguous");
    const size_t need = (size_t)rows * mg_matrix_row_bytes(&m);
    if ((size_t)data.nbytes() != need)
        throw std::invalid_argument("weight data has " + std::to_string(data.nbytes()) + " bytes, expected " +
                                    std::to_string(need));
    m.data = data.data();
    int64_t srows = 0;
    switch (m.scale_kind) {
    case MG_SCALE_F32_BLOCK128:
    case MG_SCALE_E8M0_BLOCK128: srows = (rows + 127) / 128; m.scale_cols = (cols + 127) / 128; break;
    case MG_SCALE_E8M0_G32: srows = rows; m.scale_cols = cols / 32; break;
    case MG_SCALE_F32_ROW: srows = rows; m.scale_cols = 1; break;
    default: break;
    }
    if (m.scale_kind == MG_SCALE_NONE) {
        if (!scale.is_none()) throw std::invalid_argument("scale given for scale kind 'none'");
        return m;
    }
    if (scale.is_none()) throw std::invalid_argument(std::string("scale kind '") + kScaleNames[m.scale_kind] + "' needs a scale array");
    py::array s = py::reinterpret_borrow<py::array>(scale);
    if (!(s.flags() & py::array::c_style)) throw std::invalid_argument("scale must be C-contiguous");
    const size_t elem = m.scale_kind == MG_SCALE_F32_BLOCK128 || m.scale_kind == MG_SCALE_F32_ROW ? 4 : 1;
    const size_t sneed = (size_t)srows * (size_t)m.scale_cols * elem;
    if ((size_t)s.nbytes() != sneed)
        throw std::invalid_argument("scale has " + std::to_string(s.nbytes()) + " bytes, expected " + std::to_string(sneed));
    m.scale = s.data();
    return m;
}

py::array_t<float> linear(const std::string &table, const std::string &fmt, const std::string &scale_kind,
                          const py::array &data, const py::object &scale, int64_t rows, int64_t cols, const f32_array &x,
                          int threads) {
    const mg_kernels *k = table_by_name(table);
    mg_matrix m = make_matrix(fmt, scale_kind, data, scale, rows, cols);
    if (x.ndim() < 1 || x.ndim() > 2 || x.shape(x.ndim() - 1) != cols)
        throw std::invalid_argument("x must be [cols] or [n_tok, cols] with cols = " + std::to_string(cols));
    const int64_t n_tok = x.ndim() == 2 ? x.shape(0) : 1;
    py::array_t<float> y({n_tok, rows});
    if (n_tok == 0) return y;
    float *yp = y.mutable_data();
    const float *xp = x.data();
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(pool_cache().mu);
        mg_compute c{pool_for(threads), k};
        mg_linear(&c, &m, xp, n_tok, yp);
    }
    return y;
}

py::array_t<float> decode(const std::string &fmt, const std::string &scale_kind, const py::array &data,
                          const py::object &scale, int64_t rows, int64_t cols) {
    mg_matrix m = make_matrix(fmt, scale_kind, data, scale, rows, cols);
    py::array_t<float> out({rows, cols});
    float *o = out.mutable_data();
    for (int64_t r = 0; r < rows; r++) mg_matrix_row_f32(&m, r, o + r * cols);
    return out;
}

// The scalar dequantisation of raw ggml block bytes (rows of cols / block-size blocks): the ground
// truth tests compare with gguf-py's dequantize.
// raw: a C-contiguous array of any dtype (its bytes are read), or bytes / bytearray / memoryview.
py::array_t<float> dequantize(const std::string &fmt, const py::object &raw, int64_t rows, int64_t cols) {
    if (!mg_format_is_ggml_block(format_by_name(fmt)))
        throw std::invalid_argument("dequantize takes a ggml block format, not '" + fmt + "'");
    py::array a = py::isinstance<py::array>(raw) ? py::reinterpret_borrow<py::array>(raw)
                                                  : py::array(py::module_::import("numpy").attr("frombuffer")(raw, "uint8"));
    return decode(fmt, "none", a, py::none(), rows, cols);
}

struct ReadSumJob {
    const mg_kernels *k;
    const float *p;
    int64_t n;
    std::vector<float> partial;
};

void read_sum_task(void *ctx, int worker, int n_workers) {
    auto *job = static_cast<ReadSumJob *>(ctx);
    int64_t b, e;
    mg_split_range(job->n, 1024, worker, n_workers, &b, &e);
    job->partial[worker] = b < e ? job->k->read_sum(job->p + b, e - b) : 0.0f;
}

double read_sum(const std::string &table, const f32_array &buf, int threads) {
    ReadSumJob job{table_by_name(table), buf.data(), (int64_t)buf.size(), {}};
    double total = 0.0;
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(pool_cache().mu);
        mg_pool *pool = pool_for(threads);
        job.partial.assign((size_t)mg_pool_threads(pool), 0.0f);
        mg_pool_run(pool, read_sum_task, &job);
    }
    for (float v : job.partial) total += v;
    return total;
}

void check_same(const f32_array &a, const f32_array &b, const char *what) {
    if (a.size() != b.size()) throw std::invalid_argument(std::string(what) + ": arrays differ in length");
}

}  // namespace

void register_kernels(py::module_ &m) {
    m.def("kernel_tables", [] {
        std::vector<std::string> names;
        for (const char *n : {"scalar", "avx2", "avx512", "avx512bf16", "neon"})
            if (mg_kernels_named(n)) names.emplace_back(n);
        return names;
    }, "Names of the kernel tables this CPU can run, slowest first.");
    m.def("best_kernel_table", [] { return std::string(mg_kernels_best()->name); });
    m.def("cpu_features", [] {
        mg_cpu_features f = mg_cpu_detect();
        py::dict d;
        d["avx2"] = (bool)f.avx2;
        d["fma"] = (bool)f.fma;
        d["f16c"] = (bool)f.f16c;
        d["avx512f"] = (bool)f.avx512f;
        d["avx512"] = (bool)f.avx512;  // F+BW+VL+DQ with ZMM state enabled: the avx512 table runs
        d["avx512bf16"] = (bool)f.avx512bf16;  // and vdpbf16ps: the avx512bf16 table runs
        d["avx512vnni"] = (bool)f.avx512vnni;  // and zmm vpdpbusd: the avx512 table's int8 entries
        d["avxvnni"] = (bool)f.avxvnni;  // ymm vpdpbusd (no AVX-512 needed): the avx2 table's int8 GEMM
        d["neon"] = (bool)f.neon;
        d["neondot"] = (bool)f.neondot;  // arm64 sdot: the neon table's int8 GEMM
        // the vendor rules (x86): fp8 decoded without fp32 denormals; the int8 rows prefetching into L2
        d["denormal_assists"] = (bool)f.denormal_assists;
        d["prefetch_l2"] = (bool)f.prefetch_l2;
        return d;
    });
    m.def("linear", &linear, py::arg("table"), py::arg("fmt"), py::arg("scale_kind"), py::arg("data"),
          py::arg("scale"), py::arg("rows"), py::arg("cols"), py::arg("x"), py::arg("threads") = 1,
          "y[n_tok, rows] = x[n_tok, cols] . W^T with W in its stored format, rows split over `threads` "
          "(<= 0: all cores) by mg_linear.");
    m.def("decode", &decode, py::arg("fmt"), py::arg("scale_kind"), py::arg("data"), py::arg("scale"),
          py::arg("rows"), py::arg("cols"), "Dequantise W to float32 [rows, cols] with the scalar reference decoders.");
    m.def("dequantize", &dequantize, py::arg("fmt"), py::arg("raw"), py::arg("rows"), py::arg("cols"),
          "float32 [rows, cols] from raw ggml block bytes (q8_0, q4_0, q5_0, q4_k, q5_k, q6_k, mxfp4, iq4_nl, "
          "iq4_xs, q4_1, q5_1, q2_k, q3_k, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m), through the scalar decoder (c/core/ggml_blocks.h)");
    m.def("read_sum", &read_sum, py::arg("table"), py::arg("buf"), py::arg("threads") = 1,
          "Sum of a float32 buffer read by `threads` workers: the memory-bandwidth yardstick.");
    m.def("dot", [](const std::string &table, const f32_array &a, const f32_array &b) {
        check_same(a, b, "dot");
        return table_by_name(table)->dot(a.data(), b.data(), (int64_t)a.size());
    });
    m.def("axpy", [](const std::string &table, const f32_array &y, float alpha, const f32_array &x) {
        check_same(y, x, "axpy");
        py::array_t<float> out(y.size());
        std::memcpy(out.mutable_data(), y.data(), (size_t)y.size() * sizeof(float));
        table_by_name(table)->axpy(out.mutable_data(), alpha, x.data(), (int64_t)x.size());
        return out;
    }, "Returns y + alpha * x.");
    m.def("scale", [](const std::string &table, const f32_array &y, float alpha) {
        py::array_t<float> out(y.size());
        std::memcpy(out.mutable_data(), y.data(), (size_t)y.size() * sizeof(float));
        table_by_name(table)->scale(out.mutable_data(), alpha, (int64_t)y.size());
        return out;
    }, "Returns alpha * y.");
    m.def("rmsnorm", [](const std::string &table, const f32_array &x, const py::object &w, float eps) {
        py::array_t<float> out(x.size());
        const float *wp = nullptr;
        f32_array wa;
        if (!w.is_none()) {
            wa = w.cast<f32_array>();
            check_same(x, wa, "rmsnorm");
            wp = wa.data();
        }
        table_by_name(table)->rmsnorm(out.mutable_data(), x.data(), wp, (int64_t)x.size(), eps);
        return out;
    }, py::arg("table"), py::arg("x"), py::arg("w"), py::arg("eps"));
    m.def("swiglu", [](const std::string &table, const f32_array &gate, const f32_array &up, float limit) {
        check_same(gate, up, "swiglu");
        py::array_t<float> out(gate.size());
        table_by_name(table)->swiglu(out.mutable_data(), gate.data(), up.data(), (int64_t)gate.size(), limit);
        return out;
    }, py::arg("table"), py::arg("gate"), py::arg("up"), py::arg("limit") = 0.0f);
}

}  // namespace moegate
