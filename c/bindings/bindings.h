// Registration hooks of the gateway._core module: one function per binding file.
#pragma once
#include <pybind11/pybind11.h>

namespace moegate {
void register_model(pybind11::module_ &m);    // model_binding.cpp: the Engine's native half
void register_kernels(pybind11::module_ &m);  // kernels_binding.cpp: kernel entry points for tests and benches
void register_gguf(pybind11::module_ &m);     // gguf_binding.cpp: the GGUF reader's view of a file
}  // namespace moegate
