"""Build the gateway._core extension from c/.

Every C source is compiled for the baseline of the target (x86-64 or arm64) with the flags of
c/flags.mk, the file the Makefile's C-test builds include too. Files named *_avx2.c hold the
AVX2/FMA/F16C kernels, *_avxvnni.c those that also use AVX-VNNI (ymm vpdpbusd), *_avx512.c the
AVX-512 (F/BW/VL/DQ) ones, *_avx512vnni.c and *_avx512bf16.c those that also use AVX512_VNNI /
AVX512_BF16; only they get those instruction-set flags, and the runtime dispatcher
(c/core/cpu.c) picks them only on a CPU that has the features. This keeps one shipped binary
that runs on any x86-64. On arm64 the same holds for *_neondot.c (the dot-product extension,
sdot) and *_neoni8mm.c (the int8 matrix multiply, smmla): NEON itself is baseline there.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
C_DIR = ROOT / "c"


def _read_flags(path: Path) -> dict[str, list[str]]:
    """The `NAME := flags` lines of c/flags.mk, which the Makefile includes: one list of flags."""
    flags = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, value = line.partition(":=")
        if sep and not line.lstrip().startswith("#"):
            flags[name.strip()] = value.split()
    return flags


FLAGS = _read_flags(C_DIR / "flags.mk")
ISA_FLAGS = {f"_{isa}.c": FLAGS[f"ISA_{isa}"] for isa in ("avx2", "avxvnni", "avx512", "avx512vnni", "avx512bf16")}
OPTIONAL_FLAGS = set(FLAGS["ISA_OPTIONAL"])
ISA_FLAGS_ARM = {f"_{isa}.c": FLAGS[f"ISA_{isa}"] for isa in ("neondot", "neoni8mm")}
OPTIONAL_FLAGS_ARM = set(FLAGS["ISA_OPTIONAL_ARM"])
COMMON_C_FLAGS = FLAGS["C_FLAGS"]


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _is_arm64() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def _sanitize_flags() -> list[str]:
    return ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"] if os.environ.get("MOEGATE_SANITIZE") else []


def c_sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in C_DIR.rglob("*.c"))


def _compiler_accepts(compiler, flag: str, build_temp: str) -> bool:
    """Whether the C compiler builds an empty file with this flag."""
    probe = Path(build_temp) / "flag_probe.c"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("int moegate_flag_probe;\n")
    try:
        compiler.compile([str(probe)], output_dir=build_temp, extra_postargs=[flag])
        return True
    except Exception:  # setuptools raises CompileError; any failure means "not supported"
        return False


class BuildCore(build_ext):
    """Compiles the C files itself so that ISA-specific files get their own flags."""

    def build_extension(self, ext):
        c_files = [s for s in ext.sources if s.endswith(".c")]
        ext.sources = [s for s in ext.sources if not s.endswith(".c")]
        # The C files are compiled here, so setuptools' staleness check must still see them.
        ext.depends = list(ext.depends) + c_files
        objects = []
        san = _sanitize_flags()
        # the instruction-set files of the machine built for (none elsewhere), and the flags of
        # theirs this compiler does not know (dropped: such a file builds as its stub)
        isa_flags = ISA_FLAGS if _is_x86() else ISA_FLAGS_ARM if _is_arm64() else {}
        optional = OPTIONAL_FLAGS if _is_x86() else OPTIONAL_FLAGS_ARM if _is_arm64() else set()
        unknown = {f for f in optional if not _compiler_accepts(self.compiler, f, self.build_temp)}
        for src in c_files:
            flags = list(COMMON_C_FLAGS) + san
            for suffix, isa in isa_flags.items():
                if src.endswith(suffix):
                    flags += [f for f in isa if f not in unknown]
            objects += self.compiler.compile(
                [src], output_dir=self.build_temp, include_dirs=ext.include_dirs,
                extra_postargs=flags, depends=ext.depends,
            )
        ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extension(ext)


ext = Pybind11Extension(
    "gateway._core",
    sources=sorted(str(p.relative_to(ROOT)) for p in (C_DIR / "bindings").glob("*.cpp")) + c_sources(),
    include_dirs=[str(C_DIR)],
    depends=sorted(str(p.relative_to(ROOT)) for p in C_DIR.rglob("*.h")),
    cxx_std=17,
    extra_compile_args=["-O3"] + _sanitize_flags(),
    extra_link_args=["-lpthread"] + (["-fsanitize=address,undefined"] if os.environ.get("MOEGATE_SANITIZE") else []),
)

# The Makefile builds the extension itself, in place and only when a C file changed, and sets
# MOEGATE_NO_EXT for its `pip install -e .` runs, which would otherwise compile every file again.
setup(ext_modules=[] if os.environ.get("MOEGATE_NO_EXT") else [ext], cmdclass={"build_ext": BuildCore})
