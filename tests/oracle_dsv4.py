"""Oracle side of the DeepSeek-V4 tests: transformers' DeepseekV4ForCausalLM rebuilt from a
native checkpoint folder (original names, FP8/FP4 + ue8m0 scales) with the dequantised values,
or from a deepseek4 GGUF file's values (`gguf_values`, dequantised by the gguf package).

The folder is decoded here independently of the writer's own dequantiser: FP8 through torch's
float8_e4m3fn, FP4 through the e2m1 table, scales as 2^(byte - 127).
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tools.ckpt import deepseek_v4 as writer

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
_NUMPY_DTYPES = {"F32": "<f4", "BF16": "<u2", "F8_E4M3": "u1", "F8_E8M0": "u1", "I8": "i1", "I64": "<i8", "I32": "<i4"}


def read_raw(folder: str | Path) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor of the folder's shards: name -> (safetensors dtype, array of stored bits)."""
    folder = Path(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out: dict[str, tuple[str, np.ndarray]] = {}
    for shard in sorted(set(index["weight_map"].values())):
        blob = (folder / shard).read_bytes()
        (header_len,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + header_len])
        base = 8 + header_len
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            arr = np.frombuffer(blob, dtype=_NUMPY_DTYPES[meta["dtype"]], count=(end - start) // np.dtype(_NUMPY_DTYPES[meta["dtype"]]).itemsize, offset=base + start)
            out[name] = (meta["dtype"], arr.reshape(meta["shape"]))
    return out


def _scale(bits: np.ndarray) -> torch.Tensor:
    return torch.exp2(torch.from_numpy(bits.astype(np.float32)) - 127.0)


def dequantised(raw: dict[str, tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Logical float values (tid2eid stays integer) keyed by the original names, scales folded in."""
    values: dict[str, np.ndarray] = {}
    for name, (dtype, bits) in raw.items():
        if name.endswith(".scale"):
            continue
        if dtype == "F8_E4M3":
            q = torch.from_numpy(bits.copy()).view(torch.float8_e4m3fn).float()
            s = _scale(raw[name[: -len(".weight")] + ".scale"][1])
            s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: q.shape[0], : q.shape[1]]
            values[name] = (q * s).numpy()
        elif dtype == "I8":
            u8 = torch.from_numpy(bits.view(np.uint8).astype(np.int64))
            q = torch.stack([E2M1[u8 & 15], E2M1[u8 >> 4]], dim=-1).reshape(u8.shape[0], -1)
            s = _scale(raw[name[: -len(".weight")] + ".scale"][1]).repeat_interleave(32, 1)
            values[name] = (q * s).numpy()
        elif dtype == "BF16":
            values[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        else:
            values[name] = bits.copy()
    return values


def load_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def hf_model(folder: str | Path):
    """DeepseekV4ForCausalLM (fp32, eager) holding the folder's dequantised weights."""
    return hf_model_from_values(folder, dequantised(read_raw(folder)))


@torch.no_grad()
def full_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits of every position from one forward pass without a cache: [n, vocab] float32."""
    ids = torch.tensor([tokens], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def greedy(model, prompt: list[int], n_new: int) -> list[int]:
    """transformers' own cached greedy generation: the new token ids."""
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model.generate(ids, max_new_tokens=n_new, do_sample=False, min_new_tokens=n_new, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|."""
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


# ---- a deepseek4 GGUF file (llama.cpp's converter) as original-named values --------------------

# GGUF name -> original name, as llama.cpp's DeepSeek-V4 converter renames (the oracle's own copy
# of the mapping, kept apart from the C table it checks).
_GGUF_ROOT = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight", "output.weight": "head.weight",
              "output_hc_fn.weight": "hc_head_fn", "output_hc_base.weight": "hc_head_base",
              "output_hc_scale.weight": "hc_head_scale"}
_GGUF_LAYER = {
    **{f"hc_{p}_{k}.weight": f"hc_{p}_{k}" for p in ("attn", "ffn") for k in ("fn", "base", "scale")},
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "attn_sinks.weight": "attn.attn_sink", "attn_q_a.weight": "attn.wq_a.weight",
    "attn_q_a_norm.weight": "attn.q_norm.weight", "attn_q_b.weight": "attn.wq_b.weight",
    "attn_kv.weight": "attn.wkv.weight", "attn_kv_a_norm.weight": "attn.kv_norm.weight",
    "attn_output_a.weight": "attn.wo_a.weight", "attn_output_b.weight": "attn.wo_b.weight",
    **{f"{g}_{k}.weight": f"{o}.{v}" for g, o in (("attn_compressor", "attn.compressor"),
                                                  ("indexer_compressor", "attn.indexer.compressor"))
       for k, v in (("ape", "ape"), ("kv", "wkv.weight"), ("gate", "wgate.weight"), ("norm", "norm.weight"))},
    "indexer.attn_q_b.weight": "attn.indexer.wq_b.weight", "indexer.proj.weight": "attn.indexer.weights_proj.weight",
    "ffn_gate_inp.weight": "ffn.gate.weight", "exp_probs_b.bias": "ffn.gate.bias",
    "ffn_gate_tid2eid.weight": "ffn.gate.tid2eid",
    "ffn_gate_shexp.weight": "ffn.shared_experts.w1.weight", "ffn_down_shexp.weight": "ffn.shared_experts.w2.weight",
    "ffn_up_shexp.weight": "ffn.shared_experts.w3.weight",
}
_GGUF_EXPERTS = {"ffn_gate_exps.weight": "w1", "ffn_down_exps.weight": "w2", "ffn_up_exps.weight": "w3"}


def gguf_tensors(path: str | Path) -> Iterator[tuple[str, Any, np.ndarray]]:
    """(name, gguf.GGMLQuantizationType, stored bytes as [rows..., row bytes]) of every tensor.

    The table (names, types, shapes, offsets) comes from the C reader (`gguf_inspect`, which
    tests/test_gguf_reader.py holds to gguf.GGUFReader): GGUFReader also parses the 129k-token
    vocabulary, string by string, which takes 10-20 s a file, most of these tests' time."""
    import gguf

    from gateway import _core

    blob = np.memmap(path, dtype=np.uint8, mode="r")
    for t in _core.gguf_inspect(str(path), arrays=False)["tensors"]:
        rows = [int(n) for n in reversed(t["shape"][1:])]
        raw = blob[t["file_offset"] : t["file_offset"] + t["nbytes"]].reshape(*rows, t["row_bytes"])
        yield t["name"], gguf.GGMLQuantizationType(t["type_id"]), raw


def gguf_values(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a deepseek4 GGUF, dequantised by the gguf package (Q8_0, MXFP4, BF16, the
    K and IQ types), under the original names; stacked experts split per expert, tid2eid kept
    integer."""
    import gguf
    from gguf import quants

    ints = {gguf.GGMLQuantizationType.I32: np.int32, gguf.GGMLQuantizationType.I64: np.int64}
    out: dict[str, np.ndarray] = {}
    for name, kind, raw in gguf_tensors(path):
        if kind in ints:
            value = np.array(raw.view(ints[kind]))
        else:
            value = np.array(quants.dequantize(raw, kind), dtype=np.float32)  # a writable copy
        if name in _GGUF_ROOT:
            out[_GGUF_ROOT[name]] = value
            continue
        _, layer, rest = name.split(".", 2)
        if rest in _GGUF_EXPERTS:
            for e in range(value.shape[0]):
                out[f"layers.{layer}.ffn.experts.{e}.{_GGUF_EXPERTS[rest]}.weight"] = value[e]
        else:
            out[f"layers.{layer}.{_GGUF_LAYER[rest]}"] = value
    return out


def hf_model_from_values(folder: str | Path, values: dict[str, np.ndarray]):
    """DeepseekV4ForCausalLM (fp32, eager) of the folder's config holding `values`.

    Built without transformers' random initialisation (a second or two for the 129k-row
    embedding and head): load_into_hf writes every parameter or raises."""
    dims = writer.dims_from_config(load_config(folder))
    torch.manual_seed(0)
    from transformers import DeepseekV4ForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = DeepseekV4ForCausalLM(writer.hf_config(dims)).float().eval()
    writer.load_into_hf(model, dims, values)
    return model
