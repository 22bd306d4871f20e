"""Token sampling: temperature, top-k, top-p, min-p, presence/frequency penalties, seeds, logprobs.

Everything runs on the numpy logits row the engine returns for the last position.  A request
with a seed gets its own generator, so the same request and seed give the same tokens.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit

    def validate(self) -> None:
        """Raises ValueError naming the bad parameter (the server turns it into a 400)."""
        if not 0.0 <= self.temperature <= 2.0 or self.temperature != self.temperature:
            raise ValueError("temperature: must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k: must be >= 0")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p: must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name}: must be between -2 and 2")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs: must be between 0 and 20")
        for token, bias in self.logit_bias.items():
            if token < 0 or not -100.0 <= bias <= 100.0:
                raise ValueError("logit_bias: token ids must be >= 0 and biases between -100 and 100")


@dataclass
class SampledToken:
    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return shifted - np.log(np.sum(np.exp(shifted)))


class Sampler:
    """Samples one request's tokens; keeps the counts the penalties need."""

    def __init__(self, params: SamplingParams) -> None:
        params.validate()
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        self._counts: Counter[int] = Counter()

    def _penalised(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        if not self._counts or (p.presence_penalty == 0.0 and p.frequency_penalty == 0.0):
            return logits
        out = logits.astype(np.float32, copy=True)
        ids = np.fromiter(self._counts.keys(), dtype=np.int64)
        counts = np.fromiter(self._counts.values(), dtype=np.float32)
        out[ids] -= p.frequency_penalty * counts + p.presence_penalty
        return out

    def allowed_distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probabilities actually sampled from (after penalties, temperature, filters)."""
        p = self.params
        scores = self._penalised(logits).astype(np.float64) / p.temperature
        if p.top_k and p.top_k < scores.size:
            kth = np.partition(scores, -p.top_k)[-p.top_k]
            scores = np.where(scores < kth, -np.inf, scores)
        probs = np.exp(scores - np.max(scores))
        probs /= probs.sum()
        if p.min_p > 0.0:
            probs = np.where(probs < p.min_p * probs.max(), 0.0, probs)
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            cut = int(np.searchsorted(cumulative, p.top_p, side="left")) + 1
            keep = np.zeros_like(probs, dtype=bool)
            keep[order[:cut]] = True
            probs = np.where(keep, probs, 0.0)
        return probs / probs.sum()

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> SampledToken:
        """Picks the next token from one logits row.  `allowed` (bool mask) restricts the choice,
        e.g. for grammar-constrained decoding."""
        row = np.asarray(logits, dtype=np.float32).reshape(-1)
        if self.params.logit_bias:
            row = row.copy()
            for token, bias in self.params.logit_bias.items():
                if token < row.size:
                    row[token] += bias
        if allowed is not None:
            row = np.where(allowed, row, -np.inf).astype(np.float32)
        if self.params.temperature == 0.0:
            token = int(np.argmax(self._penalised(row)))
        else:
            probs = self.allowed_distribution(row)
            token = int(self._rng.choice(probs.size, p=probs))
        self._counts[token] += 1
        result = SampledToken(token)
        if self.params.logprobs:
            lp = log_softmax(np.where(np.isfinite(row), row, -1e30))
            result.logprob = float(lp[token])
            n = self.params.top_logprobs
            if n:
                top = np.argpartition(-lp, n - 1)[:n]
                top = top[np.argsort(-lp[top], kind="stable")]
                result.top = [(int(i), float(lp[i])) for i in top]
        return result
