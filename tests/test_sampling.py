"""gateway.sampling: every filter checked against its definition on small hand-made logits."""
from __future__ import annotations

import numpy as np
import pytest

from gateway.sampling import Sampler, SamplingParams, log_softmax

LOGITS = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=np.float64)).astype(np.float32)


def dist(**kw) -> np.ndarray:
    return Sampler(SamplingParams(**kw)).allowed_distribution(LOGITS)


def test_plain_distribution_is_softmax():
    np.testing.assert_allclose(dist(), [0.5, 0.25, 0.125, 0.0625, 0.0625], rtol=1e-6)


def test_temperature_sharpens_and_flattens():
    cold, hot = dist(temperature=0.5), dist(temperature=2.0)
    expected_cold = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625]) ** 2
    np.testing.assert_allclose(cold, expected_cold / expected_cold.sum(), rtol=1e-6)
    assert hot[0] < 0.5 < cold[0]


def test_top_k_keeps_k_best():
    d = dist(top_k=2)
    np.testing.assert_allclose(d, [2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    np.testing.assert_allclose(dist(top_p=0.75), [2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)  # 0.5+0.25 reaches 0.75
    np.testing.assert_allclose(dist(top_p=0.76), [4 / 7, 2 / 7, 1 / 7, 0, 0], rtol=1e-6)
    assert dist(top_p=0.01)[0] == pytest.approx(1.0)  # always at least one token


def test_min_p_is_relative_to_the_best_token():
    np.testing.assert_allclose(dist(min_p=0.3), [2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)  # 0.3*0.5 = 0.15


def test_penalties_follow_the_openai_formula():
    s = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, temperature=1.0, seed=0))
    s._counts.update({0: 3, 2: 1})
    out = s._penalised(LOGITS)
    np.testing.assert_allclose(out[0], LOGITS[0] - (0.25 * 3 + 0.5), rtol=1e-6)
    np.testing.assert_allclose(out[2], LOGITS[2] - (0.25 * 1 + 0.5), rtol=1e-6)
    np.testing.assert_allclose(out[[1, 3, 4]], LOGITS[[1, 3, 4]])


def test_penalties_apply_to_sampled_tokens():
    """Greedy with a strong presence penalty never repeats a token while others are close."""
    logits = np.array([1.0, 0.9, 0.8, 0.7], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=2.0))
    assert [s.sample(logits).token_id for _ in range(4)] == [0, 1, 2, 3]


def test_greedy_and_mask():
    s = Sampler(SamplingParams(temperature=0.0))
    assert s.sample(LOGITS).token_id == 0
    mask = np.array([False, False, True, True, False])
    assert s.sample(LOGITS, mask).token_id == 2


def test_seed_reproducible_and_distribution_correct():
    params = dict(temperature=1.0, seed=42)
    a = [Sampler(SamplingParams(**params)).sample(LOGITS).token_id for _ in range(1)]
    s1, s2 = Sampler(SamplingParams(**params)), Sampler(SamplingParams(**params))
    seq1 = [s1.sample(LOGITS).token_id for _ in range(200)]
    seq2 = [s2.sample(LOGITS).token_id for _ in range(200)]
    assert seq1 == seq2 and a[0] == seq1[0]
    other = Sampler(SamplingParams(temperature=1.0, seed=43))
    assert [other.sample(LOGITS).token_id for _ in range(200)] != seq1
    big = Sampler(SamplingParams(temperature=1.0, seed=7))
    counts = np.bincount([big.sample(LOGITS).token_id for _ in range(4000)], minlength=5) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.25, 0.125, 0.0625, 0.0625], atol=0.03)


def test_logprobs_are_of_the_raw_logits():
    s = Sampler(SamplingParams(temperature=0.7, seed=1, logprobs=True, top_logprobs=3))
    tok = s.sample(LOGITS)
    lp = log_softmax(LOGITS)
    assert tok.logprob == pytest.approx(float(lp[tok.token_id]))
    assert [t for t, _ in tok.top] == [0, 1, 2]
    assert [v for _, v in tok.top] == pytest.approx([float(lp[0]), float(lp[1]), float(lp[2])])
    assert Sampler(SamplingParams(seed=1)).sample(LOGITS).logprob is None


@pytest.mark.parametrize("kw, name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=2.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(min_p=1.5), "min_p"), (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"), (dict(top_logprobs=21), "top_logprobs"),
])
def test_validation_names_the_parameter(kw, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        SamplingParams(**kw).validate()


def test_logit_bias_shifts_and_bans():
    s = Sampler(SamplingParams(temperature=0.0, logit_bias={3: 100.0}))
    assert s.sample(LOGITS).token_id == 3
    s = Sampler(SamplingParams(temperature=0.0, logit_bias={0: -100.0}))
    assert s.sample(LOGITS).token_id == 1
    with pytest.raises(ValueError, match="^logit_bias:"):
        SamplingParams(logit_bias={1: 150.0}).validate()
