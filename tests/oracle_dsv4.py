"""Oracle side of the DeepSeek-V4 tests: transformers' DeepseekV4ForCausalLM rebuilt from a
native checkpoint folder (original names, FP8/FP4 + ue8m0 scales) with the dequantised values.

The folder is decoded here independently of the writer's own dequantiser: FP8 through torch's
float8_e4m3fn, FP4 through the e2m1 table, scales as 2^(byte - 127).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

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
    dims = writer.dims_from_config(load_config(folder))
    torch.manual_seed(0)
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM(writer.hf_config(dims)).float().eval()
    writer.load_into_hf(model, dims, dequantised(read_raw(folder)))
    return model


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
