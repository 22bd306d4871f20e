/* FNV-1a over a NUL-terminated string: the tensor-name index of the safetensors and GGUF readers. */
#ifndef MG_HASH_H
#define MG_HASH_H

#include <stdint.h>

static inline uint64_t mg_hash_string(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

#endif
