"""One bounded schemathesis run against a demo server (`make fuzz`).

Starts `python -m gateway` on the demo checkpoint (a small context and a small default
max_tokens, so generated requests finish quickly), points schemathesis at its /openapi.json
with a fixed seed, a per-operation example cap and a time budget, prints schemathesis' report
and stops the server.  The exit code is schemathesis' (non-zero when it found a failure).

    python tools/fuzz_api.py [--max-examples N] [--max-time SECONDS] [--seed S] [-- extra schemathesis args]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# What the server must honour: no 5xx, the documented status codes, content types and reply
# schemas, and invalid input refused (the checks that need stateful resources do not apply).
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "negative_data_rejection")


def start_demo_server(log_path: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT / "python"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", "0", "--threads", "1",
           "--ctx", "512", "--max-tokens", "16", "--max-queue", "64"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the demo server exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        found = re.search(r"listening\s+(http://127\.0\.0\.1:\d+)", log_path.read_text(errors="replace"))
        if found:
            try:
                with urllib.request.urlopen(found.group(1) + "/health", timeout=2):
                    return proc, found.group(1)
            except OSError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the demo server did not start in 180 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=10, help="test cases per operation (default 10)")
    parser.add_argument("--max-time", type=int, default=150, help="time budget in seconds (default 150)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("extra", nargs="*", help="more schemathesis arguments (after --)")
    args = parser.parse_args(argv)
    st = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if st is None:
        raise SystemExit("schemathesis is not installed (it is in the test extra: pip install -e '.[test]')")
    log_path = Path(tempfile.mkstemp(prefix="moegate-fuzz-server-", suffix=".log")[1])
    proc, base = start_demo_server(log_path)
    try:
        cmd = [st, "run", f"{base}/openapi.json", "--checks", CHECKS, "--seed", str(args.seed),
               "--max-examples", str(args.max_examples), "--max-time", str(args.max_time), "--workers", "1",
               "--request-timeout", "60", "--output-sanitize", "false", "--no-color",
               "--generation-database", "none", *args.extra]
        print("$ " + " ".join(cmd), flush=True)
        with tempfile.TemporaryDirectory(prefix="moegate-fuzz-") as scratch:
            code = subprocess.call(cmd, cwd=scratch)  # schemathesis leaves its .schemathesis folder there
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        server_log = log_path.read_text(errors="replace")
        log_path.unlink(missing_ok=True)
    # The gateway's own logged bugs (app.py / serving.py log.exception), which a stream may hide
    # behind its 200; aiohttp's logged refusals of malformed HTTP (a NUL in a header) are not ours.
    ours = [line for line in server_log.splitlines() if "internal error on" in line or "error while streaming" in line]
    if ours:
        print("the server logged internal errors:\n" + "\n".join(ours[:20]), file=sys.stderr)
        code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
