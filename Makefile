# moegate — build, test, serve, bench.
#   make            create .venv (from the system python3), install runtime deps, build the C core in place
#   make test       C tests + lint (ruff) + the pytest suite (installs test deps into .venv: torch CPU, transformers, SDKs)
#   make serve      build and serve (the demo checkpoint unless MODEL=DIR); HOST=, PORT=, ARGS= honoured
#   make rehearse   full-size sparse rehearsals (tools/rehearse.py; slow, not part of make test)
#   make bench      benchmarks (ratios measured side by side in one run)
#   make sanitize   ASan+UBSan build; the C tests and the C-facing Python tests under it
#   make fuzz       one bounded schemathesis run (tools/fuzz_api.py) against a demo server's /openapi.json
#   make llamacpp   llama.cpp's llama-bench and llama-quantize, built once into ~/.cache/moegate/llama.cpp
#                   (make bench, tests/test_gguf_llamacpp.py and tests/test_gguf_deepseek4.py use them;
#                   those tests are skipped without them)
#
# Everything Python lives in the virtual environment $(VENV), made from $(SYSTEM_PYTHON) without
# the machine's site-packages, so a fresh machine needs nothing installed by hand.  Afterwards:
#   .venv/bin/python -m gateway --model DIR --ram 22      (or: . .venv/bin/activate)
# PYTHON=/some/python uses that interpreter (and its packages) instead of the venv.

SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PIP = $(PYTHON) -m pip -q --disable-pip-version-check
# What the build needs before `pip install --no-build-isolation` (the same floor as
# pyproject.toml's [build-system] requires; tests/test_packaging.py keeps the two equal).
# setuptools >= 77 reads PEP 639's `license = "SPDX"`; older ones reject it.
BUILD_REQUIRES := setuptools>=77 wheel pybind11>=2.12
HOST ?= 127.0.0.1
PORT ?= 8000
ARCH := $(shell uname -m)

C_SRCS := $(shell find c -name '*.c' | sort)
C_HDRS := $(shell find c -name '*.h' | sort)
C_TESTS := $(wildcard tests/c/test_*.c)
include c/flags.mk
CFLAGS_BASE := $(C_FLAGS) -g -Ic
ifeq ($(ARCH),x86_64)
ISA_UNKNOWN := $(foreach f,$(ISA_OPTIONAL),$(shell $(CC) $(f) -x c -c /dev/null -o /dev/null 2>/dev/null || echo $(f)))
isa_flags = $(filter-out $(ISA_UNKNOWN),$(if $(findstring _avx2.c,$(1)),$(ISA_avx2))$(if $(findstring _avxvnni.c,$(1)),$(ISA_avxvnni))$(if $(findstring _avx512.c,$(1)),$(ISA_avx512))$(if $(findstring _avx512vnni.c,$(1)),$(ISA_avx512vnni))$(if $(findstring _avx512bf16.c,$(1)),$(ISA_avx512bf16)))
endif
ifneq ($(filter aarch64 arm64,$(ARCH)),)
ISA_UNKNOWN := $(foreach f,$(ISA_OPTIONAL_ARM),$(shell $(CC) $(f) -x c -c /dev/null -o /dev/null 2>/dev/null || echo $(f)))
isa_flags = $(filter-out $(ISA_UNKNOWN),$(if $(findstring _neondot.c,$(1)),$(ISA_neondot))$(if $(findstring _neoni8mm.c,$(1)),$(ISA_neoni8mm)))
endif

.SECONDARY:

.PHONY: all install deps test-deps build test test-c tools-c test-py lint serve rehearse bench sanitize fuzz llamacpp neon-check tsan clean

all: install

# ---- the environment: stamps so a second `make test` does not run pip again ---------------
STAMPS := $(if $(filter $(VENV)/bin/python,$(PYTHON)),$(VENV),build/env)

$(VENV)/bin/python:
	$(SYSTEM_PYTHON) -m venv $(VENV)

$(STAMPS)/.build-tools: $(if $(filter $(VENV)/bin/python,$(PYTHON)),$(VENV)/bin/python)
	@mkdir -p $(dir $@)
	$(PIP) install --upgrade pip $(foreach r,$(BUILD_REQUIRES),'$(r)')
	@touch $@

# MOEGATE_NO_EXT: pip installs the dependencies and the editable package; the extension is the
# `build` target's (setup.py build_ext --inplace), so it is compiled once, not by every pip run.
$(STAMPS)/.deps: pyproject.toml setup.py $(STAMPS)/.build-tools
	MOEGATE_NO_EXT=1 $(PIP) install -e . --no-build-isolation
	@touch $@

$(STAMPS)/.test-deps: pyproject.toml setup.py $(STAMPS)/.deps
	MOEGATE_NO_EXT=1 $(PIP) install -e '.[test]' --no-build-isolation
	@touch $@

deps: $(STAMPS)/.deps

install: deps build

test-deps: $(STAMPS)/.test-deps

build: python/gateway/.core-built

python/gateway/.core-built: $(C_SRCS) $(C_HDRS) $(wildcard c/bindings/*.cpp) setup.py c/flags.mk | $(STAMPS)/.build-tools
	$(PYTHON) setup.py -q build_ext --inplace
	@touch $@

# ---- C tests: each tests/c/test_X.c links every C source except the Python binding ----------
OBJDIR ?= build/c
TESTDIR ?= build/tests

$(OBJDIR)/%.o: c/%.c $(C_HDRS) c/flags.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SAN) $(call isa_flags,$<) -c $< -o $@

# q8_rows_avxvnni.c and q8_fp4_rows_avxvnni.c build q8_avx2.c and q8_fp4_avx2.c a second time
# (with AVX-VNNI).
$(OBJDIR)/kernels/avx2/q8_rows_avxvnni.o: c/kernels/avx2/q8_avx2.c
$(OBJDIR)/kernels/avx2/q8_fp4_rows_avxvnni.o: c/kernels/avx2/q8_fp4_avx2.c

C_OBJS = $(patsubst c/%.c,$(OBJDIR)/%.o,$(C_SRCS))

$(TESTDIR)/%: tests/c/%.c $(C_OBJS) $(wildcard tests/c/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SAN) $< $(C_OBJS) -lm -lpthread -o $@

test-c: $(patsubst tests/c/%.c,$(TESTDIR)/%,$(C_TESTS)) tools-c
	@set -e; for t in $(filter-out tools-c,$^); do echo "== $$t"; $$t; done

# The C harnesses of tools/ (bench_q8.c ...) link against the core's objects by hand, so nothing
# else notices when an API they call changes: compiled here (syntax and types only) with the tests.
tools-c:
	@set -e; for f in tools/*.c; do $(CC) $(C_FLAGS) -Ic -Itools -fsyntax-only $$f; done

test-py: test-deps build
	$(PYTHON) -m pytest -q tests

# ruff with the small rule set of pyproject.toml ([tool.ruff])
lint: test-deps
	$(PYTHON) -m ruff check python tests tools

test: test-c lint test-py

serve: install
	$(PYTHON) -m gateway --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL)) $(ARGS)

rehearse: install
	$(PYTHON) tools/rehearse.py $(ARGS)

# The last line: a 4096-token prompt, as coding agents send (its attention outweighs the weights).
bench: install test-deps
	$(PYTHON) tools/bench.py
	$(PYTHON) tools/bench_models.py
	$(PYTHON) tools/bench_experts.py
	$(PYTHON) tools/bench_structured.py
	$(PYTHON) tools/bench_llamacpp.py
	$(PYTHON) tools/bench_llamacpp.py --models qwen3_moe --quants Q4_K_M --same-file-only --prefill-tokens 4096

# Seeded, capped at FUZZ_EXAMPLES cases per operation and FUZZ_SECONDS in all (a few minutes):
# too slow for `make test`.  Exit code non-zero when schemathesis found a failure.
FUZZ_EXAMPLES ?= 10
FUZZ_SECONDS ?= 150
fuzz: test-deps build
	$(PYTHON) tools/fuzz_api.py --max-examples $(FUZZ_EXAMPLES) --max-time $(FUZZ_SECONDS)

# From the llama-cpp-python sdist of the version pinned in tools/llamacpp.py, fetched with pip.
llamacpp: deps
	$(PYTHON) -c 'import sys; sys.path.insert(0, "tools"); import llamacpp; c = llamacpp.cache_dir(); llamacpp.build(c, ["llama-bench", "llama-quantize", "llama-imatrix"]); print("built in", c / "build" / "bin")'

# ---- sanitizers: separate object dir so a normal build is never mixed with an instrumented one.
# The expert cache runs under ASan in tests/c/test_expert_store.c, the GGUF reader in test_gguf.c
# (and its corruption test in tests/test_gguf_reader.py); the Python budget tests size
# their budgets from this process's RSS, which ASan inflates, so they are left out here.
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
sanitize:
	$(MAKE) test-c SAN="$(SAN_FLAGS)" OBJDIR=build/san/c TESTDIR=build/san/tests
	rm -f python/gateway/.core-built
	MOEGATE_SANITIZE=1 $(PYTHON) setup.py -q build_ext --inplace --force --build-temp build/san-ext
	ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
		$(PYTHON) -m pytest -q -p no:cacheprovider tests -m "not rss" -k "(engine or kernel or ggml or loader or oracle or prefix_snapshot or window_rows or gguf) and not budget"
	rm -f python/gateway/.core-built
	$(PYTHON) setup.py -q build_ext --inplace --force

# NEON kernels and every C test, cross-built for arm64 and run under qemu-user
neon-check:
	tools/neon_check.sh

# the thread pool under ThreadSanitizer
tsan:
	@mkdir -p build/tsan
	$(CC) -std=c11 -O1 -g -fsanitize=thread -Ic tests/c/test_threadpool.c c/core/threadpool.c -lpthread -o build/tsan/test_threadpool
	build/tsan/test_threadpool

clean:
	rm -rf build python/gateway/_core*.so python/gateway/.core-built
	@echo "(the virtual environment $(VENV) is kept; rm -rf $(VENV) to remove it)"
