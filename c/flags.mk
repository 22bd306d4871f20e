# C compiler flags, in one place: the Makefile includes this file (C tests, sanitize builds) and
# setup.py parses it (the extension), so both compile the same code the same way.
# Only files whose name ends in _avx2.c, _avxvnni.c, _avx512.c, _avx512vnni.c or _avx512bf16.c get that ISA's flags: the
# runtime dispatcher (c/core/cpu.c) picks their tables only on a CPU with the features, so the
# shipped binary runs on any x86-64.  On arm64 NEON is baseline; only files ending in _neondot.c
# get ISA_neondot (the dot-product extension, sdot) and those ending in _neoni8mm.c ISA_neoni8mm
# (the int8 matrix multiply, smmla, with sdot), and the neon table takes their entries only on a
# CPU whose HWCAP has them, so the binary runs on any arm64.
C_FLAGS := -std=c11 -O3 -fno-math-errno -Wall -Wextra -Wno-unused-parameter
ISA_avx2 := -mavx2 -mfma -mf16c
ISA_avxvnni := -mavx2 -mfma -mf16c -mavxvnni
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c
ISA_avx512vnni := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c
ISA_avx512bf16 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx2 -mfma -mf16c
ISA_neondot := -march=armv8.2-a+dotprod
ISA_neoni8mm := -march=armv8.2-a+dotprod+i8mm
# Flags an older compiler may not know (GCC < 10; -mavxvnni: GCC < 11): dropped where the compiler
# rejects them; the file then builds as its stub, whose table (or entry) reports itself unavailable.
ISA_OPTIONAL := -mavx512bf16 -mavx512vnni -mavxvnni
# The same on arm64 (+dotprod: GCC < 8, clang < 6; +i8mm: GCC < 10, clang < 11).
ISA_OPTIONAL_ARM := -march=armv8.2-a+dotprod -march=armv8.2-a+dotprod+i8mm
