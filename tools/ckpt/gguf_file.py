"""GGUF files from our tiny Hugging Face checkpoints, in llama.cpp's own layout.

`write_gguf(ckpt_dir, out)` turns a checkpoint folder written by tools/ckpt (qwen3_moe or
glm4_moe) into a `.gguf` as llama.cpp's converter lays it out (docs/reference/gguf.md §4):
llama.cpp's tensor names (through the gguf package's own name map), ggml dim order, the
`{arch}.*` metadata keys, each layer's experts stacked into `blk.N.ffn_{gate,up,down}_exps`,
the router correction bias as `exp_probs_b.bias`, GLM's MTP layer as `blk.N.*` + `nextn.*`.
The q/k rows are written as released: qwen3moe and glm4moe use the neox RoPE in llama.cpp too,
so its converter does not permute them (only llama-style architectures are).

Each tensor's type is chosen by name (`types`: fnmatch pattern -> type, first match wins;
vectors and routers stay F32 unless a pattern names them).  F32/F16/BF16/Q8_0/Q4_0/Q5_0 are
quantised with gguf.quants; the K and IQ types, which that package cannot quantise, get random
blocks with sane f16 scales (`random_blocks`): a reference that dequantises the file is exact
either way.  `split_max_tensors` writes a split set NAME-0000k-of-0000N.gguf.  The checkpoint's
tokenizer and chat template go in as `tokenizer.*` keys (tools/ckpt/gguf_vocab.py), so the server
can serve the file alone.

`read_gguf_as_hf(path)` is the other direction for oracles: every tensor of the file (all parts),
dequantised by gguf.quants, under the Hugging Face names, experts unstacked.
"""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_vocab import add_tokenizer_metadata

GGUF_ARCH = {"qwen3_moe": "qwen3moe", "glm4_moe": "glm4moe"}
QUANTISABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "MXFP4")
EXPERT_PROJ = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
# GLM's MTP layer extras (names as llama.cpp's converter writes them).
NEXTN = {"eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
         "embed_tokens": "nextn.embed_tokens", "shared_head.head": "nextn.shared_head_head",
         "shared_head.norm": "nextn.shared_head_norm"}
EXPERT_NAME = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def read_checkpoint(ckpt: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json, every tensor as float32 numpy) of an unquantised (f32/bf16) checkpoint."""
    from safetensors import safe_open

    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        raise ValueError(f"{ckpt}: only f32/bf16 checkpoints can be turned into GGUF files here")
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name).float().numpy()
    return config, tensors


def gguf_name(name_map: Any, hf_name: str, n_layers: int) -> str | None:
    """llama.cpp's name of a (non-expert) Hugging Face tensor, or None when it has none."""
    base, _, suffix = hf_name.rpartition(".")
    if hf_name.endswith("mlp.gate.e_score_correction_bias"):
        return f"blk.{hf_name.split('.')[2]}.exp_probs_b.bias"
    mapped = name_map.get_name(base)
    if mapped is None:
        m = re.match(r"^model\.layers\.(\d+)\.(.+)$", base)
        if m and int(m[1]) >= n_layers and m[2] in NEXTN:
            mapped = f"blk.{m[1]}.{NEXTN[m[2]]}"
    return f"{mapped}.{suffix}" if mapped else None


def choose_type(name: str, ndim: int, types: dict[str, str], default: str) -> str:
    for pattern, qtype in types.items():
        if fnmatch.fnmatchcase(name, pattern):
            return qtype
    if ndim == 1 or name.endswith("ffn_gate_inp.weight"):
        return "F32"  # as llama.cpp's quantizer keeps them
    return default


def put_iq1_m_d(raw: np.ndarray, d: np.ndarray) -> None:
    """Stores the f16 d of IQ1_M blocks (rows of 56 bytes): nibble i of d is the top nibble of the
    i-th u16 scale word (bytes 48..55), the 3-bit scales below it are kept."""
    bits = d.astype(np.float16).view(np.uint16)
    words = raw[:, 48:56].copy().view(np.uint16)
    for i in range(4):
        words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
    raw[:, 48:56] = words.view(np.uint8)


def random_blocks(qtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K/IQ type for a float tensor of `shape`, with f16 scales chosen so the
    values stay in a weight-like range (a few tenths at most)."""
    import gguf

    qt = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    if shape[-1] % block:
        raise ValueError(f"{qtype}: rows of {shape[-1]} are not whole blocks of {block}")
    n_blocks = int(np.prod(shape[:-1])) * (shape[-1] // block)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def put_f16(offset: int, low: float, high: float) -> None:
        values = rng.uniform(low, high, n_blocks).astype(np.float16)
        raw[:, offset:offset + 2] = values.view(np.uint8).reshape(n_blocks, 2)

    if qtype in ("Q4_K", "Q5_K"):
        put_f16(0, 1e-4, 4e-4)   # d
        put_f16(2, 1e-4, 4e-4)   # dmin
    elif qtype == "Q6_K":
        put_f16(size - 2, 1e-5, 3e-5)  # d is the block's last field
    elif qtype in ("Q2_K",):
        put_f16(size - 4, 1e-3, 3e-3)
        put_f16(size - 2, 1e-3, 3e-3)
    elif qtype == "Q3_K":
        put_f16(size - 2, 1e-3, 3e-3)
    elif qtype in ("IQ4_XS",):
        put_f16(0, 1e-5, 3e-5)
    elif qtype in ("IQ4_NL",):
        put_f16(0, 5e-4, 1.5e-3)
    elif qtype == "IQ1_S":  # entries +-1 (+-1/8) times at most 15: a larger d
        put_f16(0, 2e-3, 5e-3)
    elif qtype == "IQ1_M":  # no f16 field: d's four nibbles top the four u16 scale words
        put_iq1_m_d(raw, rng.uniform(2e-3, 5e-3, n_blocks))
    else:
        # Other IQ types: a leading f16 d in every one of them.
        put_f16(0, 1e-4, 3e-4)
    return raw.reshape(*shape[:-1], (shape[-1] // block) * size)


def encode(values: np.ndarray, qtype: str, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    import gguf

    qt = gguf.GGMLQuantizationType[qtype]
    block, _ = gguf.GGML_QUANT_SIZES[qt]
    if values.shape[-1] % block:
        # As llama.cpp's quantizer does for rows that are not whole blocks: a finer type.
        qtype = "Q8_0" if values.shape[-1] % 32 == 0 else "F16"
        qt = gguf.GGMLQuantizationType[qtype]
    if qtype == "F32":
        return np.ascontiguousarray(values, dtype=np.float32), None
    if qtype == "F16":
        return np.ascontiguousarray(values, dtype=np.float16), None
    if qtype in QUANTISABLE:
        return gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qt), qt
    return random_blocks(qtype, values.shape, rng), qt


def write_gguf(ckpt: Path | str, out: Path | str, *, types: dict[str, str] | None = None, default: str = "F32",
               split_max_tensors: int = 0, tied: bool = False, arch: str | None = None, seed: int = 0,
               drop: tuple[str, ...] = (), alignment: int | None = None,
               metadata: dict[str, Any] | None = None) -> Path:
    """Writes the GGUF of checkpoint folder `ckpt` to `out` (a split set's parts beside it) and
    returns the path to open: `out`, or its first part.  tied: leave out `output.weight` (the
    reference must then tie the head to the embeddings).  arch: general.architecture to claim.
    drop: fnmatch patterns of llama.cpp names to leave out (for error tests).  alignment:
    general.alignment (a power of two; 32 when None).  metadata: config.json fields to
    claim in the metadata instead of the checkpoint's (the tensors stay as they are)."""
    import gguf

    ckpt, out = Path(ckpt), Path(out)
    stored, tensors = read_checkpoint(ckpt)
    config = {**stored, **(metadata or {})}
    model_type = config["model_type"]
    gguf_arch = arch or GGUF_ARCH[model_type]
    enum_arch = {"qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE, "glm4_moe": gguf.MODEL_ARCH.GLM4_MOE}[model_type]
    n_layers = stored["num_hidden_layers"]
    nextn = stored.get("num_nextn_predict_layers", 0) if model_type == "glm4_moe" else 0
    name_map = gguf.get_tensor_name_map(enum_arch, n_layers + nextn)
    rng = np.random.default_rng(seed)
    types = types or {}

    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), gguf_arch, split_max_tensors=split_max_tensors)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    head_dim = config["head_dim"]
    writer.add_block_count(config["num_hidden_layers"] + nextn)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_weights_norm(bool(config.get("norm_topk_prob", False)))
    if model_type == "glm4_moe":
        writer.add_expert_count(config["n_routed_experts"])
        writer.add_expert_shared_count(config["n_shared_experts"])
        writer.add_leading_dense_block_count(config["first_k_dense_replace"])
        writer.add_expert_weights_scale(config["routed_scaling_factor"])
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        writer.add_expert_group_count(config.get("n_group", 1))
        writer.add_expert_group_used_count(config.get("topk_group", 1))
        writer.add_nextn_predict_layers(nextn)
    else:
        writer.add_expert_count(config["num_experts"])
    n_experts = stored["n_routed_experts" if model_type == "glm4_moe" else "num_experts"]  # as the tensors hold

    def add(name: str, values: np.ndarray) -> None:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in drop):
            return
        data, qt = encode(values, choose_type(name, values.ndim, types, default), rng)
        writer.add_tensor(name, data, raw_dtype=qt)

    stacked: dict[tuple[int, str], list[np.ndarray | None]] = {}
    for hf_name in sorted(tensors, key=_natural):
        m = EXPERT_NAME.match(hf_name)
        if m:
            stacked.setdefault((int(m[1]), m[3]), [None] * n_experts)[int(m[2])] = tensors[hf_name]
            continue
        if tied and hf_name == "lm_head.weight":
            continue
        name = gguf_name(name_map, hf_name, n_layers)
        if name is None:
            raise ValueError(f"{hf_name}: no llama.cpp name for it")
        add(name, tensors[hf_name])
    for (layer, proj), experts in sorted(stacked.items()):
        add(f"blk.{layer}.{EXPERT_PROJ[proj]}.weight", np.stack(experts))  # [E, rows, cols]: ne = {cols, rows, E}

    if (ckpt / "tokenizer.json").is_file():  # tokenizer.ggml.* and the chat template, as the converter writes them
        add_tokenizer_metadata(writer, ckpt, vocab_size=config["vocab_size"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        first = sorted(out.parent.glob(f"{out.stem}-00001-of-*.gguf"))
        if first:
            return first[0]
    return out


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def gguf_parts(path: Path | str) -> list[Path]:
    path = Path(path)
    m = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", path.name)
    if not m:
        return [path]
    return [path.with_name(f"{m[1]}-{k:05d}-of-{m[2]}.gguf") for k in range(1, int(m[2]) + 1)]


def read_gguf_as_hf(path: Path | str) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF file (all parts of a split set) dequantised to float32 by
    gguf.quants, under Hugging Face names (experts unstacked; MTP `nextn.*` tensors dropped)."""
    import gguf

    reverse_layer = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "post_attention_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
        "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
        "ffn_down_shexp": "mlp.shared_experts.down_proj",
    }
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    stacked = {v: k for k, v in EXPERT_PROJ.items()}
    out: dict[str, np.ndarray] = {}
    for part in gguf_parts(path):
        reader = gguf.GGUFReader(str(part))
        for t in reader.tensors:
            shape = tuple(int(n) for n in reversed(list(t.shape)))
            values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
            base, _, suffix = t.name.rpartition(".")
            if base in top:
                out[f"{top[base]}.{suffix}"] = values
                continue
            m = re.match(r"^blk\.(\d+)\.(.+)$", base)
            if not m:
                raise ValueError(f"{part}: unexpected tensor {t.name}")
            layer, rest = m[1], m[2]
            if rest in stacked:
                for e in range(values.shape[0]):
                    out[f"model.layers.{layer}.mlp.experts.{e}.{stacked[rest]}.weight"] = values[e]
            elif rest == "exp_probs_b":
                out[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = values
            elif rest in reverse_layer:
                out[f"model.layers.{layer}.{reverse_layer[rest]}.{suffix}"] = values
            elif not rest.startswith("nextn."):
                raise ValueError(f"{part}: unexpected tensor {t.name}")
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m tools.ckpt.gguf_file CKPT OUT.gguf [--default Q8_0] [--type 'blk.*.ffn_down_exps.weight=Q6_K' ...]
    [--split N] [--tied]: a GGUF of a tools/ckpt checkpoint folder, for trying files by hand."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.ckpt.gguf_file", description=main.__doc__)
    parser.add_argument("ckpt", type=Path, help="checkpoint folder (qwen3_moe or glm4_moe, f32 or bf16)")
    parser.add_argument("out", type=Path, help="the .gguf to write")
    parser.add_argument("--default", default="F32", help="type of the matrices no --type names (default F32)")
    parser.add_argument("--type", action="append", default=[], metavar="PATTERN=TYPE",
                        help="llama.cpp tensor names (fnmatch) -> ggml type; first match wins")
    parser.add_argument("--split", type=int, default=0, metavar="N", help="at most N tensors per part")
    parser.add_argument("--tied", action="store_true", help="leave out output.weight")
    args = parser.parse_args(argv)
    types = dict(item.split("=", 1) for item in args.type)
    path = write_gguf(args.ckpt, args.out, types=types, default=args.default, split_max_tensors=args.split,
                      tied=args.tied)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
