"""The batch engine (decode/batch.py) against the one-sequence loop (decode/speculative.py): every row
of a batch says exactly what its prompt says alone, for plain decoding and every method, deciding as
it would alone, with each row's cache a fresh prefill of its own tokens after every round."""
import time

import pytest
import torch

from decode.draft import DraftModel
from decode.methods import make_proposer
from decode.sampling import Sampling
from decode.batch import generate_batch
from decode.speculative import generate
from model.eagle import EagleHead
from tests.conftest import assert_holds_context, assert_matches_prefill, cache_row, tiny_model
from tests.test_eagle import checking_the_head
from tests.test_medusa import informative_heads
from tests.test_speculative import RecordingTarget

TARGET = tiny_model(block_size=32)
DRAFT = tiny_model(seed=5, n_layer=1, block_size=32)
# of different lengths, one of them nearly a window: every row slides inside the batch, at its own time
PROMPTS = [[5], [1, 2, 3, 1, 2, 3, 1, 2], list(range(10, 40)), [7, 7, 7]]


def perturbed(module, seed):
    """Random weights that guess, some right, some wrong."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return module


HEADS = (informative_heads(3).double(),
         {"tree": [(0,), (1,), (0, 0), (0, 0, 0)], "accuracies": [[0.6, 0.2], [0.5, 0.1], [0.4, 0.1]]})
EAGLE = (perturbed(EagleHead(TARGET), 2).double(), {})

METHODS = {
    "none": lambda: make_proposer("none", None, TARGET),
    "draft k=3": lambda: make_proposer("draft", "3", TARGET, draft_model=DRAFT),
    "jacobi": lambda: make_proposer("jacobi", "4", TARGET),
    "lookahead": lambda: make_proposer("lookahead", "3,3,2", TARGET, sizing="fixed"),
    "prompt lookup": lambda: make_proposer("prompt-lookup", None, TARGET),
    "medusa": lambda: make_proposer("medusa", "saved", TARGET, heads=HEADS),
    "eagle chain": lambda: make_proposer("eagle", "chain:3", TARGET, eagle_head=EAGLE),
    "eagle tree": lambda: make_proposer("eagle", "tree:6", TARGET, eagle_head=EAGLE),
}


class CheckedRows(RecordingTarget):
    """The target, checking after every round that each batch row's cache equals a fresh prefill of
    the tokens its row holds. The loop updates the rows' proposers in the order of the cache's rows,
    so the n-th update after a pass belongs to cache row n."""

    def forward(self, *args, **kwargs):
        self.updated = 0
        return self.model(*args, **kwargs)

    def check(self, proposer):
        update = proposer.update

        def update_and_check(tokens, verdict, logits, hidden):
            update(tokens, verdict, logits, hidden)
            row = cache_row(self.cache, self.updated)  # holds every accepted token but the newest
            assert_holds_context(self.model, row, tokens)
            self.updated += 1
            self.rounds += 1

        proposer.update = update_and_check
        return proposer


class EveryOtherRound:
    """A fallback that holds the batch plain every other round: the methods must pick up where they
    left off, as they do when the measured fallback turns them off and on."""
    rounds = 0

    def speculate(self):
        self.rounds += 1
        return self.rounds % 2 == 0

    def record(self, speculated, gained, seconds, left_apart):
        pass


@pytest.mark.parametrize("held", [False, True], ids=["speculating", "held every other round"])
@pytest.mark.parametrize("method", list(METHODS))
def test_every_row_says_what_its_prompt_says_alone(method, held):
    target = CheckedRows(TARGET)
    target.rounds = 0
    proposers = [target.check(METHODS[method]()) for _ in PROMPTS]
    if method.startswith("eagle"):  # and the head's cache of each row, whenever it catches up
        proposers = [checking_the_head(proposer, TARGET) for proposer in proposers]
    outputs, stats = generate_batch(target, PROMPTS, 50, Sampling(), proposers=proposers,
                                    fallback=EveryOtherRound() if held else None)
    for prompt, output, row_stats in zip(PROMPTS, outputs, stats):
        alone, alone_stats = generate(TARGET, prompt, 50, Sampling(), proposer=METHODS[method]())
        assert output == alone == generate(TARGET, prompt, 50, Sampling())[0]
        if not held:  # the same guesses, accepted alike, in as many rounds
            assert ((row_stats.judged, row_stats.accepted, row_stats.target_forwards)
                    == (alone_stats.judged, alone_stats.accepted, alone_stats.target_forwards))
        assert row_stats.new_tokens == 50
        assert (row_stats.held_rounds > 0) == held
        assert (row_stats.judged > 0) == (method != "none")  # every row speculated
    assert (sum(row_stats.accepted for row_stats in stats) > 0) == (method != "none")  # and the target took some
    assert target.rounds >= 4 * 50 / 3  # every row checked after every round it took part in
    if method.startswith("eagle"):
        assert all(proposer.head_checks > 5 for proposer in proposers)


class FurthestBehind(EveryOtherRound):
    """EveryOtherRound, checking that each round it hears of gained what the batch's row furthest
    behind gained: the rows' tokens are followed through on_round."""

    def __init__(self, prompts):
        self.written, self.before, self.heard = [0] * len(prompts), 0, 0

    def speculate(self):
        self.before = min(self.written)
        return super().speculate()

    def on_round(self, b, outcome):
        self.written[b] += len(outcome.new)

    def record(self, speculated, gained, seconds, left_apart):
        still_writing = [n for n in self.written if n < 50]
        assert gained == min(still_writing or self.written) - self.before
        self.heard += 1


def test_a_batch_round_gains_what_its_row_furthest_behind_gains():
    fallback = FurthestBehind(PROMPTS)
    generate_batch(TARGET, PROMPTS, 50, Sampling(), proposers=[METHODS["draft k=3"]() for _ in PROMPTS],
                   fallback=fallback, on_round=fallback.on_round)
    assert fallback.heard > 10


class CountedDraft(RecordingTarget):
    """The draft, counting its forwards."""
    calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)


class CheckedDraftRow(DraftModel):
    """After every round, this row of the draft's batched cache equals a fresh prefill of the
    tokens the row says it holds."""
    checked = 0

    def update(self, tokens, verdict, logits, hidden):
        super().update(tokens, verdict, logits, hidden)
        if self.batch is not None:
            row = cache_row(self.batch.cache, self.batch.row(self))
            assert_matches_prefill(DRAFT, row, tokens[self.context.start:self.context.cached])
            self.checked += 1


@pytest.mark.parametrize("held", [False, True], ids=["speculating", "held every other round"])
def test_the_draft_steps_all_its_rows_in_one_forward_each_row_guessing_as_it_would_alone(held):
    """Rows of k = 1..4 (steps where some rows have stopped guessing), prompts of different lengths
    (padded catch-ups), rows sliding and leaving at their own times."""
    draft = CountedDraft(DRAFT)
    proposers = [CheckedDraftRow(draft, k) for k in (1, 2, 3, 4)]
    outputs, stats = generate_batch(TARGET, PROMPTS, 50, Sampling(), proposers=proposers,
                                    fallback=EveryOtherRound() if held else None)
    for prompt, k, output, row_stats, proposer in zip(PROMPTS, (1, 2, 3, 4), outputs, stats, proposers):
        (alone,), (alone_stats,) = generate_batch(TARGET, [prompt], 50, Sampling(), proposers=[DraftModel(DRAFT, k)],
                                                  fallback=EveryOtherRound() if held else None)
        assert output == alone
        # the same guesses, accepted alike, in as many rounds
        assert (row_stats.accepted, row_stats.target_forwards) == (alone_stats.accepted, alone_stats.target_forwards)
        assert proposer.checked > 10
    assert draft.calls < sum(row_stats.draft_forwards for row_stats in stats) / 2


def test_rows_of_different_methods_leave_the_batch_when_done_and_stream_their_own_tokens():
    seen = {b: [] for b in range(3)}
    proposers = [METHODS["none"](), METHODS["prompt lookup"](), METHODS["draft k=3"]()]
    outputs, stats = generate_batch(TARGET, PROMPTS[:3], 20, Sampling(), on_token=lambda b, t, source: seen[b].append(t),
                                    proposers=proposers)
    assert [seen[b] for b in range(3)] == outputs == [generate(TARGET, p, 20, Sampling())[0] for p in PROMPTS[:3]]
    assert stats[0].target_forwards == 20 > stats[1].target_forwards  # the lookup row was done sooner


def test_a_rows_seconds_leave_out_the_time_its_tokens_take_to_stream():
    """What the caller does with a streamed token (print it) is not decoding: generate.py --compare
    streams only the speculative run, and would otherwise charge it for the terminal."""
    def slow_printer(b, token, source):
        time.sleep(0.05)
    quiet = [generate_batch(TARGET, PROMPTS[:1], 10, Sampling())[1][0] for _ in range(2)][-1]  # warmed up
    _, (streamed,) = generate_batch(TARGET, PROMPTS[:1], 10, Sampling(), on_token=slow_printer)
    assert streamed.seconds < quiet.seconds + 0.25  # 0.5 s of printing left out


def test_a_batch_needs_a_proposer_per_prompt():
    with pytest.raises(ValueError, match="one proposer per prompt"):
        generate_batch(TARGET, PROMPTS, 5, Sampling(), proposers=[METHODS["none"]()])
