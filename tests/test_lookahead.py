"""Jacobi, lookahead and prompt-lookup decoding: exact, and their masks as the paper draws them."""
import pytest
import torch

from decode import Jacobi, Lookahead, PromptLookup, generate
from decode.lookahead import lookahead_mask
from decode.sampling import Sampling
from decode.sizing import Costs, ReachTally
from decode.tree import Candidates, SideBranch, pass_mask
from tests.conftest import assert_holds_context
from tests.exactness import ToyBigram
from tests.test_speculative import PROMPTS, TARGET, RecordingTarget

FREE = [1.0] * 64  # r(n) = 1: extra pass tokens cost nothing
CHEAP = [1 + 0.05 * n for n in range(64)]  # r(n) = 1 + 0.05 (n-1): some pay, some do not
COSTLY = [float(n) for n in range(1, 65)]  # r(n) = n: a pass of n tokens costs n plain steps

METHODS = {
    "jacobi W=3": lambda model: Jacobi(3),
    "jacobi W=6": lambda model: Jacobi(6),
    "lookahead 2,2,2": lambda model: Lookahead(2, 2, 2),
    "lookahead 4,3,3": lambda model: Lookahead(4, 3, 3),
    "lookahead 5,4,5 pool-from-prompt": lambda model: Lookahead(5, 4, 5, pool_from_prompt=True),
    "lookahead sized 4,3,3 cheap": lambda model: Lookahead(4, 3, 3, costs=Costs(CHEAP)),
    "lookahead sized 4,3,3 costly": lambda model: Lookahead(4, 3, 3, costs=Costs(COSTLY)),
    "prompt-lookup": lambda model: PromptLookup(),
    "prompt-lookup 2,3,1": lambda model: PromptLookup(2, 3, 1),
}


def checked(proposer, recorder):
    """Wrap a proposer so that after every round the target's cache is checked against a fresh prefill."""
    update = proposer.update

    def update_and_check(tokens, verdict, logits, hidden):
        update(tokens, verdict, logits, hidden)
        cache = recorder.cache  # holds every accepted token but the newest
        assert_holds_context(recorder.model, cache, tokens)
        proposer.rounds += 1

    proposer.update, proposer.rounds = update_and_check, 0
    return proposer


@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_is_token_identical_to_plain_and_the_cache_stays_exact(name):
    recorder = RecordingTarget(TARGET)
    proposer = checked(METHODS[name](TARGET), recorder)
    judged = accepted = 0
    for prompt in PROMPTS:
        plain, _ = generate(TARGET, prompt, 60, Sampling())
        spec, stats = generate(recorder, prompt, 60, Sampling(), proposer=proposer)
        assert spec == plain  # nothing of the window or the pool leaks into the output
        judged, accepted = judged + stats.judged, accepted + stats.accepted
    assert proposer.rounds > 40
    if name != "lookahead sized 4,3,3 costly":  # which proposes only in its rare probes
        assert judged > 40 and accepted > 0  # it speculated, and the target took some of it


@pytest.mark.parametrize("name", ["jacobi W=3", "lookahead 4,3,3", "lookahead sized 4,3,3 cheap", "prompt-lookup"])
def test_the_cache_stays_exact_when_sampling(name):
    recorder = RecordingTarget(TARGET)
    proposer = checked(METHODS[name](TARGET), recorder)
    judged = 0
    for seed, prompt in enumerate(PROMPTS):
        _, stats = generate(recorder, prompt, 60, Sampling(temperature=1.0), torch.Generator().manual_seed(seed),
                            proposer=proposer)
        judged += stats.judged
    assert proposer.rounds > 40 and judged > 20


class ForgetfulJacobi(Jacobi):
    """The control: Jacobi that drops the target's predictions, guessing at random every round."""

    def update(self, tokens, verdict, logits, hidden):
        super().update(tokens, verdict, logits, hidden)
        self.guesses = []


def rounds(proposer, new_tokens, vocab=16):
    """(guesses accepted, whether the target corrected one) per round, decoding greedily from a
    prompt of tokens 4..15 with a target that always says 3."""
    table = torch.zeros(vocab, vocab)
    table[:, 3] = 1.0
    sources = []
    generate(ToyBigram(table, block_size=64), list(range(4, vocab)), new_tokens, Sampling(), proposer=proposer,
             on_token=lambda token, source: sources.append(source))
    ends = [i for i, source in enumerate(sources) if source != "draft"]
    return [(end - start, sources[end] == "corrected") for start, end in zip([0] + [e + 1 for e in ends], ends)]


def test_jacobi_refines_its_guesses_to_the_fixed_point():
    """On a target that always says 3, the fixed point of a Jacobi block is all 3s, and one
    iteration reaches it from any guesses: after a round the target corrects, the predictions it
    made past the correction are the next round's first guesses, all of them right. (Past a fully
    accepted block the target predicted nothing: the block is refilled with guesses at random.)"""
    window, new_tokens = 5, 40

    def refined(proposer):
        history, written = rounds(proposer, new_tokens), 0
        for (accepted, corrected), (next_accepted, _) in zip(history, history[1:]):
            written += accepted + 1
            if corrected and next_accepted < min(window - 1 - accepted, new_tokens - written - 1):
                return False
        return True

    assert refined(Jacobi(window))
    assert not refined(ForgetfulJacobi(window))  # the control: guessing at random every round


def pass_sizes(proposer, prompt, new_tokens=60):
    """The size of every pass (root, candidates, window) of one greedy generation."""
    _, stats = generate(TARGET, prompt, new_tokens, Sampling(), proposer=proposer)
    return stats.pass_sizes


def test_sizing_keeps_what_pays_and_drops_what_does_not():
    prompt = [1, 2, 3, 4, 5, 6, 7]
    # free tokens: everything that may earn anything rides along, which is the paper's fixed sizes
    assert pass_sizes(Lookahead(4, 3, 3, costs=Costs(FREE)), prompt) == pass_sizes(Lookahead(4, 3, 3), prompt)
    costly = pass_sizes(Lookahead(4, 3, 3, costs=Costs(COSTLY)), prompt)
    # a pass of n tokens costing n steps never pays: plain steps but for ever rarer probes
    probes = sum(c for n, c in costly.items() if n > 1)
    assert 2 <= probes <= 5 and costly[1] >= 40


def test_reach_tally_starts_from_its_prior_and_follows_the_counts():
    tally = ReachTally(3, prior=0.5, weight=2)
    assert tally.expected(2) == pytest.approx(0.5 + 0.25)
    for _ in range(98):
        tally.record(offered=3, accepted=1)  # always the first candidate, never the second
    assert tally.reach(1) == pytest.approx(99 / 100) and tally.reach(2) == pytest.approx(0.5 / 100)
    tally.record(offered=1, accepted=1)  # a depth not offered is not counted
    assert tally.tries == [0, 99, 98, 98]


def test_lookahead_mask_matches_the_paper():
    # W = 3, N = 3 (two levels): level 0 causal along the window; level 1 sees level 0 up to its
    # column and itself (its column has no other level above level 0)
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(lookahead_mask(3, 2), expected)
    # three levels: level 2 also sees level 1 of its own column
    assert lookahead_mask(2, 3)[2 * 2 + 1].tolist() == [True, True, False, True, False, True]


def test_the_whole_pass_mask_keeps_the_branches_apart():
    # root, a verification branch of two 2-grams sharing nothing, a lookahead window W=2 N=2
    candidates = Candidates.from_sequences([[7, 8], [9, 10]])
    candidates.side = SideBranch([1, 2], [1, 2], lookahead_mask(2, 1))
    expected = torch.tensor([
        # root 7  8  9  10 w0 w1
        [1, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0],  # 7
        [1, 1, 1, 0, 0, 0, 0],  # 8 (after 7)
        [1, 0, 0, 1, 0, 0, 0],  # 9
        [1, 0, 0, 1, 1, 0, 0],  # 10 (after 9)
        [1, 0, 0, 0, 0, 1, 0],  # window column 0
        [1, 0, 0, 0, 0, 1, 1],  # window column 1
    ], dtype=torch.bool)
    assert torch.equal(pass_mask(candidates, tail=1), expected)
    assert candidates.depths() == [1, 2, 1, 2]


def test_prompt_lookup_proposes_the_continuations_of_the_latest_matches():
    tokens = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 0, 2, 3]
    candidates = PromptLookup(max_match=3, num_proposed=2, num_matches=2).propose(tokens, 8, Sampling(), None)
    # the longest suffix with an earlier occurrence is [2, 3] (twice, not [0, 2, 3]): most recent first
    assert candidates.tokens == [5, 6, 4, 9] and candidates.parents == [-1, 0, -1, 2]
    assert PromptLookup().propose([1, 2, 3], 8, Sampling(), None) is None
