"""Speculation never changes what the model says.

Greedy: token-identical to plain greedy (float64 tiny models), with caches equal to fresh prefills
after every round. Sampling keeps the target's distribution: tests/test_sampling_exactness.py.
"""
import pytest
import torch

from decode import DraftModel, Proposer, generate
from decode.draft import AUTO_K_MAX
from decode.sampling import Sampling
from decode.tree import Candidates
from model.compiled import StaticGPT
from tests.conftest import assert_holds_context, assert_matches_prefill, tiny_model
from tests.exactness import ToyBigram


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
    assert judged > 60  # it speculated: an unrelated draft's guesses are judged too, and rejected
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
        assert_holds_context(eager(self.recorder.model), target, tokens)
        assert_matches_prefill(eager(self.draft), self.batch.cache, tokens[self.context.start:self.context.cached])
        self.rounds += 1


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)])
def test_caches_equal_fresh_prefills_after_every_round(sampling, path):
    """Also on the static-shape path (model/compiled.py, run uncompiled), whose passes read the whole cache."""
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
        assert_holds_context(self.recorder.model, cache, tokens)
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


# ---- acceptance as the formula predicts it -------------------------------------------------------

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
