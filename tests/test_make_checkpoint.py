"""tools/make_checkpoint.py writes real checkpoints: files that safetensors, tokenizers, jinja2 and
transformers read as they read the official GLM-4.5 / Qwen3 MoE repos."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tools.ckpt import WRITERS, write_checkpoint
from tools.ckpt.common import (
    FP8_E4M3_MAX,
    dequantize_fp8_blocks,
    dequantize_fp8_channel,
    quantize_fp8_blocks,
    quantize_fp8_channel,
)
from tools.ckpt.tokenizer import FAMILIES

import oracle
from gateway.model_config import ConfigError, normalise

ARCHS = ("glm4_moe", "qwen3_moe")
FORMATS = ("f32", "bf16", "fp8", "fp8-channel")
FP8_FORMATS = ("fp8", "fp8-channel")
# The scale tensor next to each F8_E4M3 weight: 128x128 blocks (fp8) or one per row (fp8-channel).
SCALE_SUFFIX = {"fp8": "_scale_inv", "fp8-channel": "_scale"}
FAMILY_OF = {"glm4_moe": FAMILIES["glm4"], "qwen3_moe": FAMILIES["qwen3"]}
REPO_ROOT = Path(__file__).resolve().parent.parent


def stored(ckpt: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (safetensors dtype, shape, shard file), read from the shard headers themselves."""
    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for shard in sorted(ckpt.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                view = handle.get_slice(name)
                assert name not in out, f"{name} stored twice"
                out[name] = (view.get_dtype(), tuple(view.get_shape()), shard.name)
    return out


def moe_layers(config: dict[str, Any]) -> list[int]:
    n = config["num_hidden_layers"]
    if config["model_type"] == "glm4_moe":
        return list(range(config["first_k_dense_replace"], n))
    step = config.get("decoder_sparse_step", 1)
    return [i for i in range(n) if i not in config.get("mlp_only_layers", []) and (i + 1) % step == 0]


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensors a real checkpoint of this config has, derived by hand from the config."""
    d, head_dim, vocab = config["hidden_size"], config["head_dim"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    glm = config["model_type"] == "glm4_moe"
    experts = config["n_routed_experts"] if glm else config["num_experts"]
    f = config["moe_intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d), "lm_head.weight": (vocab, d), "model.norm.weight": (d,)}

    def layer(i: int, moe: bool) -> None:
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q)})
        if config.get("attention_bias"):
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)})
        if not glm or config.get("use_qk_norm"):
            shapes.update({p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,)})
        if moe:
            shapes[p + "mlp.gate.weight"] = (experts, d)
            if glm:
                shapes[p + "mlp.gate.e_score_correction_bias"] = (experts,)
                s = f * config["n_shared_experts"]
                shapes.update({p + "mlp.shared_experts.gate_proj.weight": (s, d), p + "mlp.shared_experts.up_proj.weight": (s, d),
                               p + "mlp.shared_experts.down_proj.weight": (d, s)})
            for e in range(experts):
                shapes.update({f"{p}mlp.experts.{e}.gate_proj.weight": (f, d), f"{p}mlp.experts.{e}.up_proj.weight": (f, d),
                               f"{p}mlp.experts.{e}.down_proj.weight": (d, f)})
        else:
            inter = config["intermediate_size"]
            shapes.update({p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d), p + "mlp.down_proj.weight": (d, inter)})

    for i in range(config["num_hidden_layers"]):
        layer(i, i in moe_layers(config))
    if glm:
        for i in range(config["num_hidden_layers"], config["num_hidden_layers"] + config.get("num_nextn_predict_layers", 0)):
            layer(i, True)
            p = f"model.layers.{i}."
            shapes.update({p + "enorm.weight": (d,), p + "hnorm.weight": (d,), p + "eh_proj.weight": (d, 2 * d),
                           p + "shared_head.norm.weight": (d,)})
    return shapes


def is_quantized_linear(name: str) -> bool:
    return bool(re.search(r"\.(q|k|v|o|gate|up|down)_proj\.weight$", name))


@pytest.fixture(scope="module", params=[(a, f) for a in ARCHS for f in FORMATS], ids=lambda p: f"{p[0]}-{p[1]}")
def written(request: pytest.FixtureRequest, build_checkpoint: Callable[..., Path]) -> tuple[str, str, Path]:
    arch, fmt = request.param
    return arch, fmt, build_checkpoint(arch, fmt)


def test_files_shards_and_index(written: tuple[str, str, Path]) -> None:
    _, _, ckpt = written
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
        assert (ckpt / name).is_file(), name
    shards = sorted(path.name for path in ckpt.glob("*.safetensors"))
    assert len(shards) >= 2, "real checkpoints come in several shards"
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    tensors = stored(ckpt)
    assert index["weight_map"] == {name: shard for name, (_, _, shard) in tensors.items()}
    element_bytes = {"F32": 4, "BF16": 2, "F8_E4M3": 1}
    assert index["metadata"]["total_size"] == sum(math.prod(shape) * element_bytes[dt] for dt, shape, _ in tensors.values())


def test_names_shapes_and_dtypes(written: tuple[str, str, Path]) -> None:
    arch, fmt, ckpt = written
    config = oracle.read_config(ckpt)
    expected = expected_shapes(config)
    tensors = stored(ckpt)
    scales = {name for name in tensors if name.endswith(("_scale_inv", "_scale"))}
    assert {name: shape for name, (_, shape, _) in tensors.items() if name not in scales} == expected
    assert not any("gate_up_proj" in name or name.endswith("experts.down_proj") for name in tensors), "experts must be stored per expert"
    mtp_prefix = f"model.layers.{config['num_hidden_layers']}."
    for name, (dtype, shape, _) in tensors.items():
        if name in scales:
            continue
        if name.endswith("e_score_correction_bias"):
            want = "F32"
        elif fmt == "f32":
            want = "F32"
        elif fmt in FP8_FORMATS and is_quantized_linear(name) and not name.startswith(mtp_prefix + "eh_proj"):
            want = "F8_E4M3"
        else:
            want = "BF16"
        assert dtype == want, f"{name}: {dtype}, real {fmt} checkpoints store {want}"
        if dtype == "F8_E4M3" and fmt == "fp8":
            scale_dtype, scale_shape, _ = tensors[name + "_scale_inv"]
            assert scale_dtype == "F32"
            assert scale_shape == (-(-shape[0] // 128), -(-shape[1] // 128))
        elif dtype == "F8_E4M3":
            scale_dtype, scale_shape, _ = tensors[name + "_scale"]  # compressed-tensors: [out, 1]
            assert scale_dtype == "BF16"
            assert scale_shape == (shape[0], 1)
    if fmt in FP8_FORMATS:
        assert scales == {name + SCALE_SUFFIX[fmt] for name, (dt, _, _) in tensors.items() if dt == "F8_E4M3"}
    else:
        assert not scales


def test_config_is_in_the_real_form(written: tuple[str, str, Path]) -> None:
    arch, fmt, ckpt = written
    config = oracle.read_config(ckpt)
    assert config["model_type"] == arch
    assert config["architectures"] == [{"glm4_moe": "Glm4MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[arch]]
    assert "rope_parameters" not in config and isinstance(config["rope_theta"], float)
    if arch == "glm4_moe":
        assert config["partial_rotary_factor"] == 0.5 and config["num_nextn_predict_layers"] == 1
    hf = oracle.hf_config_from_files(ckpt)
    assert hf.rope_parameters["rope_theta"] == config["rope_theta"]
    tokenizer_size = len(json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"]) + len(FAMILY_OF[arch].added)
    assert config["vocab_size"] >= tokenizer_size and config["vocab_size"] % 128 == 0
    if fmt == "fp8":
        q = config["quantization_config"]
        assert {k: q[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} == {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        assert "lm_head" in q["modules_to_not_convert"]
        assert all(f"model.layers.{i}.mlp.gate" in q["modules_to_not_convert"] for i in moe_layers(config))
        assert config["torch_dtype"] == "bfloat16"
        assert normalise(config)["weight_quant"] == "fp8_block128"
    elif fmt == "fp8-channel":
        q = config["quantization_config"]
        assert {k: q[k] for k in ("quant_method", "format", "quantization_status")} == {
            "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed"}
        (group,) = q["config_groups"].values()
        assert group["targets"] == ["Linear"]
        assert {k: group["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric", "dynamic")} == {
            "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
        assert {k: group["input_activations"][k] for k in ("num_bits", "type", "strategy", "dynamic")} == {
            "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
        assert "lm_head" in q["ignore"]
        assert all(f"model.layers.{i}.mlp.gate" in q["ignore"] for i in moe_layers(config))
        assert config["torch_dtype"] == "bfloat16"
        assert normalise(config)["weight_quant"] == "fp8_channel"
    else:
        assert "quantization_config" not in config
        assert config["torch_dtype"] == {"f32": "float32", "bf16": "bfloat16"}[fmt]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8-channel"])
def test_weights_match_the_float32_checkpoint(arch: str, fmt: str, build_checkpoint: Callable[..., Path]) -> None:
    """bf16 and fp8 hold the f32 checkpoint's weights, rounded within each format's precision."""
    ckpt = build_checkpoint(arch, fmt)
    exact = oracle.read_float32_tensors(build_checkpoint(arch, "f32"))
    raw = oracle.read_raw_tensors(ckpt)
    lossy = oracle.read_float32_tensors(ckpt)
    assert set(lossy) == set(exact)
    for name, value in lossy.items():
        want = exact[name]
        if raw[name].dtype == torch.float8_e4m3fn and fmt == "fp8-channel":
            scale = raw[name + "_scale"].float().numpy()  # bf16 [out, 1]
            # Per row: scale = bf16(amax/448), so the largest |q| of each row is 448 give or take
            # the scale's rounding (then saturated at 448, or one code below it).
            bits = raw[name].view(torch.uint8).numpy()
            q = np.abs(dequantize_fp8_channel(bits, np.ones_like(scale)))
            row_amax = want.abs().max(dim=1).values.numpy()
            assert np.all(q.max(axis=1) >= 416) and np.all(q.max(axis=1) <= FP8_E4M3_MAX), name
            assert np.allclose(scale[:, 0], row_amax / FP8_E4M3_MAX, rtol=2.0**-8), name
            # Half an e4m3 ulp (2^-4 relative) plus saturation when rounding shrank the scale.
            bound = np.maximum(np.abs(want.numpy()) * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6) + (
                np.abs(want.numpy()) * 2.0**-8)
            assert np.all(np.abs(value.numpy() - want.numpy()) <= bound), name
        elif raw[name].dtype == torch.float8_e4m3fn:
            scale = raw[name + "_scale_inv"].float()
            # Per 128x128 block: scale = amax/448, so the largest |q| in each block is exactly 448.
            bits = raw[name].view(torch.uint8).numpy()
            q = np.abs(dequantize_fp8_blocks(bits, np.ones_like(scale.numpy())))
            for bi in range(scale.shape[0]):
                for bj in range(scale.shape[1]):
                    block = (slice(bi * 128, (bi + 1) * 128), slice(bj * 128, (bj + 1) * 128))
                    assert q[block].max() == FP8_E4M3_MAX, f"{name} block {bi},{bj}"
                    assert torch.isclose(scale[bi, bj], want[block].abs().max() / FP8_E4M3_MAX, rtol=1e-6)
            per_element_scale = np.repeat(np.repeat(scale.numpy(), 128, 0), 128, 1)[: want.shape[0], : want.shape[1]]
            # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 relative (normals), 2^-10 * scale (subnormals).
            bound = np.maximum(np.abs(want.numpy()) * 2.0**-4, per_element_scale * 2.0**-10) * (1 + 1e-6)
            assert np.all(np.abs(value.numpy() - want.numpy()) <= bound), name
        elif raw[name].dtype == torch.bfloat16:
            assert torch.all((value - want).abs() <= want.abs() * 2.0**-8), name
        else:
            assert torch.equal(value, want), f"{name} should be stored exactly"


def test_fp8_block_quantisation_with_partial_blocks() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((200, 300)).astype(np.float32)
    weight[128:, 256:] = 0.0  # an all-zero edge block
    weight[0, 0] = 7.0  # one large value only affects its own block
    bits, scale = quantize_fp8_blocks(weight)
    assert bits.shape == (200, 300) and bits.dtype == np.uint8
    assert scale.shape == (2, 3) and scale.dtype == np.float32
    assert scale[0, 0] == np.float32(7.0 / 448.0) and scale[1, 2] == 1.0
    back = dequantize_fp8_blocks(bits, scale)
    assert np.all(back[128:, 256:] == 0.0)
    expanded = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:200, :300]
    assert np.all(np.abs(back - weight) <= np.maximum(np.abs(weight) * 2.0**-4, expanded * 2.0**-10) * (1 + 1e-6))
    # torch's own e4m3 cast agrees with the stored bits
    expected = torch.from_numpy(weight / expanded).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(bits, expected)


def test_fp8_channel_quantisation() -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((70, 45)).astype(np.float32)
    weight[3] = 0.0  # an all-zero row gets scale 1
    weight[5, 7] = 900.0  # one large value only affects its own row
    bits, scale = quantize_fp8_channel(weight)
    assert bits.shape == (70, 45) and bits.dtype == np.uint8
    assert scale.shape == (70, 1) and scale.dtype == np.float32
    # Scales are stored in bf16: the values returned must already be bf16-exact.
    assert np.array_equal(scale, torch.from_numpy(scale).to(torch.bfloat16).float().numpy())
    assert scale[3, 0] == 1.0
    assert scale[5, 0] == torch.tensor(900.0 / 448.0).to(torch.bfloat16).float().item()
    back = dequantize_fp8_channel(bits, scale)
    assert np.all(back[3] == 0.0)
    assert np.all(np.abs(back - weight) <= np.abs(weight) * (2.0**-4 + 2.0**-8) + scale * 2.0**-10)
    # torch's own e4m3 cast agrees with the stored bits (no value left the e4m3 range here).
    scaled = weight / scale
    if np.abs(scaled).max() <= FP8_E4M3_MAX:
        assert np.array_equal(bits, torch.from_numpy(scaled).to(torch.float8_e4m3fn).view(torch.uint8).numpy())
    # The [out] form of the scale dequantises the same.
    assert np.array_equal(dequantize_fp8_channel(bits, scale[:, 0]), back)


@pytest.mark.parametrize(
    "quant, message",
    [
        ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}, "pack-quantized"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}, "strategy='tensor'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}, "num_bits=4"),
        ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "weight_block_size"),
        ({"quant_method": "awq"}, "'awq' is not supported"),
    ],
)
def test_unsupported_quantization_configs_are_refused(quant: dict[str, Any], message: str,
                                                      build_checkpoint: Callable[..., Path]) -> None:
    config = oracle.read_config(build_checkpoint("qwen3_moe", "fp8-channel"))
    config["quantization_config"] = quant
    with pytest.raises(ConfigError, match=re.escape(message)):
        normalise(config)


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_the_files_itself(arch: str, build_checkpoint: Callable[..., Path]) -> None:
    """from_pretrained (transformers' own loader) reads exactly what the oracle reads."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    ckpt = build_checkpoint(arch, "bf16")
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # GLM's MTP layer is reported as unexpected, as for real checkpoints
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32, attn_implementation="eager",
                                                  experts_implementation="eager")
    finally:
        logging.set_verbosity(verbosity)
    ours = oracle.load_reference_model(ckpt).state_dict()
    theirs = hf.state_dict()
    assert set(theirs) == set(ours)
    for name, tensor in theirs.items():
        assert torch.equal(tensor.float(), ours[name]), name


@pytest.mark.parametrize("arch", ARCHS)
def test_routing_is_not_trivial(arch: str, build_checkpoint: Callable[..., Path]) -> None:
    """Different tokens pick different experts, most experts get used, and GLM's correction
    bias changes some choices (so an engine that ignores it fails the oracle)."""
    ckpt = build_checkpoint(arch, "f32")
    model = oracle.load_reference_model(ckpt)
    config = oracle.read_config(ckpt)
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        model.model.layers[i].mlp.gate.register_forward_hook(
            lambda module, args, output, i=i: captured.__setitem__(i, args[0].reshape(-1, args[0].shape[-1]).detach()))
        for i in moe_layers(config)
    ]
    tokens = oracle.sequence_tokens(ckpt, arch)
    oracle.full_logits(model, tokens)
    for hook in hooks:
        hook.remove()
    k = config["num_experts_per_tok"]
    bias_changed = 0
    for layer, hidden in captured.items():
        gate = model.model.layers[layer].mlp.gate
        logits = hidden.float() @ gate.weight.float().T
        if arch == "glm4_moe":
            scores = logits.sigmoid()
            chosen = torch.topk(scores + gate.e_score_correction_bias, k).indices
            unbiased = torch.topk(scores, k).indices
            bias_changed += sum(set(a.tolist()) != set(b.tolist()) for a, b in zip(chosen, unbiased))
        else:
            chosen = torch.topk(logits.softmax(-1), k).indices
        sets = {tuple(sorted(row.tolist())) for row in chosen}
        assert len(sets) >= 8, f"layer {layer}: only {len(sets)} distinct expert sets over {len(tokens)} tokens"
        used = len(set(chosen.flatten().tolist()))
        assert used >= 0.75 * gate.weight.shape[0], f"layer {layer}: only {used} experts ever chosen"
    if arch == "glm4_moe":
        assert bias_changed >= 5, "e_score_correction_bias barely changes routing"


TEXTS = [
    "Hello, world! The quick brown fox.",
    "def f(x):\n    return {'a': [1, 2.5, None]}\n",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}',
    "Unicode: 東京 Москва naïve café 🙂 ∑ \t tabs and  double  spaces\r\n",
    "",
]


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_round_trips_and_special_tokens(arch: str, build_checkpoint: Callable[..., Path]) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ckpt = build_checkpoint(arch, "bf16")
    tokenizer = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    family = FAMILY_OF[arch]
    learned = len(json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"])
    ids = [tokenizer.token_to_id(spec.content) for spec in family.added]
    assert ids == list(range(learned, learned + len(family.added))), "added tokens follow the learned vocabulary in order"
    for spec, token_id in zip(family.added, ids):
        assert tokenizer.encode(spec.content).ids == [token_id], spec.content
        assert tokenizer.encode(f"a{spec.content}b").ids.count(token_id) == 1
    config = oracle.read_config(ckpt)
    generation = json.loads((ckpt / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tokenizer.token_to_id(t) for t in family.stop_tokens]
    if arch == "glm4_moe":
        assert config["eos_token_id"] == generation["eos_token_id"]
    else:
        assert config["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    hf_tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
    for text in TEXTS:
        assert hf_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(text).ids


@pytest.mark.parametrize("arch", ARCHS)
def test_chat_template_renders_with_jinja2(arch: str, build_checkpoint: Callable[..., Path]) -> None:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ckpt = build_checkpoint(arch, "bf16")
    template_text = json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"]
    family = FAMILY_OF[arch]
    assert template_text == (REPO_ROOT / "tools/ckpt/templates" / family.template_file).read_text()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda value, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"}]
    rendered = env.from_string(template_text).render(messages=messages, tools=tools, add_generation_prompt=True)
    markers = ["[gMASK]<sop>", "<|system|>", "<|user|>", "<|assistant|>"] if arch == "glm4_moe" else ["<|im_start|>system", "<|im_end|>", "<|im_start|>assistant"]
    for marker in markers:
        assert marker in rendered
    assert "Zürich" in rendered and "get_weather" in rendered
    hf = AutoTokenizer.from_pretrained(str(ckpt)).apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert hf == rendered
    tokenizer = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = tokenizer.encode(rendered).ids
    first_marker = "[gMASK]" if arch == "glm4_moe" else "<|im_start|>"
    assert ids[0] == tokenizer.token_to_id(first_marker)
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    overrides = {"num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2}
    first = write_checkpoint("qwen3_moe", "tiny", "fp8", tmp_path / "a", seed=3, overrides=overrides)
    second = write_checkpoint("qwen3_moe", "tiny", "fp8", tmp_path / "b", seed=3, overrides=overrides)
    other = write_checkpoint("qwen3_moe", "tiny", "fp8", tmp_path / "c", seed=4, overrides=overrides)
    names = sorted(path.name for path in first.iterdir())
    assert names == sorted(path.name for path in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()
    assert oracle.read_raw_tensors(first)["lm_head.weight"].float().ne(oracle.read_raw_tensors(other)["lm_head.weight"].float()).any()


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_bench_path_streams_a_loadable_checkpoint(tmp_path: Path, fmt: str) -> None:
    """The bench writer (numpy straight to the shards, no transformers model) yields the names
    and shapes transformers' class loads strictly; checked on a shrunken bench config."""
    overrides = {"num_hidden_layers": 2, "hidden_size": 160, "intermediate_size": 320, "num_attention_heads": 4,
                 "head_dim": 48, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 136, "vocab_size": 1536}
    ckpt = write_checkpoint("qwen3_moe", "bench", fmt, tmp_path / "bench", overrides=overrides)
    scales = {n for n in stored(ckpt) if n.endswith(SCALE_SUFFIX[fmt])}
    assert scales and set(stored(ckpt)) - scales == set(expected_shapes(oracle.read_config(ckpt)))
    model = oracle.load_reference_model(ckpt)
    assert np.isfinite(oracle.full_logits(model, [1, 2, 3])).all()


def test_bad_overrides_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_key_value_heads"):
        write_checkpoint("glm4_moe", "tiny", "f32", tmp_path / "x", overrides={"num_attention_heads": 5, "num_key_value_heads": 2})
    with pytest.raises(ValueError, match="vocab_size"):
        write_checkpoint("qwen3_moe", "tiny", "f32", tmp_path / "y", overrides={"vocab_size": 100})
    with pytest.raises(ValueError, match="unknown arch"):
        write_checkpoint("llama", "tiny", "f32", tmp_path / "z")


def test_cli(tmp_path: Path) -> None:
    assert {"glm4_moe", "qwen3_moe"} <= set(WRITERS)
    out = tmp_path / "cli"
    overrides = {"hidden_size": 80, "num_key_value_heads": 1, "vocab_size": 999, "use_qk_norm": False}
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/make_checkpoint.py"), "--arch", "glm4_moe", "--size", "tiny",
         "--format", "bf16", "--out", str(out), "--seed", "5", "--config-overrides", json.dumps(overrides)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    config = oracle.read_config(out)
    assert {key: config[key] for key in overrides} == overrides
    bad = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/make_checkpoint.py"), "--arch", "glm4_moe", "--size", "tiny",
         "--format", "bf16", "--out", str(tmp_path / "bad"), "--config-overrides", "[1]"],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode != 0 and "JSON object" in bad.stderr
