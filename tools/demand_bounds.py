"""How close can demand caching get to Belady on a routing trace, and with what knowledge?

The store's demand policy (routing_trace.py's `ours`) ranks cached experts by a next use it
predicts from routing ids alone.  This tool replays a trace through that policy with a piece
of the future given to it, so a gap to Belady can be split into what better learning could
still win and what no policy seeing only the past can:

  oracle-token      experts wanted within the next L fetches (one token) ranked by their true
                    next use, above all others; the rest as ours ranks them
  oracle-this-token of those, only the experts of the layers still to come in the current
                    token: what perfect look-ahead hints (the next layers' routers) could give
                    a demand cache
  oracle-next-token of those, only the experts of the layers the current token has passed,
                    which the next token asks for again
  future-popularity ours with each expert's request rate replaced by its share of its layer's
                    visits over `window` visits before and after now (the next visit left out):
                    the best any learned popularity can be

    python tools/demand_bounds.py tools/traces/NAME.trace [--budgets 0.1,0.125,0.25] [--window 64]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing_trace as rt  # noqa: E402

SCOPES = ("token", "this-token", "next-token")


class _Oracle(rt._NextUse):
    """ours, except that experts whose next request lies within one token (and in `scope`) are
    ranked by that true distance, above every other."""

    def __init__(self, trace: rt.Trace, scope: str) -> None:
        super().__init__(trace.n_layers, trace.n_experts, None)
        self.scope, self.t = scope, -1
        self.next_uses = rt._next_uses(trace)
        self.keys_at = trace.keys
        self.nxt = np.full(trace.n_keys, math.inf)

    def request(self, layer: int, keys: np.ndarray) -> None:
        super().request(layer, keys)
        self.t += 1
        self.nxt[self.keys_at(self.t)] = self.next_uses[self.t]

    def score(self, k: np.ndarray, layer: int) -> np.ndarray:
        s = super().score(k, layer)
        dist = self.nxt[k] - self.t
        known = dist <= self.n_layers
        if self.scope == "this-token":
            known &= k // self.n_experts > layer
        elif self.scope == "next-token":
            known &= k // self.n_experts <= layer
        return np.where(known, 1e9 - dist, s)


class _FuturePopularity(rt._NextUse):
    """ours ranking by each expert's share of its layer's visits in [now - window, now + 1 + window],
    the next visit excluded, instead of its learned f (the stickiness w is still learned from
    the past)."""

    def __init__(self, trace: rt.Trace, window: int) -> None:
        super().__init__(trace.n_layers, trace.n_experts, None)
        L, E = trace.n_layers, trace.n_experts
        visits: list[list[np.ndarray]] = [[] for _ in range(L)]
        for i in range(len(trace)):
            layer = int(trace.layers[i])
            row = np.zeros(E)
            row[trace.keys(i) - layer * E] = 1.0
            visits[layer].append(row)
        self.cum = [np.vstack([np.zeros(E), np.cumsum(np.array(v).reshape(-1, E), axis=0)]) for v in visits]
        self.window, self.seen = window, np.zeros(L, dtype=np.int64)
        self.popularity = np.zeros(L * E)

    def request(self, layer: int, keys: np.ndarray) -> None:
        super().request(layer, keys)
        done = int(self.seen[layer]) + 1  # visits of the layer so far; the next one is index `done`
        self.seen[layer] = done
        cum, W = self.cum[layer], self.window
        n_vis = len(cum) - 1
        past_from, ahead_from, ahead_to = max(0, done - W), min(n_vis, done + 1), min(n_vis, done + 1 + W)
        count = (cum[done] - cum[past_from]) + (cum[ahead_to] - cum[ahead_from])
        n = (done - past_from) + (ahead_to - ahead_from)
        E = self.n_experts
        self.popularity[layer * E : (layer + 1) * E] = count / max(n, 1)

    def rates(self, k: np.ndarray) -> np.ndarray:
        return self.popularity[k]


def bounds(trace: rt.Trace, n_slots: int, window: int = 64) -> dict[str, float]:
    """Hit rates of ours, Belady and each partial oracle with n_slots expert slots."""
    row = {"ours": rt.simulate(trace, "ours", n_slots).hit_rate,
           "belady": rt.simulate(trace, "belady", n_slots).hit_rate}
    for scope in SCOPES:
        row[f"oracle-{scope}"] = rt.simulate(trace, "ours", n_slots, model=_Oracle(trace, scope)).hit_rate
    row["future-popularity"] = rt.simulate(trace, "ours", n_slots, model=_FuturePopularity(trace, window)).hit_rate
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--budgets", default="0.1,0.125,0.25", help="shares of the expert pool")
    ap.add_argument("--window", type=int, default=64, help="visits each side for future-popularity")
    args = ap.parse_args(argv)
    trace = rt.read_trace(args.trace)
    cols = ["ours", "oracle-this-token", "oracle-next-token", "oracle-token", "future-popularity", "belady"]
    print(f"{'budget':>7} {'slots':>6} " + " ".join(f"{c:>17}" for c in cols) + "   (hit rate; gap to belady in points)")
    for b in (float(x) for x in args.budgets.split(",")):
        slots = max(trace.n_experts, int(round(b * trace.n_keys)))
        row = bounds(trace, slots, args.window)
        cells = [f"{row[c]:.3f} ({100 * (row['belady'] - row[c]):4.1f})" for c in cols]
        print(f"{b:>7.3f} {slots:>6d} " + " ".join(f"{c:>17}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
