"""Command line: `python -m gateway --model DIR|FILE.gguf [--ram GB] [--threads N] [--host H] [--port P] ...`."""
from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gateway",
                                description="Serve a Mixture-of-Experts checkpoint on CPU behind OpenAI- and "
                                            "Anthropic-compatible APIs.")
    p.add_argument("--model", help="checkpoint folder (config.json, safetensors, tokenizer.json), one .gguf "
                                   "file, or a folder holding one GGUF model; without it a tiny random-weight demo checkpoint is served")
    p.add_argument("--ram", type=float, default=None, metavar="GB", help="memory budget for the whole process")
    p.add_argument("--read-ahead", action=argparse.BooleanOptionalAction, default=True,
                   help="with --ram: while a layer computes, read the experts the next layer's router, "
                        "applied one layer early, predicts, as far as the disk would otherwise sit idle "
                        "(default: on; a higher hit rate for some wasted reads)")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ctx", type=int, default=None, help="context length of the slot, in tokens")
    p.add_argument("--kv-dtype", choices=["bf16", "f32"], default="bf16",
                   help="KV cache storage (default bf16: half the bytes per token of f32; --ram counts it at --ctx)")
    p.add_argument("--activations", choices=["f32", "int8"], default="f32",
                   help="f32 (default, exact) or int8: the GGUF block-format and native FP4 linears quantise "
                        "each input row once per linear (integer dot products: faster decode, llama.cpp-like "
                        "rounding), and on CPUs with AVX512_BF16 bf16 / fp8 prefill rounds x to bf16")
    p.add_argument("--prefix-cache", type=float, default=None, metavar="GB",
                   help="RAM for snapshots of conversations the slot leaves, so switching back costs no "
                        "prefill (default: a tenth of --ram up to 2 GB, taken out of --ram; 1 GB without "
                        "--ram; 0: off)")
    p.add_argument("--prefix-cache-dir", default=None, metavar="DIR",
                   help="also keep conversation snapshots in DIR, across restarts: a new session that "
                        "starts like an earlier one (an agent's system prompt and tools) skips that "
                        "prefill.  The files hold conversation tokens; off by default")
    p.add_argument("--prefix-cache-disk", type=float, default=20.0, metavar="GB",
                   help="disk budget of --prefix-cache-dir (default 20; least recently used files go first)")
    p.add_argument("--api-key", default=None, help="require this key (Bearer or x-api-key); /health stays public")
    p.add_argument("--model-id", default=None, help="model name reported by /v1/models (default: folder name, or file name without .gguf)")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait for the slot before 429")
    p.add_argument("--max-tokens", type=int, default=4096, help="default max_tokens when a request sets none")
    p.add_argument("--cors", default="", help="comma-separated allowed origins ('*' for any); off by default")
    p.add_argument("--reasoning-field", choices=["reasoning_content", "both"], default="reasoning_content",
                   help="'both' also mirrors reasoning as `reasoning` for vLLM/OpenRouter-style clients")
    p.add_argument("--keepalive", type=float, default=10.0, metavar="SECONDS",
                   help="SSE keepalive comment / Anthropic ping interval while queued or prefilling")
    p.add_argument("--retry-after", type=int, default=5, metavar="SECONDS",
                   help="Retry-After sent with 429 when the queue is full")
    p.add_argument("--kernels", default=None, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.prefix_cache is not None and not args.prefix_cache >= 0:
        parser.error("--prefix-cache must be >= 0")
    if not args.prefix_cache_disk > 0:
        parser.error("--prefix-cache-disk must be > 0")
    if args.keepalive <= 0:
        parser.error("--keepalive must be > 0")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535 (0: any free port)")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server.serve import ServeOptions, serve
    try:
        serve(ServeOptions(
            model=args.model, ram_gb=args.ram, read_ahead=args.read_ahead, threads=args.threads, host=args.host, port=args.port,
            ctx=args.ctx, kv_dtype=args.kv_dtype, activations=args.activations, api_key=args.api_key, model_id=args.model_id, max_queue=args.max_queue,
            default_max_tokens=args.max_tokens,
            cors=tuple(o.strip() for o in args.cors.split(",") if o.strip()),
            reasoning_mirror=args.reasoning_field == "both", kernels=args.kernels,
            keepalive_seconds=args.keepalive, retry_after_seconds=args.retry_after,
            prefix_cache_gb=args.prefix_cache, prefix_cache_dir=args.prefix_cache_dir,
            prefix_cache_disk_gb=args.prefix_cache_disk))
    except KeyboardInterrupt:
        return 0
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"moegate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
