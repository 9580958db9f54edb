"""Temperature, top-k and top-p, held against probabilities written out by hand and against a numpy
computation from their definitions (tests/exactness.py's reference_probs), never against
decode.sampling itself; with controls, wrong variants of the processing, that the checks catch."""
import itertools

import numpy as np
import pytest
import torch

from decode.sampling import Sampling, next_token, token_probs
from tests.exactness import SIGNIFICANCE, g_test, reference_probs

PROBS = [0.1, 0.4, 0.2, 0.3]
LOGITS = torch.log(torch.tensor(PROBS, dtype=torch.float64))
# logits without ties, of several rows, for the grid against the reference
GRID_LOGITS = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
GRID = list(itertools.product([0.3, 0.7, 1.0, 1.5, 2.5], [None, 1, 2, 5], [1.0, 0.95, 0.6, 0.3]))


def by_hand(weights):
    weights = torch.tensor(weights, dtype=torch.float64)
    return weights / weights.sum()


def test_greedy_is_one_hot_argmax():
    assert token_probs(LOGITS, Sampling()).tolist() == [0, 1, 0, 0]
    assert next_token(LOGITS, Sampling()) == 1


@pytest.mark.parametrize("temperature, expected", [
    (1.0, PROBS),
    (2.0, [p ** 0.5 for p in PROBS]),   # softmax(log p / 2) is proportional to sqrt(p)
    (0.5, [p ** 2 for p in PROBS]),     # and at 0.5 to p squared
    (0.25, [p ** 4 for p in PROBS]),
])
def test_temperature_divides_the_logits(temperature, expected):
    torch.testing.assert_close(token_probs(LOGITS, Sampling(temperature=temperature)), by_hand(expected))


def test_top_k_keeps_the_k_most_likely():
    probs = token_probs(LOGITS, Sampling(temperature=1.0, top_k=2))
    torch.testing.assert_close(probs, by_hand([0, 0.4, 0, 0.3]))
    # at temperature 0.5 the two survivors weigh 0.4^2 against 0.3^2
    torch.testing.assert_close(token_probs(LOGITS, Sampling(temperature=0.5, top_k=2)), by_hand([0, 0.16, 0, 0.09]))


def test_top_p_keeps_the_smallest_set_reaching_p():
    # sorted: 0.4, 0.3, 0.2, 0.1; 0.4 + 0.3 = 0.7 >= 0.65, so two tokens stay
    probs = token_probs(LOGITS, Sampling(temperature=1.0, top_p=0.65))
    torch.testing.assert_close(probs, by_hand([0, 0.4, 0, 0.3]))
    # a tiny p still keeps the most likely token
    assert token_probs(LOGITS, Sampling(temperature=1.0, top_p=1e-9)).tolist() == [0, 1, 0, 0]


def test_top_k_comes_before_top_p():
    # top-k 2 leaves 0.4 and 0.3, renormalised 0.57 and 0.43: top-p 0.5 then keeps only the first.
    # The other order would keep both (0.4 < 0.5 before adding 0.3) and give 0.57 and 0.43.
    assert token_probs(LOGITS, Sampling(temperature=1.0, top_k=2, top_p=0.5)).tolist() == [0, 1, 0, 0]


def test_the_reference_agrees_with_the_hand_written_cases():
    np.testing.assert_allclose(reference_probs(LOGITS, 2.0), by_hand([p ** 0.5 for p in PROBS]))
    np.testing.assert_allclose(reference_probs(LOGITS, 0.5, top_k=2), by_hand([0, 0.16, 0, 0.09]))
    np.testing.assert_allclose(reference_probs(LOGITS, 1.0, top_p=0.65), by_hand([0, 0.4, 0, 0.3]))
    np.testing.assert_allclose(reference_probs(LOGITS, 1.0, top_k=2, top_p=0.5), [0, 1, 0, 0])


def assert_matches_the_reference(probs_of):
    """probs_of(logits, sampling) equals the reference on every setting of GRID."""
    for temperature, top_k, top_p in GRID:
        probs = probs_of(GRID_LOGITS, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
        np.testing.assert_allclose(probs.numpy(), reference_probs(GRID_LOGITS, temperature, top_k, top_p),
                                   rtol=1e-9, atol=1e-12, err_msg=f"T={temperature} top-k={top_k} top-p={top_p}")


def test_every_setting_matches_the_reference():
    assert_matches_the_reference(token_probs)


def multiplied_temperature(logits, sampling):
    return token_probs(logits * sampling.temperature ** 2, sampling)  # logits * T, where logits / T is right


def top_p_before_top_k(logits, sampling):
    nucleus = token_probs(logits, Sampling(sampling.temperature, top_p=sampling.top_p))
    if sampling.top_k is None:
        return nucleus
    return token_probs(nucleus.log(), Sampling(1.0, top_k=sampling.top_k))


@pytest.mark.parametrize("wrong", [multiplied_temperature, top_p_before_top_k])
def test_the_reference_catches_a_wrong_processing(wrong):
    with pytest.raises(AssertionError):
        assert_matches_the_reference(wrong)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, None, 1.0), (0.6, 3, 0.9), (1.7, None, 0.8)])
def test_draws_follow_the_reference_distribution(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    draws = torch.tensor([next_token(LOGITS, sampling, gen) for _ in range(4000)])
    counts = torch.bincount(draws, minlength=len(PROBS)).double().numpy()[None]
    assert g_test(counts, reference_probs(LOGITS, temperature, top_k, top_p)[None])[2] > SIGNIFICANCE
