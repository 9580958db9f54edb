"""Sampled speculation keeps the target's distribution: every method, alone and in a batch, through
the context window's slide (runs of 48 tokens past a 24-token window), each with flawed verifiers
that the same test must catch. The statistic, the toy target and the flaws: tests/exactness.py.

The sample size and the controls were chosen from the power measured once over 20 seeds by
`python -m tests.sampling_power` (docs/2026-12-06-xeon-s.md): with TOKENS tokens each, the real
verifier passed 638 of 640 runs (every setting alone and in a batch of 3), and each control below
was caught in at least 95% of seeds, its effect size predicting as much.
"""
import pytest
import torch

from decode.tree import Candidates
from decode.verify import verify_sampling
from tests.exactness import (FLAWS, SETTINGS, SIGNIFICANCE, TOKENS, VOCAB, flawed_verifier, sampled_fit,
                              with_flaw)

SEED = 0
# The flaws each setting's test is shown to catch: those caught in at least 95% of seeds at TOKENS.
# A flaw left out of a setting changes too little there to show in TOKENS tokens (its effect size
# is in the log): a bonus drawn wrongly matters only after a fully accepted path, a 4-point
# generosity only where acceptance is not already certain, q only for sampled candidates.
CAUGHT = {
    "draft k=3": ["residual is p", "q of the parent", "acceptance 0.04 high"],
    "draft k=2, top-k top-p": ["residual is p", "acceptance 0.04 high"],
    "draft auto": ["residual is p", "q of the parent"],
    "draft heuristic": ["residual is p", "q of the parent", "acceptance 0.04 high"],
    "draft k=3, held by what was sampled": ["residual is p", "q of the parent", "acceptance 0.04 high"],
    "tree of draws and guesses": ["residual is p", "q of the parent", "bonus from the residual", "acceptance 0.04 high"],
    "jacobi": ["residual is p"],
    "lookahead": ["residual is p", "bonus from the residual"],
    "lookahead sized": ["residual is p", "bonus from the residual"],
    "prompt lookup": ["residual is p"],
    "medusa chain": ["residual is p"],
    "medusa tree, top-k top-p": ["residual is p", "bonus from the residual", "acceptance 0.04 high"],
    "eagle chain": ["residual is p", "q of the parent"],
    "eagle chain auto": ["residual is p", "q of the parent"],
    "eagle tree, top-k top-p": ["residual is p", "acceptance 0.04 high"],
    "eagle tree auto": ["residual is p", "acceptance 0.04 high"],
}
CONTROLS = [(name, flaw) for name, flaws in CAUGHT.items() for flaw in flaws]


def describe(fit):
    statistic, df, p_value = fit
    return f"G = {statistic:.1f} on {df} degrees of freedom, p = {p_value:.2g}"


@pytest.mark.parametrize("batch_size", [1, 3], ids=["alone", "batch of 3"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampling_keeps_the_target_distribution(name, batch_size):
    fit = sampled_fit(SETTINGS[name], TOKENS, SEED, batch_size)
    assert fit[2] > SIGNIFICANCE, describe(fit)


@pytest.mark.parametrize("name, flaw", CONTROLS)
def test_a_flawed_verifier_is_caught(name, flaw, monkeypatch):
    with_flaw(monkeypatch, flaw)
    fit = sampled_fit(SETTINGS[name], TOKENS, SEED)
    assert fit[2] < SIGNIFICANCE, describe(fit)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_flawed_verifier_is_caught_in_a_batch(name, monkeypatch):
    with_flaw(monkeypatch, "residual is p")
    fit = sampled_fit(SETTINGS[name], TOKENS, SEED, batch_size=3)
    assert fit[2] < SIGNIFICANCE, describe(fit)


def test_the_controls_differ_from_the_shared_verifier_only_by_their_flaw():
    """Unflawed, the controls' rule is the shared verifier: the same verdicts, draw for draw."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        probs = torch.softmax(torch.randn(6, VOCAB, generator=gen, dtype=torch.float64), -1)
        draft_probs = torch.softmax(torch.randn(5, VOCAB, generator=gen, dtype=torch.float64), -1)
        tokens = torch.randint(VOCAB, (5,), generator=gen).tolist()
        for candidates in (Candidates(tokens, [-1, 0, -1, 2, 0], draft_probs), Candidates.chain(tokens)):
            seed = int(torch.randint(1 << 30, (), generator=gen))
            shared = verify_sampling(probs, candidates, torch.Generator().manual_seed(seed))
            reference = flawed_verifier(None)(probs, candidates, torch.Generator().manual_seed(seed))
            assert shared == reference


def test_every_flaw_is_a_control_somewhere_and_every_setting_has_one():
    assert {flaw for _, flaw in CONTROLS} == set(FLAWS) and CAUGHT.keys() == SETTINGS.keys()
    assert all(flaw in SETTINGS[name].flaws() for name, flaw in CONTROLS)
