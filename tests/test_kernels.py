"""Kernel tables seen from Python: every table this CPU runs against an independent numpy
dequantisation (and torch's own float8_e4m3fn decoding), on odd shapes and every weight format."""
from __future__ import annotations

import functools
import platform
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from child_env import gateway_child_env
from gateway import _core


def usable_tables() -> list[str]:
    """Tables this CPU runs: the binding's list plus "avx512", which it may not list by name."""
    tables = list(_core.kernel_tables())
    if "avx512" not in tables:
        try:
            _core.read_sum("avx512", np.zeros(16, np.float32))
            tables.append("avx512")
        except ValueError:
            pass
    return tables


TABLES = usable_tables()
FORMATS = ["f32", "bf16", "f16", "fp8_e4m3", "fp4_e2m1"]
SCALE_KINDS = ["none", "f32_block128", "e8m0_block128", "e8m0_g32", "f32_row"]


# ---- independent numpy decoders -------------------------------------------------------------

def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """fp8 e4m3fn (no inf; S.1111.111 is NaN) to float64."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * np.exp2(exp - 7.0))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return sign * mag


E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def decode_e2m1_packed(packed: np.ndarray, cols: int) -> np.ndarray:
    """Two codes per byte, low nibble first, to float64 [rows, cols]."""
    out = np.empty((packed.shape[0], cols))
    out[:, 0::2] = E2M1_VALUES[packed & 0xF]
    out[:, 1::2] = E2M1_VALUES[packed >> 4]
    return out


def decode_bf16(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def decode_e8m0(b: np.ndarray) -> np.ndarray:
    v = np.exp2(b.astype(np.float64) - 127.0)
    return np.where(b == 255, np.nan, v)


# ---- random weights in their stored form ----------------------------------------------------

class Weights:
    def __init__(self, fmt: str, scale_kind: str, rows: int, cols: int, rng: np.random.Generator):
        self.fmt, self.scale_kind, self.rows, self.cols = fmt, scale_kind, rows, cols
        if fmt == "f32":
            self.data = rng.standard_normal((rows, cols)).astype(np.float32)
            values = self.data.astype(np.float64)
        elif fmt == "bf16":
            f = rng.standard_normal((rows, cols)).astype(np.float32)
            self.data = (f.view(np.uint32) >> 16).astype(np.uint16)
            values = decode_bf16(self.data)
        elif fmt == "f16":
            self.data = rng.standard_normal((rows, cols)).astype(np.float16)
            values = self.data.astype(np.float64)
        elif fmt == "fp8_e4m3":
            codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
            codes[(codes & 0x7F) == 0x7F] ^= 1  # no NaN codes
            edges = np.array([0x00, 0x80, 0x7E, 0xFE, 0x01, 0x87], dtype=np.uint8)
            flat = codes.reshape(-1)
            flat[:: max(1, flat.size // 16)] = np.resize(edges, flat[:: max(1, flat.size // 16)].size)
            self.data = codes
            values = decode_e4m3(codes)
        else:
            self.data = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
            values = decode_e2m1_packed(self.data, cols)

        if scale_kind == "none":
            self.scale = None
            per_elem = np.ones((rows, cols))
        elif scale_kind == "e8m0_g32":
            self.scale = rng.integers(115, 135, (rows, cols // 32), dtype=np.uint8)
            per_elem = np.repeat(decode_e8m0(self.scale), 32, axis=1)
        elif scale_kind == "f32_row":  # compressed-tensors per-channel: [rows, 1]
            self.scale = (rng.uniform(0.5, 1.5, (rows, 1)) * np.exp2(-rng.integers(0, 10, (rows, 1)))).astype(np.float32)
            per_elem = np.repeat(self.scale.astype(np.float64), cols, axis=1)
        else:
            shape = (-(-rows // 128), -(-cols // 128))
            if scale_kind == "f32_block128":
                self.scale = (rng.uniform(0.5, 1.5, shape) * np.exp2(-rng.integers(0, 10, shape))).astype(np.float32)
                blocks = self.scale.astype(np.float64)
            else:
                self.scale = rng.integers(115, 135, shape, dtype=np.uint8)
                blocks = decode_e8m0(self.scale)
            per_elem = np.repeat(np.repeat(blocks, 128, axis=0), 128, axis=1)[:rows, :cols]
        self.dense = values * per_elem  # float64 reference

    def linear(self, table: str, x: np.ndarray, threads: int = 1) -> np.ndarray:
        return _core.linear(table, self.fmt, self.scale_kind, self.data, self.scale, self.rows, self.cols, x, threads)


def assert_linear_close(y: np.ndarray, w: Weights, x: np.ndarray) -> None:
    want = x.astype(np.float64) @ w.dense.T
    bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w.dense).T) + 1e-30
    err = np.abs(y.astype(np.float64) - want)
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g} ({w.fmt}, {w.scale_kind}, {w.rows}x{w.cols})"


# ---- decoders agree with torch and with the C reference -------------------------------------

def test_numpy_e4m3_matches_torch() -> None:
    codes = np.arange(256, dtype=np.uint8)
    theirs = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    ours = decode_e4m3(codes)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    ok = ~np.isnan(ours)
    np.testing.assert_array_equal(ours[ok], theirs[ok])
    assert ours[0x7E] == 448.0 and np.signbit(ours[0x80])


def test_numpy_bf16_matches_torch() -> None:
    u = np.random.default_rng(1).integers(0, 0x7F80, 1000, dtype=np.uint16)
    theirs = torch.from_numpy(u.view(np.int16).copy()).view(torch.bfloat16).to(torch.float64).numpy()
    np.testing.assert_array_equal(decode_bf16(u), theirs)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_kind", SCALE_KINDS)
def test_c_decode_matches_numpy(fmt: str, scale_kind: str) -> None:
    rows, cols = 130, 160
    w = Weights(fmt, scale_kind, rows, cols, np.random.default_rng(7))
    got = _core.decode(fmt, scale_kind, w.data, w.scale, rows, cols)
    np.testing.assert_array_equal(got, w.dense.astype(np.float32))


# ---- linear: every table, every format ------------------------------------------------------

# (3, 128), (2, 4160), (3, 8320): the AVX-512 decode fast paths (whole 64-byte steps, a last half
# fp8 scale block, two x chunks); the other shapes reach its fallback to the AVX2 table.
SHAPES = [(1, 32), (3, 96), (17, 160), (130, 33), (257, 300), (5, 4128), (3, 128), (2, 4160), (3, 8320)]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_kind", SCALE_KINDS)
def test_linear_matches_numpy(table: str, fmt: str, scale_kind: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{table}/{fmt}/{scale_kind}".encode()))
    for rows, cols in SHAPES:
        if (fmt == "fp4_e2m1" or scale_kind == "e8m0_g32") and cols % 32:
            continue
        w = Weights(fmt, scale_kind, rows, cols, rng)
        for n_tok in (1, 2, 5, 17):
            x = rng.standard_normal((n_tok, cols)).astype(np.float32)
            assert_linear_close(w.linear(table, x), w, x)


@pytest.mark.parametrize("threads", [2, 0])
def test_linear_threaded_equals_single(threads: int) -> None:
    rng = np.random.default_rng(3)
    table = _core.best_kernel_table()
    w = Weights("fp8_e4m3", "e8m0_block128", 300, 256, rng)
    for n_tok in (1, 4):
        x = rng.standard_normal((n_tok, 256)).astype(np.float32)
        np.testing.assert_array_equal(w.linear(table, x, threads), w.linear(table, x, 1))


@pytest.mark.parametrize("table", TABLES)
def test_fp8_decode_with_huge_activations(table: str) -> None:
    """x beyond 2^119: the AVX-512 fp8 path, which reads x * 256, must hand over to exact code."""
    rng = np.random.default_rng(11)
    w = Weights("fp8_e4m3", "none", 3, 128, rng)
    w.data[:, 0] = 0x08  # 2^-6: the product with 2^121 stays finite
    w.dense[:, 0] = 2.0**-6
    x = rng.standard_normal((1, 128)).astype(np.float32)
    x[0, 0] = np.float32(2.0**121)
    assert_linear_close(w.linear(table, x), w, x)


@pytest.mark.parametrize("table", TABLES)
def test_fp8_row_scales_extreme_and_tables_agree(table: str) -> None:
    """Per-row scales far from 1 (and zero) with the raw fp8 range at its ends: the row's sum is
    scaled once, so no intermediate may overflow or flush, for decode and prefill."""
    rng = np.random.default_rng(13)
    rows, cols = 19, 4160
    w = Weights("fp8_e4m3", "f32_row", rows, cols, rng)
    w.scale[:, 0] = np.resize(np.array([2.0**-100, 2.0**100, 0.0, 1.0, 3.0e-3], np.float32), rows)
    w.dense = decode_e4m3(w.data) * w.scale.astype(np.float64)
    for n_tok in (1, 6):
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)
        y = w.linear(table, x)
        assert np.all(np.isfinite(y))
        assert_linear_close(y, w, x)


def test_row_scale_shape_is_checked() -> None:
    data = np.zeros((4, 64), dtype=np.uint8)
    x = np.zeros((1, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="scale has 12 bytes, expected 16"):
        _core.linear("scalar", "fp8_e4m3", "f32_row", data, np.ones((3, 1), np.float32), 4, 64, x)


@pytest.mark.parametrize("table", TABLES)
def test_fp8_decode_with_extreme_block_scales(table: str) -> None:
    """Scales near the ends of the exponent range, where the AVX-512 path cannot fold the scale
    into x without leaving the normal range and keeps one multiply per block instead."""
    rng = np.random.default_rng(12)
    rows, cols = 260, 4160
    w = Weights("fp8_e4m3", "e8m0_block128", rows, cols, rng)
    w.scale[:] = rng.choice(np.array([0, 3, 120, 131, 200], np.uint8), w.scale.shape)
    w.scale[0, :] = 127  # one row block that folds, to compare both paths in one call
    per_elem = np.repeat(np.repeat(decode_e8m0(w.scale), 128, axis=0), 128, axis=1)[:rows, :cols]
    w.dense = decode_e4m3(w.data) * per_elem
    x = rng.standard_normal((1, cols)).astype(np.float32)
    assert_linear_close(w.linear(table, x), w, x)


def test_widest_table_is_preferred_and_narrower_ones_stay_selectable() -> None:
    feats = _core.cpu_features()
    # the dot-product extension is an arm64 feature on top of NEON (the neon table's int8 GEMM)
    assert "neondot" in feats and (feats["neon"] or not feats["neondot"])
    if "avx512bf16" in TABLES:  # listed when the CPU has AVX512_BF16 and the compiler built it
        assert feats["avx512bf16"] and "avx512" in TABLES
        assert _core.best_kernel_table() == "avx512bf16"
    elif "avx512" in TABLES:
        assert _core.best_kernel_table() == "avx512"
    if feats["avx2"] and feats["fma"] and feats["f16c"]:
        assert "avx2" in TABLES


def _feature_in_new_process(feature: str, env: str, value: str | None) -> str:
    """_core.cpu_features()[feature] as a new process detects it with the environment variable
    env set to value (None: unset); features are read once, when the tables are built."""
    code = "from gateway import _core; print(_core.cpu_features()[%r])" % feature
    environ = gateway_child_env(unset=env, **({} if value is None else {env: value}))
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(),
                    reason="an x86 vendor rule, read from Linux's /proc/cpuinfo")
@pytest.mark.parametrize("feature, env", [("denormal_assists", "MOEGATE_DENORMAL_ASSISTS"), ("prefetch_l2", "MOEGATE_PREFETCH_L2")])
def test_vendor_rules_and_their_overrides(feature: str, env: str) -> None:
    """Both are set on every x86 vendor but AMD and Hygon (c/core/cpu.c); 0 or 1 in the
    environment overrides the rule, anything else is ignored."""
    vendor = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("vendor_id"))
    run = functools.partial(_feature_in_new_process, feature, env)
    assert run(None) == str(vendor not in ("AuthenticAMD", "HygonGenuine"))
    assert run("0") == "False" and run("1") == "True"
    assert run("yes") == run(None)


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(),
                    reason="an x86 extension, read from Linux's /proc/cpuinfo")
def test_avxvnni_follows_the_cpu_and_turns_off_by_environment() -> None:
    """AVX-VNNI is what the CPU reports (with AVX2); MOEGATE_AVXVNNI=0 turns it off, so the
    avx2 table of an AVX2-only CPU runs here; nothing turns it on where the CPU lacks it."""
    flags = next(line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("flags"))
    run = functools.partial(_feature_in_new_process, "avxvnni", "MOEGATE_AVXVNNI")
    has = "avx_vnni" in flags and "avx2" in flags
    assert run(None) == str(has)
    assert run("0") == "False"
    assert run("1") == run("yes") == str(has)


def test_linear_rejects_bad_sizes() -> None:
    data = np.zeros((4, 64), dtype=np.uint8)
    x = np.zeros((1, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="bytes"):
        _core.linear("scalar", "fp8_e4m3", "none", data, None, 5, 64, x)
    with pytest.raises(ValueError, match="scale"):
        _core.linear("scalar", "fp8_e4m3", "e8m0_block128", data, None, 4, 64, x)
    with pytest.raises(ValueError, match="cols"):
        _core.linear("scalar", "fp8_e4m3", "none", data, None, 4, 64, np.zeros((1, 63), np.float32))
    with pytest.raises(ValueError, match="kernel table"):
        _core.linear("nope", "fp8_e4m3", "none", data, None, 4, 64, x)


# ---- vector ops -----------------------------------------------------------------------------

@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("n", [1, 7, 33, 1000, 4099])
def test_vector_ops(table: str, n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)

    assert abs(_core.dot(table, a, b) - a64 @ b64) <= 1e-5 * np.abs(a64 * b64).sum()
    np.testing.assert_allclose(_core.axpy(table, a, 0.5, b), a64 + 0.5 * b64, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(_core.scale(table, a, 3.0), a * np.float32(3.0))
    assert abs(_core.read_sum(table, a) - a64.sum()) <= 1e-5 * np.abs(a64).sum()

    w = rng.standard_normal(n).astype(np.float32)
    want = a64 / np.sqrt(np.mean(a64 * a64) + 1e-6) * w
    np.testing.assert_allclose(_core.rmsnorm(table, a, w, 1e-6), want, rtol=2e-6, atol=1e-7)

    gate = (rng.standard_normal(n) * 20).astype(np.float32)
    gate[:: max(1, n // 5)] = np.resize(np.array([-100, -88.5, 0, 88.5, 1e4], np.float32), gate[:: max(1, n // 5)].size)
    g64 = gate.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * b64
    np.testing.assert_allclose(_core.swiglu(table, gate, b), want, rtol=2e-6, atol=1e-30)
    lim = 7.0
    gl, ul = np.minimum(g64, lim), np.clip(b64, -lim, lim)
    np.testing.assert_allclose(_core.swiglu(table, gate, b, lim), gl / (1 + np.exp(-gl)) * ul, rtol=2e-6, atol=1e-30)


def test_read_sum_threads() -> None:
    buf = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    for threads in (1, 2):
        assert abs(_core.read_sum(_core.best_kernel_table(), buf, threads) - buf.astype(np.float64).sum()) <= 1e-4 * np.abs(buf).sum()
