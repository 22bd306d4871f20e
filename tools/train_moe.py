#!/usr/bin/env python3
"""Train a small MoE on real text, so that routing traces have a trained router's structure.

Random-weight checkpoints route almost independently from one token to the next, so a cache
policy replayed on their traces can only learn each expert's popularity, while Belady's
optimum still sees the future; the gap says little about real checkpoints.  This tool trains a
small qwen3_moe (transformers' own model class, load-balancing loss on, as real MoEs are
trained) on text every machine with Python has: the standard library's source, which is code,
comments and docstrings, and its reference documentation (pydoc_data).  A byte-level BPE is
trained on the same text.  The result is written in the real on-disk layout (per-expert
tensor names, shards, bf16, tokenizer.json), so the engine serves it like any checkpoint.

A fiftieth of the files, chosen by a hash of their path, is never trained on; the tool writes
them to DIR/heldout.txt, the text `routing_trace.py record --text` feeds through the engine.

    python tools/train_moe.py --out DIR [--steps 1000] [--minutes 25] [--seed 0] [--config-overrides JSON]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so `tools.ckpt` imports from a checkout

from tools.ckpt import hf_moe  # noqa: E402

HELDOUT_EVERY = 50  # one file in this many (by path hash) is held out
TOKENIZER_SIZE = 4096

# 64 experts, 8 per token, like the bench checkpoints and Qwen3-30B-A3B's ratio (128 / 8);
# small enough that a few hundred steps fit in minutes on two cores.
MODEL: dict[str, object] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "rope_theta": 10000.0, "attention_bias": False,
    "moe_intermediate_size": 64, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
    "output_router_logits": True, "router_aux_loss_coef": 0.01,
}


STDLIB = Path(sysconfig.get_paths()["stdlib"])


def source_files() -> list[Path]:
    """The standard library's Python files (site-packages excluded), in a fixed order."""
    return sorted(p for p in STDLIB.rglob("*.py")
                  if "site-packages" not in p.parts and "__pycache__" not in p.parts and p.is_file())


def is_heldout(path: Path) -> bool:
    digest = hashlib.sha1(str(path.relative_to(STDLIB)).encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELDOUT_EVERY == 0


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def token_stream(tokenizer, docs: list[Path], eos: int, need: int) -> np.ndarray:
    """Documents' tokens joined by eos, until `need` tokens."""
    out: list[np.ndarray] = []
    have = 0
    for start in range(0, len(docs), 256):
        batch = [read_text(p) for p in docs[start:start + 256]]
        for enc in tokenizer.encode_batch(batch):
            out.append(np.asarray(enc.ids + [eos], dtype=np.int64))
            have += len(enc.ids) + 1
        if have >= need:
            break
    return np.concatenate(out)[:need]


def train(args: argparse.Namespace) -> None:
    import torch
    from tokenizers import Tokenizer

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    files = source_files()
    heldout = [p for p in files if is_heldout(p)]
    train_files = [p for p in files if not is_heldout(p)]
    random.Random(args.seed).shuffle(train_files)
    print(f"{len(train_files)} training files, {len(heldout)} held out", flush=True)

    def bpe_text():
        total = 0
        for p in train_files:
            text = read_text(p)
            total += len(text)
            yield text
            if total >= args.tokenizer_text_mb * 1e6:
                return

    args.out.mkdir(parents=True, exist_ok=True)
    config, tok_files = hf_moe.start_checkpoint("qwen3_moe", "tiny", args.out, {**MODEL, **args.overrides},
                                                tokenizer_size=TOKENIZER_SIZE, corpus=bpe_text())
    tokenizer = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    eos = tok_files.ids["<|endoftext|>"]
    seq, batch = args.seq, args.batch
    stream = token_stream(tokenizer, train_files, eos, args.steps * batch * seq)
    steps = min(args.steps, len(stream) // (batch * seq))
    print(f"{len(stream):,} training tokens, {steps} steps of {batch} x {seq}", flush=True)

    hf_config = hf_moe.hf_config_object(config)
    hf_config.output_router_logits = True
    hf_config._experts_implementation = "grouped_mm"  # training speed; the weights are the same
    model = hf_moe.hf_model_class(config)(hf_config)
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]  # matrices decay; norms do not
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    started = time.perf_counter()
    done = 0
    for step in range(steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        x = torch.from_numpy(stream[step * batch * seq: (step + 1) * batch * seq]).view(batch, seq)
        out = model(input_ids=x, labels=x, output_router_logits=True)  # the class shifts the labels
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        elapsed = time.perf_counter() - started
        if step % 10 == 0 or step == steps - 1:
            aux = float(out.aux_loss.detach()) if getattr(out, "aux_loss", None) is not None else float("nan")
            print(f"step {step:4d}/{steps} loss {float(out.loss.detach()):.3f} aux {aux:.3f} lr {lr:.2e} "
                  f"{elapsed / 60:.1f} min", flush=True)
        if elapsed > args.minutes * 60:
            print(f"time limit: stopping after {done} steps", flush=True)
            break

    state = hf_moe.unfuse_experts(model.state_dict(), config)
    specs = hf_moe.tensor_specs(config)
    total = hf_moe.planned_bytes(specs, "bf16")
    hf_moe.write_shards(args.out, specs, "bf16", lambda spec: state[spec.name], max(1, math.ceil(total / 3)))
    hf_moe.finish_checkpoint(config, tok_files, "bf16", args.out)
    held = "\n".join(read_text(p) for p in heldout)
    (args.out / "heldout.txt").write_text(held, encoding="utf-8")
    print(f"wrote {args.out} ({done} steps, {(time.perf_counter() - started) / 60:.1f} min); "
          f"held-out text {len(held):,} characters", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=25.0, help="stop early after this long")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokenizer-text-mb", type=float, default=8.4, help="training text the BPE learns from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config-overrides", default="{}", help="JSON object of config.json fields to override")
    args = ap.parse_args(argv)
    args.overrides = json.loads(args.config_overrides)
    if not isinstance(args.overrides, dict):
        ap.error("--config-overrides must be a JSON object")
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
