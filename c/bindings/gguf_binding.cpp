// gguf_inspect / gguf_types: the C GGUF reader (c/io/gguf.c) seen from Python, so tests can
// compare it with the gguf package's own reader and the model path can later read metadata.
// A file the reader refuses raises ValueError carrying the reader's message.
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>

#include "bindings/bindings.h"

extern "C" {
#include "io/gguf.h"
}

namespace py = pybind11;

namespace moegate {
namespace {

// Strings (keys and names too) are UTF-8 in the format; a file that breaks that still gets its
// bytes back rather than an exception the caller would not expect from a readable file.
py::object text(const char *s, size_t len) {
    PyObject *u = PyUnicode_DecodeUTF8(s, static_cast<Py_ssize_t>(len), "strict");
    if (u) return py::reinterpret_steal<py::object>(u);
    PyErr_Clear();
    return py::bytes(s, len);
}

// The reader's message may quote a corrupt name's bytes, or be cut inside a UTF-8 sequence at
// the message's length limit: decoded with replacement, so the caller gets ValueError with the
// text rather than a UnicodeDecodeError about it.
[[noreturn]] void raise_value_error(const char *msg) {
    PyObject *u = PyUnicode_DecodeUTF8(msg, static_cast<Py_ssize_t>(std::strlen(msg)), "replace");
    if (!u) throw py::error_already_set();
    PyErr_SetObject(PyExc_ValueError, u);
    Py_DECREF(u);
    throw py::error_already_set();
}

py::object element(const mg_gguf_kv *kv, uint64_t i) {
    int64_t iv;
    uint64_t uv;
    double fv;
    int bv;
    size_t len;
    switch (kv->elem_type) {
    case MG_GGUF_BOOL:
        mg_gguf_kv_bool_at(kv, i, &bv);
        return py::bool_(bv != 0);
    case MG_GGUF_F32:
    case MG_GGUF_F64:
        mg_gguf_kv_float_at(kv, i, &fv);
        return py::float_(fv);
    case MG_GGUF_STRING: {
        const char *s = mg_gguf_kv_string_at(kv, i, &len);
        return text(s, len);
    }
    case MG_GGUF_U64:
        mg_gguf_kv_uint_at(kv, i, &uv);
        return py::int_(uv);
    default:
        mg_gguf_kv_int_at(kv, i, &iv);
        return py::int_(iv);
    }
}

py::object value(const mg_gguf_kv *kv) {
    if (kv->type != MG_GGUF_ARRAY) return element(kv, 0);
    py::list out;
    for (uint64_t i = 0; i < kv->count; i++) out.append(element(kv, i));
    return std::move(out);
}

std::string type_label(const mg_gguf_kv *kv) {
    if (kv->type != MG_GGUF_ARRAY) return mg_gguf_vtype_name(kv->type);
    return std::string("array[") + mg_gguf_vtype_name(kv->elem_type) + "]";
}

py::dict inspect(const std::string &path, bool arrays, uint64_t small_arrays) {
    mg_error err{};
    mg_gguf *g;
    {
        py::gil_scoped_release nogil;
        g = mg_gguf_open(path.c_str(), &err);
    }
    if (!g) raise_value_error(err.msg);
    py::dict out, meta, types;
    py::list tensors;
    try {
        out["version"] = mg_gguf_version(g);
        out["alignment"] = mg_gguf_alignment(g);
        out["data_offset"] = mg_gguf_data_offset(g);
        out["file_size"] = mg_gguf_file_size(g);
        for (size_t i = 0; i < mg_gguf_kv_count(g); i++) {
            const mg_gguf_kv *kv = mg_gguf_kv_at(g, i);
            py::object key = text(kv->key, std::strlen(kv->key));
            // Without arrays a model's metadata is a few dozen scalars: the 150k-entry token
            // lists are left in the file.  Short numeric arrays (deepseek4's per-layer compress
            // ratios and clamps) are config, so a caller may keep those up to small_arrays.
            bool small = kv->type == MG_GGUF_ARRAY && kv->elem_type != MG_GGUF_STRING && kv->count <= small_arrays;
            if (arrays || kv->type != MG_GGUF_ARRAY || small) meta[key] = value(kv);
            types[key] = type_label(kv);
        }
        for (size_t i = 0; i < mg_gguf_tensor_count(g); i++) {
            const mg_gguf_tensor *t = mg_gguf_tensor_at(g, i);
            const mg_ggml_type *ty = mg_ggml_type_info(t->type);
            py::dict d;
            py::list shape;
            for (int k = 0; k < t->n_dims; k++) shape.append(t->ne[k]);
            d["name"] = text(t->name, std::strlen(t->name));
            d["type"] = ty->name;
            d["type_id"] = t->type;
            d["supported"] = ty->supported != 0;
            d["shape"] = shape;  // ggml order: shape[0] is the contiguous row
            d["row_bytes"] = t->row_bytes;
            d["nbytes"] = t->nbytes;
            d["offset"] = t->offset;
            d["file_offset"] = t->file_offset;
            tensors.append(d);
        }
    } catch (...) {
        mg_gguf_close(g);
        throw;
    }
    mg_gguf_close(g);
    out["metadata"] = meta;
    out["metadata_types"] = types;
    out["tensors"] = tensors;
    return out;
}

}  // namespace

void register_gguf(py::module_ &m) {
    m.def("gguf_inspect", &inspect, py::arg("path"), py::arg("arrays") = true, py::arg("small_arrays") = 0,
          "Open a GGUF file with the C reader and return {version, alignment, data_offset, file_size, "
          "metadata: {key: value}, metadata_types: {key: 'u32' | 'array[string]' | ...}, tensors: [{name, "
          "type, type_id, supported, shape (ggml order, ne[0] first), row_bytes, nbytes, offset (in the "
          "data section), file_offset}]}.  With arrays=False, array-valued keys are left out of metadata "
          "(their metadata_types entry stays), except numeric arrays of at most small_arrays elements.  A file the reader refuses raises ValueError.");
    m.def("gguf_types", [] {
        py::list out;
        for (uint32_t id = 0; id < mg_ggml_type_id_end(); id++) {
            const mg_ggml_type *ty = mg_ggml_type_info(id);
            if (!ty) continue;
            py::dict d;
            d["id"] = id;
            d["name"] = ty->name;
            d["block_size"] = ty->block_size;
            d["type_size"] = ty->type_size;
            d["supported"] = ty->supported != 0;
            out.append(d);
        }
        return out;
    }, "The ggml type table of the GGUF reader: id, name, block_size, type_size, supported.");
}

}  // namespace moegate
