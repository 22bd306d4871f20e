"""GGUF files made by llama.cpp's own tools from our tiny checkpoints: the files a desktop user
downloads are made this way, so the engine is tested on them and not only on files we write.

    python tools/llamacpp_ggufs.py --arch qwen3_moe --out DIR      # checkpoint + one GGUF per variant
    python tools/llamacpp_ggufs.py --arch glm4_moe --out DIR --build   # build llama-quantize if missing

The checkpoint is converted once by llama.cpp's convert_hf_to_gguf.py to f32 (every value kept
exactly), then llama-quantize makes each variant from that file:
  Q8_0     every matrix Q8_0
  Q4_K_M   llama.cpp's default mix (Q4_K, with Q6_K for the output and some attn_v / ffn_down)
  mixed    a per-tensor mix in the manner of unsloth's dynamic files: Q4_K_M with the routed
           experts' down projections in Q5_K, gate in IQ4_XS, up in Q4_0, attention in Q8_0 /
           Q6_K / Q5_0 / IQ4_NL and the output in Q8_0 (`--tensor-type` overrides)
K-quants need rows that are a multiple of 256 values, so CHECKPOINT_OVERRIDES widens the tiny
models to 256 (llama.cpp would otherwise fall back to Q5_0/Q8_0 silently, and the test would
not test what it names).

Products are cached next to the checkpoint and remade when older than it.  Sources and the
quantizer come from tools/llamacpp.py; nothing is downloaded or built unless asked (--build), so a
test on a machine without them says so and is skipped.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS_DIR))
sys.path.insert(0, str(TOOLS_DIR.parent))
import llamacpp  # noqa: E402

# Widths that are multiples of 256, so every matrix can take a K-quant (see the docstring).
# qwen3_moe's expert width is 768: transformers' GGUF loader ignores expert_feed_forward_length
# and assumes that default (docs/reference/gguf.md §5).
CHECKPOINT_OVERRIDES = {
    "qwen3_moe": {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "moe_intermediate_size": 768,
                  "num_hidden_layers": 2, "num_experts": 4},
    "glm4_moe": {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "moe_intermediate_size": 256,
                 "num_hidden_layers": 3, "n_routed_experts": 8},
}

VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "Q8_0": ("Q8_0", {}),
    "Q4_K_M": ("Q4_K_M", {}),
    "mixed": ("Q4_K_M", {"ffn_down_exps": "q5_k", "ffn_gate_exps": "iq4_xs", "ffn_up_exps": "q4_0",
                         "attn_q": "q8_0", "attn_k": "q6_k", "attn_v": "q5_0", "attn_output": "iq4_nl",
                         "output": "q8_0"}),
}


def write_tiny_checkpoint(arch: str, out: Path, seed: int = 0) -> Path:
    """The tiny bf16 checkpoint of `arch`, widened by CHECKPOINT_OVERRIDES (written once)."""
    from tools.ckpt import write_checkpoint

    if (out / "config.json").is_file():
        return out
    return write_checkpoint(arch, "tiny", "bf16", out, seed=seed, overrides=CHECKPOINT_OVERRIDES[arch])


def make_ggufs(ckpt: Path, arch: str, variants: list[str] | None = None, *, build_missing: bool = False,
               cache: Path | None = None) -> dict[str, Path]:
    """variant -> GGUF file made by llama.cpp from checkpoint folder `ckpt` (cached beside it).
    Raises llamacpp.Unavailable when the sources or llama-quantize cannot be had."""
    cache = cache or llamacpp.cache_dir()
    src = llamacpp.fetch_source(cache, no_fetch=not build_missing)
    quantizer = llamacpp.find_tool("llama-quantize", cache=cache, build_missing=build_missing)
    stamp = ckpt / "config.json"
    base = ckpt.parent / f"{ckpt.name}.f32.gguf"
    if not llamacpp.newer_than(base, stamp):
        llamacpp.convert(src, ckpt, arch, "f32", base)
    made = {}
    for name in variants or list(VARIANTS):
        ftype, overrides = VARIANTS[name]
        out = ckpt.parent / f"{ckpt.name}.{name}.gguf"
        if not llamacpp.newer_than(out, base):
            llamacpp.quantize(quantizer, base, out, ftype, tensor_types=overrides, threads=1)
        made[name] = out
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(CHECKPOINT_OVERRIDES), required=True)
    p.add_argument("--out", required=True, help="folder for the checkpoint and its GGUF files")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--build", action="store_true", help="download llama.cpp's sources and build llama-quantize "
                   "into the cache folder if missing")
    opts = p.parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = write_tiny_checkpoint(opts.arch, out / f"{opts.arch}-tiny256-bf16")
    try:
        made = make_ggufs(ckpt, opts.arch, [v for v in opts.variants.split(",") if v], build_missing=opts.build)
    except llamacpp.Unavailable as why:
        print(f"llama.cpp unavailable: {why}", file=sys.stderr)
        return 2
    for name, path in made.items():
        print(f"{name:8s} {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
