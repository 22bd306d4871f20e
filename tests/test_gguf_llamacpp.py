"""GGUF files made by llama.cpp's own converter and quantizer (tools/llamacpp_ggufs.py), served by
our Engine and checked against transformers' own model class on the file's dequantised weights.

The quants a desktop user downloads are made by these tools, so the engine must read them exactly
as they are, whatever llama.cpp's converter did on the way (name mapping, dim order, stacked
experts, per-tensor type choices): Q8_0, the Q4_K_M mix (Q4_K / Q5_K / Q6_K / Q8_0), a
per-tensor mix in the manner of unsloth's files (Q5_K, IQ4_XS, Q4_0, Q5_0, IQ4_NL, Q6_K, Q8_0),
the Q2_K mix (Q2_K / Q3_K / Q6_K), a low-bit file of a glm4_moe checkpoint whose expert rows
are not whole 256-blocks, as GLM-4.5-Air's 1408 (Q2_K, Q3_K, with the experts' down
projections falling back from Q5_K to Q5_1, the shared expert's Q4_1, Q5_K, Q6_K, Q8_0), and the
codebook types, made with an importance matrix from llama-imatrix as IQ files are: llama.cpp's
IQ2_XXS mix of qwen3_moe (IQ2_XXS / Q2_K / Q4_K / Q5_K) and a glm4_moe file in the manner of
unsloth's UD-IQ2_XXS (IQ2_XXS, IQ2_XS, IQ3_XXS experts, IQ3_S / IQ4_XS attention, Q4_K shared
expert ...).  Those two take ~10 s of one core to quantise (the IQ quantisers search their
codebooks); IQ1_S / IQ1_M / IQ2_S files take several times that, so they are left to the iq cases
of tests/test_gguf_engine.py (files written by tools/ckpt).

The oracle is transformers loading the same .gguf (`from_pretrained(gguf_file=...)`, which
dequantises every tensor with the gguf package); logits must agree as closely as for the
safetensors checkpoints (max |err| / max |logit| <= 1e-4).  transformers reads qwen3moe GGUF
files but not glm4moe ones: for glm4_moe its model class gets the file's tensors dequantised by
the gguf package, and the f32 file must compute what the checkpoint it came from computes.

These need llama.cpp's sources and a built llama-quantize and llama-imatrix in the cache folder
(`make llamacpp`, or `python tools/llamacpp_ggufs.py --arch qwen3_moe --out DIR --build` builds
them once); on a machine without them the tests are skipped and say why.
DeepSeek-V4's variants (deepseek4) are tested with the other deepseek4 files, in
tests/test_gguf_deepseek4.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
import llamacpp  # noqa: E402
import llamacpp_ggufs  # noqa: E402

from engine_budget import stated_minimum_gb  # noqa: E402

PROMPT = [1, 17, 300, 5, 999, 42, 7, 512, 64, 3, 880, 21]
REL_TOL = 1e-4

# The variants made of each checkpoint ((arch, ragged): see tools/llamacpp_ggufs.py).  The low-bit
# types take two files: qwen3_moe's Q2_K through transformers' own GGUF loader, and glm4_moe's
# ragged lowbit one for the fallbacks; the codebook ones two more: qwen3_moe's IQ2_XXS through
# transformers' loader, glm4_moe's udiq through its model class.
MADE: dict[tuple[str, bool], list[str]] = {
    ("qwen3_moe", False): [*llamacpp_ggufs.DEFAULT_VARIANTS, "Q2_K", "IQ2_XXS"],
    ("glm4_moe", False): [*llamacpp_ggufs.DEFAULT_VARIANTS, "udiq"],
    ("glm4_moe", True): ["lowbit"],
}


class Files(dict):
    """variant -> path; a variant that could not be made skips the test asking for it."""
    why_missing = ""

    def __missing__(self, variant: str):
        pytest.skip(f"no {variant} file: {self.why_missing or 'not made'}")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    """made(arch) -> {variant: path} of llama.cpp-made files for a tiny checkpoint of arch.  The
    IQ variants need llama-imatrix as well: a build without it (made before it was added) still
    runs the other variants' tests, and those of the IQ ones are skipped with the reason."""
    try:
        llamacpp.fetch_source(llamacpp.cache_dir(), no_fetch=True)
        llamacpp.find_tool("llama-quantize", build_missing=False)
    except llamacpp.Unavailable as why:
        pytest.skip(f"llama.cpp's tools are not built here ({why}); "
                    "make them with: make llamacpp")
    try:
        llamacpp.find_tool("llama-imatrix", build_missing=False)
        no_imatrix = ""
    except llamacpp.Unavailable as why:
        no_imatrix = f"{why}; the IQ files need it"
    root = tmp_path_factory.mktemp("llamacpp-ggufs")
    files: dict[tuple[str, bool], Files] = {}

    def make(arch: str, ragged: bool = False) -> Files:
        if (arch, ragged) not in files:
            name = llamacpp_ggufs.checkpoint_name(arch, ragged)
            ckpt = llamacpp_ggufs.write_tiny_checkpoint(arch, root / name, ragged=ragged)
            variants = [v for v in MADE[arch, ragged] if not (no_imatrix and llamacpp.needs_imatrix(
                llamacpp_ggufs.VARIANTS[v], llamacpp_ggufs.overrides(arch, v)))]
            made = llamacpp_ggufs.make_ggufs(ckpt, arch, variants)
            files[arch, ragged] = Files({"f32": llamacpp_ggufs.converted_gguf(ckpt, arch), **made})
            files[arch, ragged].why_missing = no_imatrix
        return files[arch, ragged]
    return make


def test_which_files_are_made_with_an_importance_matrix() -> None:
    """(No llama.cpp needed.)  Every IQ variant gets an importance matrix and glm4_moe's unrun
    multi-token-prediction layer a first rule keeping it Q8_0; the K-quant files are made as
    before, without either (an importance matrix would change their bytes)."""
    iq = [v for v in llamacpp_ggufs.VARIANTS if v.startswith("IQ") or v.startswith("udiq")]
    assert {"IQ2_XXS", "IQ3_XXS", "IQ1_M", "udiq", "udiq1"} <= set(iq)
    for arch in llamacpp_ggufs.UD_ARCHS:
        for variant, ftype in llamacpp_ggufs.VARIANTS.items():
            rules = llamacpp_ggufs.overrides(arch, variant, [3])
            assert llamacpp.needs_imatrix(ftype, rules) == (variant in iq), variant
            assert (next(iter(rules), None) == r"^blk\.(3)\.") == (variant in iq), variant
        assert llamacpp_ggufs.overrides(arch, "mixed", [3]) == llamacpp_ggufs.MIXED[arch]
    assert llamacpp.needs_imatrix("Q2_K_S") and llamacpp.needs_imatrix("Q4_K_M", {"ffn_up_exps": "IQ2_XS"})
    with pytest.raises(ValueError, match="no udiq mix for deepseek_v4"):
        llamacpp_ggufs.overrides("deepseek_v4", "udiq")


def test_missing_imatrix_tool_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(No llama.cpp needed.)  llama-imatrix neither named, on PATH nor built: Unavailable says
    where it looked and how to build it, without building it."""
    monkeypatch.delenv("MOEGATE_LLAMA_IMATRIX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(llamacpp.Unavailable, match=r"llama-imatrix not found .*make llamacpp"):
        llamacpp.find_tool("llama-imatrix", cache=tmp_path, build_missing=False)
    monkeypatch.setenv("MOEGATE_LLAMA_IMATRIX", str(tmp_path / "nothing"))
    with pytest.raises(llamacpp.Unavailable, match="MOEGATE_LLAMA_IMATRIX=.* is not an executable"):
        llamacpp.ensure_imatrix(tmp_path / "model.gguf", cache=tmp_path)


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def engine_logits(path: Path, **kwargs) -> np.ndarray:
    from gateway.engine import Engine

    with Engine(path, threads=1, **kwargs) as engine:
        return engine.eval(PROMPT)


def transformers_logits(path: Path) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0].numpy()


@pytest.mark.parametrize("variant", ["f32", "Q8_0", "Q4_K_M", "mixed", "Q2_K", "IQ2_XXS"])
def test_qwen3_moe_file_matches_transformers_on_its_weights(made, variant: str) -> None:
    path = made("qwen3_moe")[variant]
    ours, ref = engine_logits(path), transformers_logits(path)
    assert ours.shape == ref.shape
    assert relative_error(ours, ref) <= REL_TOL, f"{path.name}: logits differ from transformers on the same file"


def test_the_files_hold_the_types_they_name(made) -> None:
    """The variants would test nothing if llama.cpp fell back to other types (rows not a
    multiple of 256 make it do that silently): check what the files hold."""
    import gguf

    def types(path: Path) -> set[str]:
        return {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}

    for arch in ("qwen3_moe", "glm4_moe"):
        files = made(arch)
        assert {"Q4_K", "Q6_K"} <= types(files["Q4_K_M"])
        assert types(files["Q8_0"]) == {"F32", "Q8_0"}
        assert {"Q5_K", "IQ4_XS", "Q4_0", "Q5_0", "IQ4_NL", "Q6_K", "Q8_0"} <= types(files["mixed"])
    assert types(made("qwen3_moe")["Q2_K"]) == {"F32", "Q2_K", "Q3_K", "Q6_K"}


def test_the_iq_files_hold_the_codebook_types(made) -> None:
    """llama.cpp's IQ2_XXS mix and the UD-like udiq mix, made with an importance matrix: which
    types each really holds (gguf-py's census), tensor by tensor where the mix names them."""
    import gguf

    def tensor_types(path: Path) -> dict[str, str]:
        return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}

    qwen = tensor_types(made("qwen3_moe")["IQ2_XXS"])
    assert set(qwen.values()) == {"F32", "IQ2_XXS", "Q2_K", "Q4_K", "Q5_K"}
    assert {t for n, t in qwen.items() if "_exps" in n} == {"IQ2_XXS"}
    glm = tensor_types(made("glm4_moe")["udiq"])
    assert set(glm.values()) == {"F32", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ4_XS", "Q4_K", "Q6_K", "Q8_0"}
    for layer in (1, 2):
        assert [glm[f"blk.{layer}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")] == ["IQ2_XXS", "IQ2_XS",
                                                                                             "IQ3_XXS"]
        assert glm[f"blk.{layer}.ffn_gate_shexp.weight"] == "Q4_K" and glm[f"blk.{layer}.attn_q.weight"] == "IQ3_S"
    assert glm["blk.0.ffn_down.weight"] == "IQ4_XS"
    # the multi-token-prediction layer llama.cpp never runs (so no importance matrix) stays Q8_0
    assert {t for n, t in glm.items() if n.startswith("blk.3.") and t != "F32"} == {"Q8_0"}


def test_ragged_expert_rows_fall_back(made) -> None:
    """Expert rows of 384 values (1.5 blocks of 256, as GLM-4.5-Air's 1408 are 5.5) cannot be
    K-quants: llama-quantize turns the routed experts' Q5_K down projections into Q5_1; the
    shared expert's is Q4_1 by override, and the dense layer's 256-block rows stay Q3_K."""
    import gguf

    tensors = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(made("glm4_moe", ragged=True)["lowbit"])).tensors}
    assert {"Q2_K", "Q3_K", "Q5_1", "Q4_1", "Q5_K", "Q6_K", "Q8_0"} <= set(tensors.values())
    assert {t for n, t in tensors.items() if "ffn_down_exps" in n} == {"Q5_1"}
    assert {t for n, t in tensors.items() if "ffn_down_shexp" in n} == {"Q4_1"}
    assert tensors["blk.0.ffn_down.weight"] == "Q3_K" and tensors["blk.1.ffn_gate_exps.weight"] == "Q2_K"


def test_glm4_moe_f32_file_is_the_checkpoint(made) -> None:
    """llama.cpp's converter wrote every value of the bf16 checkpoint into the f32 file, so the
    file must compute what the checkpoint folder computes (itself checked against transformers
    by the oracle tests): this catches any reordering or renaming the converter does on the way."""
    files = made("glm4_moe")
    folder = files["f32"].parent / files["f32"].name.removesuffix(".f32.gguf")
    assert relative_error(engine_logits(files["f32"]), engine_logits(folder)) <= 1e-5


@pytest.mark.parametrize("variant, ragged", [("Q8_0", False), ("Q4_K_M", False), ("mixed", False),
                                             ("lowbit", True), ("udiq", False)],
                         ids=["Q8_0", "Q4_K_M", "mixed", "lowbit-ragged", "udiq"])
def test_glm4_moe_file_matches_transformers_on_its_weights(made, variant: str, ragged: bool) -> None:
    """transformers cannot read glm4moe GGUF files itself: its Glm4MoeForCausalLM gets the file's
    tensors dequantised by the gguf package, under their Hugging Face names (the f32 test above
    ties those names to the converter's).  lowbit-ragged: the checkpoint's expert rows are not
    whole 256-blocks (Q2_K, Q3_K, Q4_1, Q5_1 ...); udiq: IQ2_XXS / IQ2_XS / IQ3_XXS experts,
    IQ3_S / IQ4_XS attention and dense FFN."""
    import torch
    from tools.ckpt.gguf_file import read_gguf_as_hf
    from tools.ckpt.hf_moe import fuse_experts, hf_config_object, hf_model_class

    import oracle

    path = made("glm4_moe", ragged)[variant]
    config = oracle.read_config(path.parent / path.name.removesuffix(f".{variant}.gguf"))
    n_layers = config["num_hidden_layers"]
    tensors = {name: torch.from_numpy(np.ascontiguousarray(values))
               for name, values in read_gguf_as_hf(path).items()
               if not (name.startswith("model.layers.") and int(name.split(".")[2]) >= n_layers)}
    model = hf_model_class(config)(hf_config_object(config)).float()
    model.load_state_dict(fuse_experts(tensors, config), strict=True)
    ref = oracle.full_logits(model.eval(), PROMPT)
    assert relative_error(engine_logits(path), ref) <= REL_TOL


@pytest.mark.parametrize("arch, ragged, variant", [("qwen3_moe", False, "mixed"), ("glm4_moe", True, "lowbit"),
                                                   ("glm4_moe", False, "udiq")],
                         ids=["qwen3_moe-mixed", "glm4_moe-lowbit-ragged", "glm4_moe-udiq"])
def test_budgeted_run_of_a_llamacpp_file_is_bitwise_the_resident_one(made, arch: str, ragged: bool,
                                                                     variant: str) -> None:
    """Under ram_gb the experts are read from the file's stacked tensors by the expert store
    (O_DIRECT, slices rounded to 4 KiB): the logits must be those of the resident run, bit for bit.
    lowbit-ragged: experts of Q2_K and of Q5_1 rows of 384 values (slices not 4 KiB multiples);
    udiq: experts in the codebook types (66-, 74- and 98-byte blocks)."""
    from gateway.engine import Engine

    path = made(arch, ragged)[variant]
    resident = engine_logits(path)
    # the smallest budget the engine takes: a cache of one layer's experts
    with Engine(path, threads=1, ram_gb=stated_minimum_gb(path), expert_history=False) as engine:
        cached = engine.eval(PROMPT)
        experts = engine.stats()["experts"]
    assert experts["misses"] > 0 and experts["bytes_read"] > 0, experts
    assert np.array_equal(resident, cached)
