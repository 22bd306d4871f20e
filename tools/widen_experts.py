"""Widen a checkpoint's routed experts with zeros: the same model, with disk-sized experts.

A small model trained in minutes (tools/train_moe.py) has a trained router but experts of a
few tens of KB, so reading them is bound by latency, not by the disk.  Padding each expert's
intermediate width with zero rows (gate_proj, up_proj) and zero columns (down_proj) leaves
every expert's output unchanged (silu(0) * 0 = 0, and the zero columns add nothing), hence the
routing too, while each expert takes `--width / moe_intermediate_size` times the bytes.  The
result measures the expert store where the disk bounds decode, with a trained router's
routing (tools/traces/README.md).  bf16 / fp16 / fp32 expert weights only (block-scaled
formats would need their scales padded too).

    python tools/widen_experts.py SRC DST --width 2048
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

EXPERT = re.compile(r"\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.weight$")


def widen(src: Path, dst: Path, width: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    old = int(config["moe_intermediate_size"])
    if width <= old:
        raise SystemExit(f"--width {width} must exceed moe_intermediate_size {old}")
    dst.mkdir(parents=True, exist_ok=True)
    config["moe_intermediate_size"] = width
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in src.iterdir():  # tokenizer, generation config, held-out text ...
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json",
                                                                                "model.safetensors.index.json"):
            shutil.copy(f, dst / f.name)
    index_path = src / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index_path.read_text())["weight_map"].values())) if index_path.exists() \
        else ["model.safetensors"]
    total = 0
    for shard in shards:
        tensors = load_file(str(src / shard))
        out = {}
        for name, t in tensors.items():
            m = EXPERT.search(name)
            if m:
                if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                    raise SystemExit(f"{name}: {t.dtype} experts cannot be widened (bf16/fp16/fp32 only)")
                if m.group(1) == "down_proj":
                    z = torch.zeros((t.shape[0], width), dtype=t.dtype)
                    z[:, :old] = t
                else:
                    z = torch.zeros((width, t.shape[1]), dtype=t.dtype)
                    z[:old] = t
                t = z
            out[name] = t.contiguous()
            total += t.numel() * t.element_size()
        save_file(out, str(dst / shard), metadata={"format": "pt"})
        print(f"{shard}: written", flush=True)
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index.setdefault("metadata", {})["total_size"] = total
        (dst / index_path.name).write_text(json.dumps(index, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--width", type=int, required=True, help="new moe_intermediate_size")
    args = ap.parse_args(argv)
    widen(args.src, args.dst, args.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
