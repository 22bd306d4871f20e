#!/usr/bin/env python3
"""Write a random-weight MoE checkpoint in the real on-disk layout.

    python tools/make_checkpoint.py --arch glm4_moe --size tiny --format bf16 --out DIR \
        [--seed N] [--config-overrides '{"hidden_size": 80, "num_key_value_heads": 3}']

`tiny` checkpoints (a few MB) are what the oracle tests compare against transformers; `bench`
checkpoints (a few GB) are for benchmarks only and are streamed to disk shard by shard.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so `tools.ckpt` imports from a checkout

from tools.ckpt import FORMATS, SIZES, WRITERS, write_checkpoint  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", required=True, choices=sorted(WRITERS))
    parser.add_argument("--size", required=True, choices=SIZES)
    parser.add_argument("--format", required=True, choices=FORMATS, dest="fmt")
    parser.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config-overrides", default="{}", help="JSON object of config.json fields to override")
    args = parser.parse_args(argv)
    try:
        args.overrides = json.loads(args.config_overrides)
    except json.JSONDecodeError as error:
        parser.error(f"--config-overrides is not valid JSON: {error}")
    if not isinstance(args.overrides, dict):
        parser.error("--config-overrides must be a JSON object")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        out = write_checkpoint(args.arch, args.size, args.fmt, args.out, seed=args.seed, overrides=args.overrides)
    except ValueError as error:
        print(f"make_checkpoint: {error}", file=sys.stderr)
        return 2
    size = sum(path.stat().st_size for path in out.iterdir() if path.is_file())
    print(f"wrote {args.arch} {args.size} {args.fmt} to {out} ({size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
