// gateway._core: the native half of moegate.  Each binding file registers its own functions.
#include "bindings/bindings.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "moegate C core: SIMD kernels, safetensors and GGUF readers, MoE forward passes";
    moegate::register_kernels(m);
    moegate::register_model(m);
    moegate::register_gguf(m);
}
