#!/usr/bin/env bash
# Cross-builds the C tests for arm64 and runs them under qemu-user, so the NEON kernels are
# checked against their scalar twins on an x86-64 machine.
#
#   tools/neon_check.sh                 every tests/c/test_*.c
#   tools/neon_check.sh test_kernels    only the named tests
#
# Environment: CROSS_CC (default aarch64-linux-gnu-gcc), QEMU (default qemu-aarch64),
# NEON_BUILD (default build/neon), NEON_INSTALL=0 to never install the toolchain, QEMU_CPU (read
# by qemu itself; default "max", which has the dot-product extension): e.g. QEMU_CPU=cortex-a53
# runs everything on a CPU without it, where the neon table keeps its int8 rows and no GEMM.
# Exit status: 0 all passed, 1 a build or test failed, 2 the toolchain is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
CROSS_CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU:-qemu-aarch64}
OUT=${NEON_BUILD:-build/neon}
CFLAGS=(-std=c11 -O2 -g -Wall -Wextra -Wno-unused-parameter -Ic)
# files named *_neondot.c get the dot-product flags, as in the Makefile and setup.py (c/flags.mk)
read -r -a NEONDOT_FLAGS <<<"$(sed -n 's/^ISA_neondot := //p' c/flags.mk)"
read -r -a NEONI8MM_FLAGS <<<"$(sed -n 's/^ISA_neoni8mm := //p' c/flags.mk)"

# ---- toolchain: install with apt when missing and allowed (root, or passwordless sudo) ------
have_tools() { command -v "$CROSS_CC" >/dev/null && command -v "$QEMU" >/dev/null; }
if ! have_tools; then
    packages="gcc-aarch64-linux-gnu qemu-user"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null && sudo_cmd="sudo -n"
    if [ "${NEON_INSTALL:-1}" != 0 ] && command -v apt-get >/dev/null &&
        { [ "$(id -u)" -eq 0 ] || [ -n "$sudo_cmd" ]; }; then
        echo "neon_check: installing $packages"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $packages >/dev/null
    fi
fi
if ! have_tools; then
    echo "neon_check: need $CROSS_CC and $QEMU (Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu qemu-user)" >&2
    exit 2
fi

# ---- build: every C source except the Python binding, as the Makefile's C tests do ----------
mkdir -p "$OUT/obj"
objs=()
while IFS= read -r src; do
    obj="$OUT/obj/$(echo "${src#c/}" | tr / _).o"
    isa=()
    case "$src" in
    *_neondot.c) isa=("${NEONDOT_FLAGS[@]}") ;;
    *_neoni8mm.c) isa=("${NEONI8MM_FLAGS[@]}") ;;
    esac
    "$CROSS_CC" "${CFLAGS[@]}" "${isa[@]}" -c "$src" -o "$obj"
    objs+=("$obj")
done < <(find c -name '*.c' -not -path 'c/bindings/*' | sort)

# A probe that fails unless the NEON table is what an arm64 CPU selects, unless it has its own
# fp32 entry for every ggml block format, unless it has the int8 GEMM exactly when the CPU has
# the dot-product extension, and unless that GEMM is the smmla one exactly when the CPU has the
# int8 matrix multiply: otherwise the kernel tests would silently compare scalar against scalar,
# the rows against the rows, or leave one GEMM unchecked.
cat >"$OUT/probe.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include "core/cpu.h"
#include "core/kernels.h"
#include "kernels/neon/neon.h"
int main(void) {
    const mg_kernels *k = mg_kernels_best(), *s = mg_kernels_scalar();
    const mg_cpu_features cpu = mg_cpu_detect();
    const int smmla = k->linear_q8[MG_Q8_0] == mg_neoni8mm_linear_q8();
    printf("neon_check: best kernel table on arm64: %s; dot product %s, int8 matrix multiply %s, int8 GEMM %s%s\n",
           k->name, cpu.neondot ? "yes" : "no", cpu.neoni8mm ? "yes" : "no", k->linear_q8_gemm ? "yes" : "no",
           smmla ? " (smmla)" : k->linear_q8_gemm ? " (sdot)" : "");
    int bad = strcmp(k->name, "neon") != 0 || !k->linear_q8_gemm != !cpu.neondot || !smmla != !cpu.neoni8mm;
    for (int f = 0; f < MG_FORMAT_COUNT; f++)
        if (mg_format_is_ggml_block((mg_format)f) && k->linear[f] == s->linear[f]) {
            printf("neon_check: %s keeps the scalar fp32 linear entry\n", mg_format_name((mg_format)f));
            bad = 1;
        }
    return bad;
}
EOF

if [ $# -gt 0 ]; then
    tests=()
    for name in "$@"; do tests+=("tests/c/${name%.c}.c"); done
else
    tests=(tests/c/test_*.c)
fi

failed=()
run() { # name binary
    echo "== $1 (aarch64, qemu)"
    if "$QEMU" "$2"; then :; else failed+=("$1"); fi
}

"$CROSS_CC" "${CFLAGS[@]}" -static "$OUT/probe.c" "${objs[@]}" -lm -lpthread -o "$OUT/probe"
run probe "$OUT/probe"
for t in "${tests[@]}"; do
    name=$(basename "$t" .c)
    if ! "$CROSS_CC" "${CFLAGS[@]}" -static "$t" "${objs[@]}" -lm -lpthread -o "$OUT/$name"; then
        failed+=("$name (build)")
        continue
    fi
    run "$name" "$OUT/$name"
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "neon_check: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "neon_check: all arm64 tests passed"
