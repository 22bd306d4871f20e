"""The C GGUF reader (c/io/gguf.c through gateway._core.gguf_inspect) against the gguf package:
files written by its GGUFWriter must read the same as with its GGUFReader (metadata values and
types, tensor names, ggml types, shapes, offsets, sizes, in file order), and corrupted copies
must raise ValueError with a message naming the file, never crash.  Format facts:
docs/reference/gguf.md.

Shapes are in ggml order (ne[0], the contiguous row, first), which is also the order of
GGUFReader's ReaderTensor.shape; a numpy array of shape (rows, cols) is stored as [cols, rows].
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import GGUFValueType as VT  # noqa: E402

from gateway import _core  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SUPPORTED = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "IQ4_NL", "IQ4_XS",
             "Q4_1", "Q5_1", "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"}

# (name, numpy byte shape (rows..., row bytes) for quantized types, ggml type): several types and
# ranks, incl. a stacked 3-D expert tensor, row lengths that are not multiples of 256, and a type
# outside the supported set (TQ1_0), which the reader must still read.
QUANTIZED = [
    ("blk.0.ffn_gate_exps.weight", (4, 3, 2 * 144), QT.Q4_K),
    ("blk.0.ffn_down_exps.weight", (4, 512, 210), QT.Q6_K),
    ("blk.0.attn_k.weight", (3, 5 * 34), QT.Q8_0),
    ("blk.0.attn_v.weight", (7, 3 * 22), QT.Q5_0),
    ("blk.0.attn_q.weight", (2, 18), QT.Q4_0),
    ("blk.0.ffn_up_exps.weight", (2, 2, 3, 176), QT.Q5_K),
    ("blk.0.mxfp4.weight", (3, 9 * 17), QT.MXFP4),
    ("blk.0.iq4nl.weight", (1, 18), QT.IQ4_NL),
    ("blk.0.iq4xs.weight", (2, 136), QT.IQ4_XS),
    ("blk.0.q2k.weight", (1, 84), QT.Q2_K),
    ("blk.0.q3k.weight", (2, 110), QT.Q3_K),
    ("blk.0.q41.weight", (3, 2 * 20), QT.Q4_1),
    ("blk.0.q51.weight", (1, 3 * 24), QT.Q5_1),
    ("blk.0.iq2xxs.weight", (1, 66), QT.IQ2_XXS),
    ("blk.0.iq1m.weight", (2, 56), QT.IQ1_M),
    ("blk.0.tq10.weight", (1, 54), QT.TQ1_0),
    ("token_embd.weight", (6, 8 * 2), QT.BF16),
]


def _write(path: Path, alignment: int | None = None, endianess: Any = None, nested: bool = False) -> Path:
    rng = np.random.default_rng(7)
    kwargs = {"endianess": endianess} if endianess is not None else {}
    w = gguf.GGUFWriter(str(path), "qwen3moe", **kwargs)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", -1.5e300)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.str", "héllo ✓")
    w.add_key_value("t.empty", "", VT.STRING)  # add_string skips empty strings
    w.add_array("tokenizer.ggml.tokens", ["<s>", "Ġthe", "", "\n", "日本"])
    w.add_key_value("t.ai8", [-1, 2, -3], VT.ARRAY, sub_type=VT.INT8)
    w.add_key_value("t.au64", [0, 2**63], VT.ARRAY, sub_type=VT.UINT64)
    w.add_array("t.ai32", [1, -2, 3])
    w.add_array("t.af32", [0.5, -1.25, 3.0e-8])
    w.add_array("t.abool", [True, False, True])
    if nested:
        w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("output_norm.weight", rng.standard_normal(5).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal((3, 4)).astype(np.float32))
    w.add_tensor("output.weight", rng.standard_normal((2, 3, 64)).astype(np.float16))
    w.add_tensor("blk.0.hash", rng.integers(0, 9, (2, 3)).astype(np.int32))
    for name, byte_shape, qtype in QUANTIZED:
        raw = rng.integers(0, 256, byte_shape, dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("gguf") / "model.gguf")


def _type_label(field: Any) -> str:
    names = {t: t.name.lower().replace("uint", "u").replace("int", "i").replace("float", "f") for t in VT}
    names[VT.BOOL], names[VT.STRING] = "bool", "string"
    if field.types[0] == VT.ARRAY:
        return f"array[{names[field.types[-1]]}]"
    return names[field.types[0]]


def _assert_matches_gguf_reader(path: Path) -> dict[str, Any]:
    ours = _core.gguf_inspect(str(path))
    ref = gguf.GGUFReader(str(path))
    fields = {name: f for name, f in ref.fields.items() if not name.startswith("GGUF.")}
    assert list(ours["metadata"]) == list(fields), "keys in file order"
    for key, field in fields.items():
        assert ours["metadata_types"][key] == _type_label(field), key
        assert ours["metadata"][key] == field.contents(), key
    assert ours["alignment"] == ref.alignment
    assert ours["data_offset"] == ref.data_offset
    assert ours["file_size"] == path.stat().st_size
    assert ours["version"] == 3
    blob = path.read_bytes()
    assert [t["name"] for t in ours["tensors"]] == [t.name for t in ref.tensors], "tensors in file order"
    for mine, theirs in zip(ours["tensors"], ref.tensors):
        name = mine["name"]
        assert mine["type"] == theirs.tensor_type.name and mine["type_id"] == int(theirs.tensor_type), name
        assert mine["shape"] == [int(d) for d in theirs.shape], name
        assert mine["file_offset"] == theirs.data_offset, name
        assert mine["offset"] == theirs.data_offset - ref.data_offset, name
        assert mine["nbytes"] == theirs.n_bytes, name
        assert mine["row_bytes"] * int(np.prod(mine["shape"][1:])) == mine["nbytes"], name
        assert mine["supported"] == (mine["type"] in SUPPORTED), name
        start = mine["file_offset"]
        assert blob[start:start + mine["nbytes"]] == np.asarray(theirs.data).tobytes(), name
    return ours


def test_reads_like_the_gguf_package(gguf_file: Path) -> None:
    ours = _assert_matches_gguf_reader(gguf_file)
    meta = ours["metadata"]
    # spot checks in our own terms, so a shared misreading would still be caught
    assert meta["general.architecture"] == "qwen3moe"
    assert meta["t.u64"] == 2**64 - 1 and meta["t.i64"] == -(2**63) and meta["t.i16"] == -32768
    assert meta["t.f32"] == float(np.float32(0.1)) and meta["t.f64"] == -1.5e300
    assert meta["t.true"] is True and meta["t.false"] is False
    assert meta["t.str"] == "héllo ✓" and meta["t.empty"] == ""
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "Ġthe", "", "\n", "日本"]
    assert ours["metadata_types"]["t.ai8"] == "array[i8]" and meta["t.ai8"] == [-1, 2, -3]
    assert meta["t.au64"] == [0, 2**63]
    by_name = {t["name"]: t for t in ours["tensors"]}
    gate = by_name["blk.0.ffn_gate_exps.weight"]
    assert gate["shape"] == [512, 3, 4] and gate["row_bytes"] == 2 * 144  # [n_embd, n_ff, n_expert]
    assert by_name["blk.0.attn_norm.weight"]["shape"] == [4, 3]
    assert by_name["blk.0.attn_v.weight"]["shape"] == [96, 7]  # a row length that is not 256k
    assert by_name["blk.0.iq2xxs.weight"]["supported"] is True and by_name["blk.0.tq10.weight"]["supported"] is False
    assert by_name["blk.0.q3k.weight"]["supported"] is True and by_name["blk.0.q51.weight"]["shape"] == [96, 1]
    assert all(t["offset"] % 32 == 0 for t in ours["tensors"])


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_alignment_variants(tmp_path: Path, alignment: int) -> None:
    ours = _assert_matches_gguf_reader(_write(tmp_path / f"a{alignment}.gguf", alignment=alignment))
    assert ours["alignment"] == alignment and ours["data_offset"] % alignment == 0
    assert all(t["offset"] % alignment == 0 for t in ours["tensors"])


def test_type_table_matches_the_gguf_package() -> None:
    ours = {t["id"]: t for t in _core.gguf_types()}
    assert set(ours) == {int(t) for t in QT}, "the same ids, removed ones excluded"
    for qtype in QT:
        t = ours[int(qtype)]
        assert t["name"] == qtype.name
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        if qtype == QT.Q8_1:
            # gguf-py still lists 4 + 4 + 32 bytes; ggml's block_q8_1 is two f16 and 32 int8.  No
            # file stores Q8_1 (it is llama.cpp's activation type); we follow ggml.
            assert (t["block_size"], t["type_size"]) == (32, 36)
            continue
        assert (t["block_size"], t["type_size"]) == (block, size), qtype.name
    assert {t["name"] for t in ours.values() if t["supported"]} == SUPPORTED


def _patched(src: Path, dst: Path, at: int, new: bytes) -> Path:
    blob = bytearray(src.read_bytes())
    blob[at:at + len(new)] = new
    dst.write_bytes(bytes(blob))
    return dst


def _type_field_offset(path: Path, name: str) -> int:
    """Offset of tensor `name`'s ggml type id in its tensor info (after name, n_dims, dims)."""
    blob = path.read_bytes()
    at = blob.index(name.encode()) + len(name)
    n_dims = int.from_bytes(blob[at:at + 4], "little")
    return at + 4 + 8 * n_dims


def test_clear_errors_for_bad_files(tmp_path: Path, gguf_file: Path) -> None:
    big = _write(tmp_path / "big.gguf", endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(ValueError, match="big-endian"):
        _core.gguf_inspect(str(big))
    nested = _write(tmp_path / "nested.gguf", nested=True)
    with pytest.raises(ValueError, match=r"key 't\.nested': array of arrays"):
        _core.gguf_inspect(str(nested))
    v1 = _patched(gguf_file, tmp_path / "v1.gguf", 4, (1).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="version 1 is no longer supported"):
        _core.gguf_inspect(str(v1))
    name = "blk.0.ffn_gate_exps.weight"
    at = _type_field_offset(gguf_file, name)
    ik = _patched(gguf_file, tmp_path / "ik.gguf", at, (144).to_bytes(4, "little"))
    with pytest.raises(ValueError, match=rf"tensor '{name}': ggml type 144 \(IQ4_KS\) exists only in ik_llama"):
        _core.gguf_inspect(str(ik))
    unknown = _patched(gguf_file, tmp_path / "unknown.gguf", at, (200).to_bytes(4, "little"))
    with pytest.raises(ValueError, match=rf"tensor '{name}': unknown or removed ggml type 200"):
        _core.gguf_inspect(str(unknown))
    end = max(t["file_offset"] + t["nbytes"] for t in _core.gguf_inspect(str(gguf_file))["tensors"])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file.read_bytes()[:end - 1])
    with pytest.raises(ValueError, match=r"tensor 'token_embd\.weight' \(BF16, 96 bytes.*past the end of the file"):
        _core.gguf_inspect(str(cut))
    with pytest.raises(ValueError, match="cannot open"):
        _core.gguf_inspect(str(tmp_path / "absent.gguf"))


# Runs in a child process, so that a crash in the reader fails the test instead of pytest.
CORRUPTION_CHILD = r"""
import json, random, sys
from pathlib import Path
from gateway import _core

src, work, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
blob = src.read_bytes()
info = _core.gguf_inspect(str(src))
header_end = info["data_offset"]
data_end = max(t["file_offset"] + t["nbytes"] for t in info["tensors"])
rng = random.Random(seed)
bad = []

def attempt(data, label):
    path = work / "corrupt.gguf"
    path.write_bytes(data)
    try:
        _core.gguf_inspect(str(path))
        return "opened"
    except ValueError as e:
        if str(path) not in str(e) or len(str(e)) < len(str(path)) + 10:
            bad.append(f"{label}: unclear message {e!r}")
        return "refused"
    except Exception as e:  # anything but ValueError is a reader bug
        bad.append(f"{label}: {type(e).__name__}: {e}")
        return "other"

cuts = sorted(set(range(0, header_end + 1, 3)) | {rng.randrange(header_end, data_end) for _ in range(40)})
for n in cuts:
    if n < data_end and attempt(blob[:n], f"truncated at {n}") != "refused":
        bad.append(f"truncated at {n} was not refused")
outcomes = {"opened": 0, "refused": 0, "other": 0}
for i in range(400):
    data = bytearray(blob)
    for _ in range(rng.choice((1, 1, 2, 4))):
        at = rng.randrange(header_end)
        data[at] ^= rng.randrange(1, 256)
    outcomes[attempt(bytes(data), f"flip #{i}")] += 1
print(json.dumps({"truncations": len(cuts), "outcomes": outcomes, "bad": bad[:20]}))
"""


def test_corrupted_copies_never_crash(tmp_path: Path, gguf_file: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CORRUPTION_CHILD, str(gguf_file), str(tmp_path), "1234"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"the reader crashed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["bad"] == []
    assert report["truncations"] > 100
    assert report["outcomes"]["other"] == 0 and report["outcomes"]["refused"] > 200, report
