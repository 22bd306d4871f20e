"""GGUF files made by llama.cpp's own tools from our tiny checkpoints: the files a desktop user
downloads are made this way, so the engine is tested on them and not only on files we write.

    python tools/llamacpp_ggufs.py --arch qwen3_moe --out DIR      # checkpoint + one GGUF per variant
    python tools/llamacpp_ggufs.py --arch glm4_moe --out DIR --build   # build llama-quantize if missing
    python tools/llamacpp_ggufs.py --arch deepseek_v4 --out DIR
    python tools/llamacpp_ggufs.py --arch glm4_moe --ragged --out DIR --variants lowbit,Q5_K_M
    python tools/llamacpp_ggufs.py --arch glm4_moe --out DIR --variants IQ2_XXS,udiq

The checkpoint is converted once by llama.cpp's convert_hf_to_gguf.py, then llama-quantize makes
each variant from that file:
  Q8_0     every matrix Q8_0
  Q4_K_M   llama.cpp's default mix (Q4_K, with Q6_K for the output and some attn_v / ffn_down)
  mixed    a per-tensor mix in the manner of unsloth's dynamic files: Q4_K_M with `--tensor-type`
           overrides (MIXED below).  qwen3_moe / glm4_moe: routed experts' down Q5_K, gate
           IQ4_XS, up Q4_0, attention Q8_0 / Q6_K / Q5_0 / IQ4_NL, output Q8_0.  deepseek_v4:
           gate experts kept MXFP4, up IQ4_XS, down Q5_K, shared expert Q8_0, mHC mixers and
           position biases F32, indexer BF16, attention Q6_K / Q5_0 / IQ4_NL / Q4_0 / Q5_K /
           Q8_0, embedding Q6_K, output Q8_0
  Q2_K     llama.cpp's Q2_K mix: Q2_K, with Q3_K for ffn_down (and attn_output below 8 experts),
           Q4_K / Q3_K attn_v (by GQA), Q5_K attn_output and Q8_0 attn_k / attn_v at 8 experts
           (glm4_moe), Q6_K output
  Q3_K_M   Q3_K, with Q4_K / Q5_K for attn_v, ffn_down and attn_output, Q6_K output
  Q5_K_M   Q5_K, with Q6_K for the output and the use_more_bits ffn_down / attn_v
           (at 8 experts, glm4_moe, llama.cpp's mixes make attn_k / attn_v Q8_0)
  lowbit   Q2_K with `--tensor-type` overrides, as the low-bit dynamic files of MoE models keep the
           experts' down projection wider: routed experts' down Q5_K, shared expert's down Q4_1
           (the rest as Q2_K)
The codebook ("IQ") variants are made with an importance matrix, as every IQ file users download
is: llama-quantize refuses IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S and IQ3_XXS tensors (and Q2_K_S
files) without one.  llama-imatrix makes it from the converted file over a few hundred tokens of
built-in text (llamacpp.CALIBRATION_TEXT, chunks of 64; under a second here), cached beside it
(`<checkpoint>.f32.imatrix.gguf`).  glm4_moe's multi-token-prediction layer (blk.3 here) is
written by the converter but never run by llama.cpp, so the matrix has nothing for it and
llama-quantize would bail out ("Missing importance matrix ... in a very low-bit quantization"):
the IQ files keep that layer Q8_0 (llamacpp.UNRUN_LAYER_TYPE; the engine skips it too).
What llama.cpp's own mixes hold (gguf-py's census of the tiny qwen3_moe files; named types on
top of the one the mix is named after, which the experts and the rest take):
  IQ2_XXS  Q4_K attn_v, Q2_K token_embd, Q5_K output
  IQ2_XS   the same
  IQ2_S    IQ2_XS (sic: the IQ2_S mix is IQ2_XS with wider attention), IQ3_S attn_output and
           token_embd, Q4_K attn_v, Q5_K output
  IQ2_M    IQ2_S, IQ3_S attn_output and token_embd, Q4_K attn_v, Q5_K output
  IQ3_XXS  IQ2_S attn_q / attn_k, IQ3_S attn_output and token_embd, Q5_K output
  IQ3_M    IQ3_S, Q4_K attn_output / attn_v, Q6_K output
  IQ1_S    IQ2_XXS attn_output, Q4_K attn_v, Q2_K token_embd, Q5_K output
  IQ1_M    the same with IQ1_M
glm4_moe's (8 experts) differ in attention: attn_output Q5_K, attn_k / attn_v Q4_K (Q8_0 in
IQ3_XXS and IQ3_M), IQ3_M's last ffn_down Q4_K; its dense layer follows the experts' type.
And two mixes of our own:
  udiq     in the manner of unsloth's UD-IQ2_XXS files (IQ2_XXS with `--tensor-type` overrides,
           UDIQ): routed experts' gate IQ2_XXS, up IQ2_XS, down IQ3_XXS; shared expert Q4_K;
           dense FFN IQ4_XS; attn_q / attn_output IQ3_S, attn_k / attn_v IQ4_XS; embedding Q4_K,
           output Q6_K
  udiq1    as UD-IQ1_M / IQ1_S (IQ1_M with overrides, UDIQ1): experts' gate IQ1_M, up IQ1_S, down
           IQ2_S; shared expert Q4_K; dense FFN IQ3_S; attn_q / attn_output IQ3_XXS, attn_k /
           attn_v IQ4_XS; embedding Q4_K, output Q6_K
Together they hold every codebook type the engine reads.  The IQ quantisers search their
codebooks: on one core of this machine IQ2_XXS takes ~3 s for qwen3_moe, udiq ~6 s for glm4_moe,
and IQ1_S / IQ1_M / udiq1 13-18 s (IQ1 the most); Q4_K_M well under a second.  The udiq mixes
exist for qwen3_moe and glm4_moe only (UD_ARCHS).  With --ragged the down projections' 384-wide
rows fall back to IQ4_NL from any IQ type (llama-quantize's rule below; seen in an IQ2_XXS file).

Made unless others are named: Q8_0, Q4_K_M and mixed (DEFAULT_VARIANTS).
K-quants need rows that are a multiple of 256 values, so CHECKPOINT_OVERRIDES widens the tiny
models to 256 (llama.cpp would otherwise fall back to Q5_0/Q8_0 silently, and the test would
not test what it names).

Real checkpoints are not all that kind: GLM-4.5-Air's experts are 1408 wide (5.5 blocks of 256),
so every ffn_down_exps / ffn_down_shexp row of a K-quant file of it falls back.  --ragged
(RAGGED) makes that checkpoint: glm4_moe with experts 384 wide (1.5 blocks, the same 128 left
over).  llama-quantize's fallbacks (src/llama-quant.cpp, tensor_type_fallback; a row that is
not whole 32-blocks either becomes F16):
  Q2_K, Q3_K -> Q4_0    Q4_K -> Q5_0    Q5_K -> Q5_1    Q6_K -> Q8_0
  IQ1_* / IQ2_* / IQ3_* / IQ4_XS -> IQ4_NL
None gives Q4_1 (Q4_0 files take it only for ffn_down with an imatrix), so the lowbit variant
names it.  The ragged glm4_moe files hold:
  Q2_K     Q2_K, Q3_K (the dense layer's ffn_down), Q4_0 (the experts' down, from Q3_K), Q5_K,
           Q6_K, Q8_0
  Q3_K_M   Q3_K, Q4_K, Q5_0 (the experts' down, from Q4_K), Q5_K, Q6_K, Q8_0
  Q5_K_M   Q5_K, Q5_1 / Q8_0 (the experts' down, from Q5_K / Q6_K), Q6_K, Q8_0
  lowbit   Q2_K, Q3_K, Q5_1 (the routed experts' down, from Q5_K), Q4_1 (the shared expert's
           down, 384 wide too), Q5_K, Q6_K, Q8_0: the four low-bit types in one file

qwen3_moe, glm4_moe: the bf16 checkpoint is converted to f32 (every value kept exactly).

deepseek_v4 (llama.cpp's `deepseek4`; pinned sources, conversion/deepseek.py and
src/llama-quant.cpp):
  * the converter reads only the release's own form: it repacks the FP4 experts into MXFP4 from
    their `.scale` siblings and raises without them, so the checkpoint is `native`.  It picks
    every tensor's type itself, whatever --outtype says (f32 and bf16 give the same bytes): FP8
    -> Q8_0, FP4 experts -> MXFP4, BF16 and F32 kept, tid2eid I32.
  * so llama-quantize starts from Q8_0 and MXFP4 tensors, which it refuses ("requantizing from
    type q8_0 is disabled") unless given --allow-requantize.  Any V4 file made from the release
    with llama.cpp's tools went this way.
  * it has no deepseek4 rule: every tensor of 2+ dims whose name ends in "weight" is quantised
    except norms, `ffn_gate_inp` (the router, kept BF16) and `ffn_gate_tid2eid`.  The F32 mHC
    mixers (`hc_{attn,ffn}_fn`, `output_hc_fn`) and the compressors' position biases
    (`attn_compressor_ape`, `indexer_compressor_ape`) become Q8_0 / Q4_K like any matrix (its
    only mHC exclusions are glm5-next's).  The engine reads `ape` whole, not as a matrix, and
    decodes it once at load (c/model/weights.c); before, it refused such files.
  * its Q4_K_M rules go by name: `ffn_down_exps` and `ffn_down_shexp` take Q6_K in the
    use_more_bits layers (the last of three here) and `output` Q6_K; V4's attention names
    (`attn_q_a`, `attn_kv`, `attn_output_a` ...) match none of the attn_v / attn_k / attn_output
    rules, so they stay Q4_K, as does the embedding.
  * the overrides widen head_dim to 256 and index_head_dim to 128 so that every `ape` row
    (2*head_dim, head_dim, 2*index_head_dim values) is whole 256-blocks, as Flash's (1024, 512,
    256) are: nothing falls back to Q5_0 / Q8_0.
  * an override to the type a tensor already has copies it: the mixed file's gate experts are
    the release's FP4 codes unchanged.

Products are cached next to the checkpoint and remade when older than it.  Sources, the
quantizer and the importance matrix come from tools/llamacpp.py; nothing is downloaded or built
unless asked (--build), so a test on a machine without them says so and is skipped.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

TOOLS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS_DIR))
sys.path.insert(0, str(TOOLS_DIR.parent))
import llamacpp  # noqa: E402

# Widths that are multiples of 256, so every matrix can take a K-quant (see the docstring).
# qwen3_moe's expert width is 768: transformers' GGUF loader ignores expert_feed_forward_length
# and assumes that default (docs/reference/gguf.md §5).  deepseek_v4: 256 wide everywhere a row
# is (hidden, q_lora, expert width, 4 heads of 256 in 2 output groups, o_lora 128 -> wo_b rows of
# 256, index heads of 128), three layers (sliding, CSA ratio 4, HCA ratio 8; the first
# hash-routed) and 8 experts: the tiny model's schedule in small.
CHECKPOINT_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "moe_intermediate_size": 768,
                  "num_hidden_layers": 2, "num_experts": 4},
    "glm4_moe": {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "moe_intermediate_size": 256,
                 "num_hidden_layers": 3, "n_routed_experts": 8},
    "deepseek_v4": {"hidden_size": 256, "q_lora_rank": 256, "moe_intermediate_size": 256,
                    "num_attention_heads": 4, "head_dim": 256, "o_groups": 2, "o_lora_rank": 128,
                    "index_head_dim": 128, "compress_ratios": [0, 4, 8], "num_hash_layers": 1,
                    "n_routed_experts": 8},
}

# Checkpoints whose expert rows are not whole 256-blocks (--ragged): GLM-4.5-Air's 1408 leaves
# 128 over, as 384 does.
RAGGED: dict[str, dict[str, Any]] = {"glm4_moe": {"moe_intermediate_size": 384}}

# The checkpoint format llama.cpp's converter reads, and (format, converter --outtype, label of
# its file).  deepseek4's converter picks every type itself (see the docstring).
CONVERSION: dict[str, tuple[str, str, str]] = {
    "qwen3_moe": ("bf16", "f32", "f32"),
    "glm4_moe": ("bf16", "f32", "f32"),
    "deepseek_v4": ("native", "f32", "q8_0-mxfp4"),
}
# Archs whose converted file already holds quantised tensors: llama-quantize must be allowed to
# requantise them.
REQUANTIZE = {"deepseek_v4"}

# Per-tensor overrides of the mixed variant (`--tensor-type REGEX=TYPE`, searched in the tensor
# name in this order, first match wins, so the specific come first).
_MIXED_HF = {"ffn_down_exps": "q5_k", "ffn_gate_exps": "iq4_xs", "ffn_up_exps": "q4_0",
             "attn_q": "q8_0", "attn_k": "q6_k", "attn_v": "q5_0", "attn_output": "iq4_nl", "output": "q8_0"}
MIXED: dict[str, dict[str, str]] = {
    "qwen3_moe": _MIXED_HF,
    "glm4_moe": _MIXED_HF,
    # DeepSeek-V4: the routed experts are the bulk (gate kept MXFP4 as released, up IQ4_XS, down
    # Q5_K); the shared expert runs for every token (Q8_0); the mHC mixers and the compressors'
    # position biases are tiny and feed every layer (F32, left as they are); the indexer picks
    # the compressed rows attention sees (BF16); the rest of attention Q8_0 / Q6_K / Q5_0 /
    # IQ4_NL / Q4_0 / Q5_K; embedding Q6_K, output Q8_0.
    "deepseek_v4": {"ffn_gate_exps": "mxfp4", "ffn_up_exps": "iq4_xs", "ffn_down_exps": "q5_k",
                    "_shexp": "q8_0", r"hc_|_ape\.": "f32", "indexer": "bf16",
                    "attn_compressor_(kv|gate)": "q8_0", "attn_q_a": "q6_k", "attn_q_b": "q5_0",
                    "attn_kv": "iq4_nl", "attn_output_a": "q4_0", "attn_output_b": "q5_k",
                    "token_embd": "q6_k", r"^output\.weight$": "q8_0"},
}

# Overrides of the lowbit variant (Q2_K): the experts' down projections kept wider, the shared
# expert's in Q4_1, which no fallback gives (see the docstring).
LOWBIT = {"ffn_down_exps": "q5_k", "ffn_down_shexp": "q4_1"}

# Overrides of the udiq variant (llama.cpp's IQ2_XXS mix underneath), in the manner of unsloth's
# UD-IQ2_XXS files of MoE models: the routed experts, the bulk of the file, in the 2-bit codebooks
# with their down projection wider (IQ3_XXS); what every token reads stays wider: the shared
# expert Q4_K, the dense layer's FFN IQ4_XS, attention IQ3_S (q, output) and IQ4_XS (k, v);
# embedding Q4_K, output Q6_K.
UDIQ = {"ffn_down_exps": "iq3_xxs", "ffn_up_exps": "iq2_xs", "ffn_gate_exps": "iq2_xxs", "_shexp": "q4_k",
        r"ffn_(gate|up|down)\.": "iq4_xs", "attn_(q|output)": "iq3_s", "attn_(k|v)": "iq4_xs",
        "token_embd": "q4_k", r"^output\.weight$": "q6_k"}
# Overrides of the udiq1 variant (llama.cpp's IQ1_M mix underneath), as unsloth's UD-IQ1_M / IQ1_S
# files: the routed experts' gate IQ1_M, up IQ1_S, down IQ2_S; shared expert Q4_K, the dense
# layer's FFN IQ3_S, attention IQ3_XXS (q, output) and IQ4_XS (k, v); embedding Q4_K, output Q6_K.
UDIQ1 = {"ffn_down_exps": "iq2_s", "ffn_up_exps": "iq1_s", "ffn_gate_exps": "iq1_m", "_shexp": "q4_k",
         r"ffn_(gate|up|down)\.": "iq3_s", "attn_(q|output)": "iq3_xxs", "attn_(k|v)": "iq4_xs",
         "token_embd": "q4_k", r"^output\.weight$": "q6_k"}
# The archs whose tensor names those rules are written for.
UD_ARCHS = ("qwen3_moe", "glm4_moe")

# variant -> llama-quantize's type (its own names).  The IQ ones are made with an importance matrix
# (llamacpp.needs_imatrix; see the docstring).
VARIANTS: dict[str, str] = {"Q8_0": "Q8_0", "Q4_K_M": "Q4_K_M", "mixed": "Q4_K_M",
                            "Q2_K": "Q2_K", "Q3_K_M": "Q3_K_M", "Q5_K_M": "Q5_K_M", "lowbit": "Q2_K",
                            "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_S": "IQ2_S", "IQ2_M": "IQ2_M",
                            "IQ3_XXS": "IQ3_XXS", "IQ3_M": "IQ3_M", "IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M",
                            "udiq": "IQ2_XXS", "udiq1": "IQ1_M"}
# The ones made unless others are asked for (every arch's tests use these; the low-bit ones are
# asked for by name)
DEFAULT_VARIANTS = ("Q8_0", "Q4_K_M", "mixed")


def overrides(arch: str, variant: str, unrun_layers: list[int] | tuple[int, ...] = ()) -> dict[str, str]:
    """The `--tensor-type` overrides of one variant of one arch; unrun_layers: the blocks llama.cpp
    never runs (llamacpp.unrun_layers), kept Q8_0 where the file needs an importance matrix."""
    if variant in ("udiq", "udiq1") and arch not in UD_ARCHS:
        raise ValueError(f"no {variant} mix for {arch} (only {', '.join(UD_ARCHS)})")
    rules = (MIXED[arch] if variant == "mixed" else LOWBIT if variant == "lowbit" else UDIQ if variant == "udiq"
             else UDIQ1 if variant == "udiq1" else {})
    return llamacpp.with_unrun_layers(VARIANTS[variant], rules, list(unrun_layers))


def checkpoint_name(arch: str, ragged: bool = False) -> str:
    width = f"-experts{RAGGED[arch]['moe_intermediate_size']}" if ragged else ""
    return f"{arch}-tiny256{width}-{CONVERSION[arch][0]}"


def write_tiny_checkpoint(arch: str, out: Path, seed: int = 0, ragged: bool = False) -> Path:
    """The tiny checkpoint of `arch` in the form the converter reads, widened by
    CHECKPOINT_OVERRIDES, with RAGGED's expert width if `ragged` (written once)."""
    from tools.ckpt import write_checkpoint

    if (out / "config.json").is_file():
        return out
    if ragged and arch not in RAGGED:
        raise ValueError(f"no ragged checkpoint of {arch} (only {', '.join(RAGGED)})")
    return write_checkpoint(arch, "tiny", CONVERSION[arch][0], out, seed=seed,
                            overrides={**CHECKPOINT_OVERRIDES[arch], **(RAGGED[arch] if ragged else {})})


def converted_gguf(ckpt: Path, arch: str) -> Path:
    """Where the converter's file of checkpoint folder `ckpt` is cached."""
    return ckpt.parent / f"{ckpt.name}.{CONVERSION[arch][2]}.gguf"


def make_ggufs(ckpt: Path, arch: str, variants: list[str] | None = None, *, build_missing: bool = False,
               cache: Path | None = None) -> dict[str, Path]:
    """variant -> GGUF file made by llama.cpp from checkpoint folder `ckpt` (cached beside it).
    Raises llamacpp.Unavailable when the sources or llama-quantize cannot be had."""
    cache = cache or llamacpp.cache_dir()
    src = llamacpp.fetch_source(cache, no_fetch=not build_missing)
    quantizer = llamacpp.find_tool("llama-quantize", cache=cache, build_missing=build_missing)
    base = converted_gguf(ckpt, arch)
    if not llamacpp.newer_than(base, ckpt / "config.json"):
        llamacpp.convert(src, ckpt, arch, CONVERSION[arch][1], base)
    made = {}
    for name in variants or DEFAULT_VARIANTS:
        out = ckpt.parent / f"{ckpt.name}.{name}.gguf"
        rules = overrides(arch, name, llamacpp.unrun_layers(ckpt))
        imatrix = None
        if llamacpp.needs_imatrix(VARIANTS[name], rules):
            imatrix = llamacpp.ensure_imatrix(base, cache=cache, build_missing=build_missing, threads=1)
        if not llamacpp.newer_than(out, base, *([imatrix] if imatrix else [])):
            llamacpp.quantize(quantizer, base, out, VARIANTS[name], tensor_types=rules, threads=1,
                              allow_requantize=arch in REQUANTIZE, imatrix=imatrix)
        made[name] = out
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(CHECKPOINT_OVERRIDES), required=True)
    p.add_argument("--out", required=True, help="folder for the checkpoint and its GGUF files")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)} (default: %(default)s)")
    p.add_argument("--ragged", action="store_true",
                   help=f"expert rows not whole 256-blocks ({', '.join(f'{a}: {o}' for a, o in RAGGED.items())})")
    p.add_argument("--build", action="store_true", help="download llama.cpp's sources and build llama-quantize "
                   "(and llama-imatrix, for the IQ variants) into the cache folder if missing")
    opts = p.parse_args(argv)
    variants = [v for v in opts.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    misfit = [v for v in variants if v in ("udiq", "udiq1") and opts.arch not in UD_ARCHS]
    if misfit:
        p.error(f"{', '.join(misfit)}: only for {', '.join(UD_ARCHS)}")
    if opts.ragged and opts.arch not in RAGGED:
        p.error(f"--ragged: no such checkpoint of {opts.arch} (only {', '.join(RAGGED)})")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = write_tiny_checkpoint(opts.arch, out / checkpoint_name(opts.arch, opts.ragged), ragged=opts.ragged)
    try:
        made = make_ggufs(ckpt, opts.arch, variants, build_missing=opts.build)
    except llamacpp.Unavailable as why:
        print(f"llama.cpp unavailable: {why}", file=sys.stderr)
        return 2
    for name, path in made.items():
        print(f"{name:8s} {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
