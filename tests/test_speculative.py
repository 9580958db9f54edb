"""Speculation never changes what the model says.

Greedy: token-identical to plain greedy (float64 tiny models). Sampling: the same distribution as
sampling the target directly, checked on toy bigram models whose joint distribution over 256
outcomes is known exactly, with a deliberately wrong verifier as the control the test must catch.
"""
import collections

import numpy as np

import pytest
import torch

import decode.verify
from decode import DraftModel, Proposer, generate
from decode.draft import AUTO_K_MAX
from decode.sampling import Sampling, token_probs
from decode.tree import Candidates
from model.compiled import StaticGPT
from tests.conftest import assert_matches_prefill, tiny_model
from tests.toys import ToyBigram, chi_square, chi_square_critical, exact_joint, random_table, total_variation


def perturbed_copy(model, scale, seed):
    """A draft that mostly agrees with the target: its weights plus noise."""
    draft = tiny_model(seed=0)
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale * p.std())
    return draft


TARGET = tiny_model(seed=0)  # context 32: 60 new tokens cross the window twice
DRAFTS = {"close": perturbed_copy(TARGET, 0.15, seed=1), "medium": perturbed_copy(TARGET, 0.3, seed=2),
          "unrelated": tiny_model(seed=7, n_layer=1)}
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(10, 30)), [63] * 31]
# (r, c, seconds) for auto k: cheap passes and a cheap draft whose timed steps cost nothing against
# an infinite bare time, so that its sizing never depends on this machine's speed
CHEAP = ([1.0 + 0.1 * n for n in range(9)], 0.1, float("inf"))


@pytest.mark.parametrize("draft", list(DRAFTS))
@pytest.mark.parametrize("k", ["1", "2", "3", "4", "5", "6", "7", "8", "auto", "heuristic"])
def test_greedy_draft_is_token_identical_to_plain(draft, k):
    schedule = k if k in ("auto", "heuristic") else "fixed"
    proposer = DraftModel(DRAFTS[draft], 4 if schedule != "fixed" else int(k), schedule, costs=CHEAP)
    accepted = judged = 0
    for prompt in PROMPTS:
        plain, _ = generate(TARGET, prompt, 60, Sampling())
        spec, stats = generate(TARGET, prompt, 60, Sampling(), proposer=proposer)
        assert spec == plain
        assert stats.new_tokens == 60 and stats.target_forwards < 60 + (draft == "unrelated")
        accepted, judged = accepted + stats.accepted, judged + stats.judged
    if draft != "unrelated":  # the test must exercise accepted runs, not only rejections
        assert accepted / judged > 0.5


def test_auto_k_turns_the_draft_off_where_no_k_pays():
    """With passes as dear as their tokens, no guess can pay: auto decodes plainly, running the draft
    only to probe after PROBE_ROUNDS rounds, then after twice as many."""
    proposer = DraftModel(DRAFTS["close"], 4, "auto", costs=([float(n) for n in range(1, 10)], 0.1, float("inf")))
    spec, stats = generate(TARGET, [5], 60, Sampling(), proposer=proposer)
    assert spec == generate(TARGET, [5], 60, Sampling())[0]
    probes = 2  # after 16 plain rounds, then 32
    assert 0 < stats.judged <= probes * AUTO_K_MAX and stats.draft_forwards <= probes * AUTO_K_MAX


class RecordingTarget(torch.nn.Module):
    """The target, remembering the cache the decoding loop asked it for."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def new_cache(self, **kwargs):
        self.cache = self.model.new_cache(**kwargs)
        return self.cache

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def eager(model):
    """The eager reference of a model that may run on the static path."""
    return model.model if isinstance(model, StaticGPT) else model


class CheckedDraft(DraftModel):
    """After every round, both caches must equal fresh prefills of the tokens they claim to hold."""

    def update(self, tokens, verdict, logits, hidden):
        super().update(tokens, verdict, logits, hidden)
        target = self.recorder.cache  # holds every accepted token but the newest
        assert_matches_prefill(eager(self.recorder.model), target, tokens[len(tokens) - 1 - target.length:-1])
        assert_matches_prefill(eager(self.draft), self.batch.cache, tokens[self.context.start:self.context.cached])
        self.rounds += 1


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)])
def test_caches_equal_fresh_prefills_after_every_round(sampling, path):
    """Also on the static-shape path (model/compiled.py, run uncompiled), whose passes are padded."""
    static = StaticGPT if path == "static" else (lambda model: model)
    recorder = RecordingTarget(static(TARGET))
    proposer = CheckedDraft(static(DRAFTS["medium"]), k=5)
    proposer.recorder, proposer.rounds = recorder, 0
    generate(recorder, [3, 1, 4], 70, sampling, torch.Generator().manual_seed(0), proposer=proposer)
    assert proposer.rounds > 10


def test_on_token_tells_where_each_token_came_from():
    seen = set()
    for prompt in PROMPTS:
        sources = []
        new, _ = generate(TARGET, prompt, 60, Sampling(), proposer=DraftModel(DRAFTS["medium"], 4),
                          on_token=lambda token, source: sources.append(source))
        assert len(sources) == 60
        seen |= set(sources)
    assert seen == {"draft", "corrected", "bonus", "target"}  # target: no room left before a slide


class TopTwoTree(Proposer):
    """A test proposer of real trees: the draft's two likeliest next tokens, each followed by the
    draft's greedy continuation (recomputed without a cache). After every round it checks the
    target's cache against a fresh prefill, like CheckedDraft."""
    max_candidates = 6

    def __init__(self, draft, recorder):
        self.draft, self.recorder = draft, recorder

    def start(self, prompt):
        self.rounds = 0

    def next_logits(self, seq):
        return self.draft(torch.tensor([seq[-self.draft.config.block_size:]]))[0, -1]

    def propose(self, tokens, max_depth, sampling, generator):
        candidates, parents = [], []
        for first in self.next_logits(tokens).topk(2).indices.tolist():
            candidates.append(first)
            parents.append(-1)
            seq = tokens + [first]
            for _ in range(min(2, max_depth - 1)):
                seq.append(int(self.next_logits(seq).argmax()))
                candidates.append(seq[-1])
                parents.append(len(candidates) - 2)
        return Candidates(candidates, parents)

    def update(self, tokens, verdict, logits, hidden):
        cache = self.recorder.cache
        assert_matches_prefill(self.recorder.model, cache, tokens[len(tokens) - 1 - cache.length:-1])
        self.rounds += 1


@pytest.mark.parametrize("draft", ["close", "medium"])
def test_greedy_tree_speculation_is_token_identical_to_plain(draft):
    recorder = RecordingTarget(TARGET)
    proposer = TopTwoTree(DRAFTS[draft], recorder)
    for prompt in PROMPTS:
        plain, _ = generate(TARGET, prompt, 60, Sampling())
        spec, stats = generate(recorder, prompt, 60, Sampling(), proposer=proposer)
        assert spec == plain and stats.accepted > 0
    assert proposer.rounds > 20


# ---- sampling: exact distribution on toy bigram models -------------------------------------------

VOCAB, LENGTH, FIRST = 4, 4, 0
N = 6000  # continuations drawn per statistical test
TARGET_TABLE, DRAFT_TABLE = random_table(VOCAB, seed=11), random_table(VOCAB, seed=12)


class ToyTree(Proposer):
    """Proposes a tree mixing stochastic candidates (i.i.d. draws from the draft, with their q) and
    deterministic ones (q one-hot): at the root two draws and the fixed guess 3; under the first
    draw, one draw and the fixed guess 0."""
    max_candidates = 5

    def __init__(self, table):
        self.table = table

    def start(self, prompt):
        pass

    def propose(self, tokens, max_depth, sampling, generator):
        q_root = token_probs(self.table[tokens[-1]], sampling)
        a, b = torch.multinomial(q_root, 2, replacement=True, generator=generator).tolist()
        if max_depth == 1:
            return Candidates([a, b, 3], [-1, -1, -1], torch.stack([q_root, q_root, one_hot(3)]))
        q_a = token_probs(self.table[a], sampling)
        c = int(torch.multinomial(q_a, 1, generator=generator))
        return Candidates([a, b, 3, c, 0], [-1, -1, -1, 0, 0],
                          torch.stack([q_root, q_root, one_hot(3), q_a, one_hot(0)]))

    def update(self, tokens, verdict, logits, hidden):
        pass


def one_hot(token):
    return torch.nn.functional.one_hot(torch.tensor(token), VOCAB).double()


def sample_counts(make_proposer, sampling, n, seed=0, prompt=(FIRST,)):
    """Counts of the LENGTH-token continuations of `prompt` (which must end in FIRST)."""
    target = ToyBigram(TARGET_TABLE)
    gen = torch.Generator().manual_seed(seed)
    counts = collections.Counter()
    for _ in range(n):
        new, _ = generate(target, list(prompt), LENGTH, sampling, gen, proposer=make_proposer())
        counts[tuple(new)] += 1
    return counts


def direct_tv_quantile(joint, n, quantile=0.999, repeats=2000):
    """The `quantile` of the total-variation distance of n direct draws from the joint: how far
    exact sampling can land by chance."""
    probs = np.array(list(joint.values()))
    counts = np.random.default_rng(123).multinomial(n, probs / probs.sum(), size=repeats)  # (repeats, outcomes)
    return float(np.quantile(0.5 * np.abs(counts / n - probs).sum(axis=1), quantile))


def sampled_fit(make_proposer, sampling, n=N, prompt=(FIRST,), seed=0):
    """How n decoded continuations fit the exact joint: (chi-square statistic, its 0.999 critical
    value, total-variation distance, the 0.999 quantile of that distance under exact sampling)."""
    joint = exact_joint(TARGET_TABLE, sampling, FIRST, LENGTH)
    counts = sample_counts(make_proposer, sampling, n, seed, prompt)
    stat, df = chi_square(counts, joint, n)
    return stat, chi_square_critical(df), total_variation(counts, joint, n), direct_tv_quantile(joint, n)


SETTINGS = {
    "chain, temperature 1": (lambda: DraftModel(ToyBigram(DRAFT_TABLE), k=3), Sampling(temperature=1.0)),
    "chain, top-k top-p": (lambda: DraftModel(ToyBigram(DRAFT_TABLE), k=2),
                           Sampling(temperature=0.7, top_k=3, top_p=0.9)),
    "tree, mixed candidates": (lambda: ToyTree(DRAFT_TABLE), Sampling(temperature=1.2)),
}


def assert_samples_exactly(make_proposer, sampling, n=N, seed=0):
    """n decoded continuations fit the exact joint: chi-square and total variation both pass."""
    stat, critical, tv, tv_limit = sampled_fit(make_proposer, sampling, n, seed=seed)
    assert stat < critical and tv < tv_limit, f"chi-square {stat:.0f} (< {critical:.0f}), TV {tv:.3f} (< {tv_limit:.3f})"


def assert_wrong_verifier_is_caught(make_proposer, sampling, monkeypatch, n=N):
    """The control: the classic mistake, after a rejection resampling from p instead of the
    residual max(0, p - q), must fail the same test by far."""
    monkeypatch.setattr(decode.verify, "residual", lambda p, q: p)
    stat, critical, tv, tv_limit = sampled_fit(make_proposer, sampling, n)
    assert stat > 3 * critical and tv > 2 * tv_limit


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampling_preserves_the_target_distribution(name):
    make_proposer, sampling = SETTINGS[name]
    assert_samples_exactly(make_proposer, sampling)
    # the distance to the exact joint shrinks like that of direct sampling: at N/4 draws too
    _, _, tv, tv_limit = sampled_fit(make_proposer, sampling, N // 4, seed=1)
    assert tv < tv_limit


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_wrong_verifier_is_caught(name, monkeypatch):
    assert_wrong_verifier_is_caught(*SETTINGS[name], monkeypatch)


@pytest.mark.parametrize("k", [1, 4])
def test_tau_matches_the_formula_for_constant_acceptance(k):
    # target p = (0.7, 0.3) everywhere, draft always proposes token 0: each guess survives with 0.7
    alpha = 0.7
    target = ToyBigram(torch.log(torch.tensor([[alpha, 1 - alpha]] * 2)), block_size=4096)
    draft = ToyBigram(torch.tensor([[0.0, -float("inf")]] * 2), block_size=4096)
    _, stats = generate(target, [0], 3000, Sampling(temperature=1.0), torch.Generator().manual_seed(0),
                        proposer=DraftModel(draft, k))
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert stats.tau == pytest.approx(expected, rel=0.04)
    assert stats.alpha == pytest.approx(alpha, abs=0.03)
