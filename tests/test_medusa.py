"""Medusa: the heads, the tree, the proposer in the shared loop, typical acceptance, the heads file.

Greedy Medusa is token-identical to plain greedy and leaves the target's cache equal to a fresh
prefill after every round; typical acceptance, lossy by design, is caught changing the distribution
that sampling through the shared verifier keeps (test_sampling_exactness.py).
"""
import copy
import functools
import itertools

import pytest
import torch

import decode.verify
from data import TokenData
from decode.medusa import Medusa, build_tree, chain_tree, expected_length, tree_parents, verify_typical
from decode.sampling import Sampling
from decode.speculative import generate
from decode.tree import Candidates, verify_mask
from model.checkpoint import CheckpointError, load_model
from model.medusa import MedusaConfig, MedusaHeads, load_medusa, save_medusa
from model.tokenizer import Tokenizer
from tests.conftest import assert_holds_context, tiny_model
from tests.exactness import (MEDUSA_TREE, SIGNIFICANCE, T1, TARGET_TABLE, TOKENS, TRUNCATED, Setting,
                              ToyMedusaHeads, sampled_fit)
from tests.test_speculative import PROMPTS, RecordingTarget
from heads_training import HEADS_TRAINING, MedusaTraining, evaluate_heads
from train import fit

TARGET = tiny_model(seed=0)  # context 32: 60 new tokens cross the window twice
TOKENIZER = Tokenizer({"kind": "bpe", "merges": []})
TYPICAL = (0.09, 0.3)  # Medusa's defaults (epsilon, delta)


# ---- the heads -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [False, True])
def test_an_untrained_head_says_what_the_target_says(tied):
    # zero-initialized residual blocks are the identity; the projections are the target's lm_head
    heads = MedusaHeads(TARGET, MedusaConfig(n_heads=3, tied=tied))
    idx = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    logits, hidden = TARGET(idx, return_hidden=True)
    out = heads(hidden)
    assert out.shape == (3, 2, 5, TARGET.config.vocab_size)
    for head_logits in out:
        torch.testing.assert_close(head_logits, logits, rtol=0, atol=1e-12)


def test_every_head_is_a_module_of_its_own():
    heads = MedusaHeads(TARGET, MedusaConfig(n_heads=4))
    modules = list(heads.blocks) + list(heads.lm_heads)
    assert len({id(m) for m in modules}) == 8
    assert len({p.data_ptr() for p in heads.parameters()}) == len(list(heads.parameters())) == 4 * 3
    with torch.no_grad():  # changing one head's block changes that head only
        heads.blocks[1].linear.weight.normal_()
        out = heads(TARGET(torch.tensor([[1, 2, 3]]), return_hidden=True)[1])
    assert not torch.equal(out[1], out[0]) and torch.equal(out[0], out[2]) and torch.equal(out[0], out[3])
    tied = MedusaHeads(TARGET, MedusaConfig(n_heads=4, tied=True))
    assert sorted(tied.state_dict()) == [f"blocks.{i}.linear.{w}" for i in range(4) for w in ("bias", "weight")]


@pytest.mark.parametrize("tied", [False, True])
def test_the_batched_decoder_says_what_the_heads_say(tied):
    heads = informative_heads(3) if not tied else MedusaHeads(TARGET, MedusaConfig(n_heads=3, tied=True))
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.bias.normal_()
        hidden = TARGET(torch.tensor([[1, 2, 3]]), return_hidden=True)[1]  # (1, 3, C)
        torch.testing.assert_close(heads.decoder()(hidden[0, -1]), heads(hidden)[:, 0, -1])


# ---- the tree ------------------------------------------------------------------------------------

# head 0's top-3 are right with 0.5, 0.3, 0.1; head 1's top-2 with 0.5, 0.2; head 2's top-1 with 0.7.
# Path values: (0,) .5, (1,) .3, (0,0) .25, (0,0,0) .175, (1,0) .15, (1,0,0) .105, (2,) .1, (0,1) .1, ...
ACCURACIES = [[0.5, 0.3, 0.1], [0.5, 0.2], [0.7]]


def test_build_tree_is_the_hand_computed_optimum():
    assert build_tree(ACCURACIES, 1) == [(0,)]
    assert build_tree(ACCURACIES, 3) == [(0,), (1,), (0, 0)]
    assert build_tree(ACCURACIES, 5) == [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]
    assert build_tree(ACCURACIES, 6) == [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (1, 0, 0)]
    assert expected_length(ACCURACIES, build_tree(ACCURACIES, 5)) == pytest.approx(1.375)
    assert build_tree([[0.6, 0.2], [0.5, 0.1]], 3) == [(0,), (1,), (0, 0)]  # the docstring's example
    assert len(build_tree(ACCURACIES, 100)) == 3 + 3 * 2 + 3 * 2 * 1  # every path there is


def test_build_tree_beats_every_other_tree_of_its_size():
    nodes = [p for d in range(1, 4) for p in itertools.product(*(range(len(a)) for a in ACCURACIES[:d]))]
    for budget in range(1, 7):
        trees = [t for t in itertools.combinations(nodes, budget)
                 if all(len(p) == 1 or p[:-1] in t for p in t)]  # every parent present
        best = max(expected_length(ACCURACIES, t) for t in trees)
        assert expected_length(ACCURACIES, build_tree(ACCURACIES, budget)) == pytest.approx(best)


def test_tree_parents_depths_and_verify_mask():
    paths = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    parents = tree_parents(paths)
    assert parents == [-1, -1, 0, 0, 2]
    assert Candidates([0] * 5, parents).depths() == [1, 1, 2, 2, 3]
    expected = torch.tensor([  # rows and columns: root, (0,), (1,), (0,0), (0,1), (0,0,0)
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(verify_mask(parents, tail=1), expected)
    assert chain_tree(3) == [(0,), (0, 0), (0, 0, 0)]


class FixedHeads:
    """Heads that ignore the hidden state: head j always ranks its tokens as RANKINGS[j] does."""
    RANKINGS = [[7, 3, 1], [5, 9], [2]]
    n_heads = 3

    def __call__(self, hidden):  # (B, T, C) -> (K, B, T, V)
        logits = torch.zeros(self.n_heads, *hidden.shape[:2], 16, dtype=torch.float64)
        for j, ranking in enumerate(self.RANKINGS):
            for rank, token in enumerate(ranking):
                logits[j, ..., token] = 10.0 - rank
        return logits

    def decoder(self):
        return lambda hidden: self(hidden[None, None])[:, 0, 0]


def test_paths_become_the_heads_ranked_tokens():
    proposer = Medusa(FixedHeads(), [(0, 0, 0), (0,), (0, 1), (1,), (0, 0)])  # any order: it sorts them
    proposer.start([1])
    assert proposer.propose([1], 5, Sampling(), None) is None  # no verify pass yet, no hidden state
    proposer.update([1, 4], decode.verify.Verdict([], 4, 0, False), torch.zeros(1, 16), torch.zeros(1, 8))
    candidates = proposer.propose([1, 4], 5, Sampling(), None)
    assert (candidates.tokens, candidates.parents) == ([7, 3, 5, 9, 2], [-1, -1, 0, 0, 2])
    assert candidates.draft_probs is None  # deterministic guesses
    shallow = proposer.propose([1, 4], 2, Sampling(), None)  # no room for depth 3
    assert (shallow.tokens, shallow.parents) == ([7, 3, 5, 9], [-1, -1, 0, 0])
    chain = Medusa(FixedHeads(), "chain")
    chain.start([1])
    chain.update([1, 4], decode.verify.Verdict([], 4, 0, False), torch.zeros(1, 16), torch.zeros(1, 8))
    assert chain.propose([1, 4], 5, Sampling(), None).tokens == [7, 5, 2]


# ---- training, the heads file --------------------------------------------------------------------

def informative_heads(n_heads, scale=0.3, seed=0):
    """Heads on TARGET whose residual blocks are random but small: they still mostly say what the
    target says next, and this target's greedy text repeats itself often enough for that to be
    right, so candidates are accepted often but not always."""
    heads = MedusaHeads(TARGET, MedusaConfig(n_heads)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            w = block.linear.weight
            w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * scale / w.size(1) ** 0.5)
    return heads


GREEDY_ACCURACIES = [[0.6, 0.15, 0.08, 0.05, 0.03]] * 5  # a plausible measurement, to shape the trees


@torch.no_grad()
def sampled_corpus(model, n_seqs=16, seed=0):
    """Text the target itself writes (temperature 1, full windows): what its heads must learn to foresee."""
    gen = torch.Generator().manual_seed(seed)
    seqs = torch.randint(model.config.vocab_size, (n_seqs, 1), generator=gen)
    while seqs.size(1) < model.config.block_size:
        probs = torch.softmax(model(seqs)[:, -1], -1)
        seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=gen)], 1)
    tokens = seqs.flatten().tolist()
    return TokenData(tokens, len(tokens), "sampled")


def fitted(training):
    """A heads training (heads_training.py) run through train.py's loop, quietly, and finished."""
    fit(training, log=training.log)
    training.finish()
    return training


def test_training_saves_better_heads_with_their_accuracies_and_tree(tmp_path):
    target = tiny_model(seed=0)
    corpus = sampled_corpus(target)
    untrained = evaluate_heads(target, MedusaHeads(target, MedusaConfig(3)), corpus, 8, 32, 2, "cpu")[1]
    path = tmp_path / "medusa.pt"
    opt = dict(HEADS_TRAINING, max_iters=30, batch_size=8, learning_rate=3e-3, min_lr=3e-4, warmup_iters=5,
               eval_interval=30, eval_iters=2)
    accuracies = fitted(MedusaTraining(target, TOKENIZER, corpus, corpus, str(path), opt, n_heads=3, tree_size=12,
                                       log=lambda *args: None)).accuracies
    heads, state = load_medusa(path, target, TOKENIZER, dtype=torch.float64)
    assert heads.n_heads == 3 and not heads.config.tied
    assert len(accuracies) == 3 and all(len(a) == 10 and 0 <= sum(a) <= 1 for a in accuracies)
    assert state["accuracies"] == accuracies and state["tree"] == [list(p) for p in build_tree(accuracies, 12)]
    assert all(after < before for after, before in zip(state["val_losses"], untrained))
    assert not any(p.requires_grad for p in target.parameters())  # Medusa-1 freezes the target


def test_joint_training_saves_the_new_target_the_heads_belong_to(tmp_path):
    target = tiny_model(seed=0)
    before = copy.deepcopy(target)
    corpus = sampled_corpus(target)
    path = tmp_path / "medusa.pt"
    opt = dict(HEADS_TRAINING, max_iters=5, batch_size=4, min_lr=3e-4, warmup_iters=1, eval_interval=5, eval_iters=1)
    fitted(MedusaTraining(target, TOKENIZER, corpus, corpus, str(path), opt, n_heads=2, joint=True, log=lambda *args: None))
    new_target = load_model(tmp_path / "medusa-target.pt", dtype=torch.float64)[0]
    assert torch.equal(new_target.lm_head.weight.float(), target.lm_head.weight.float())  # load_model keeps float32
    assert not torch.equal(target.lm_head.weight, before.lm_head.weight)  # the backbone learned too
    load_medusa(path, new_target, TOKENIZER)
    with pytest.raises(CheckpointError, match="Medusa-2 heads.*medusa-target.pt"):  # the message says where the target is
        load_medusa(path, before, TOKENIZER)


def test_heads_refuse_another_target(tmp_path):
    path = tmp_path / "medusa.pt"
    save_medusa(path, informative_heads(2), TARGET, TOKENIZER, accuracies=GREEDY_ACCURACIES[:2])
    heads, state = load_medusa(path, TARGET, TOKENIZER, dtype=torch.float64)
    assert torch.equal(heads.blocks[1].linear.weight, informative_heads(2).blocks[1].linear.weight)
    assert state["accuracies"] == GREEDY_ACCURACIES[:2]
    saved = informative_heads(2).state_dict()
    for dtype in (torch.float32, torch.bfloat16):  # the same weights in lower precision: still the heads' target
        loaded = load_medusa(path, copy.deepcopy(TARGET).to(dtype), TOKENIZER, dtype=dtype)[0].state_dict()
        assert loaded.keys() == saved.keys() and all(
            w.dtype == dtype and torch.equal(w, saved[name].to(dtype)) for name, w in loaded.items())
    with pytest.raises(CheckpointError, match="trained for another target model") as refused:
        load_medusa(path, tiny_model(seed=1), TOKENIZER)
    assert refused.value.retrain == "medusa"  # the command's advice: retrain the heads
    with pytest.raises(CheckpointError, match="another target"):  # same weights, another tokenizer
        load_medusa(path, TARGET, Tokenizer({"kind": "bpe", "merges": [[32, 116]]}))
    with pytest.raises(CheckpointError, match="no medusa checkpoint") as missing:
        load_medusa(tmp_path / "missing.pt", TARGET, TOKENIZER)
    assert missing.value.retrain == "medusa"
    save_medusa(tmp_path / "tied.pt", MedusaHeads(TARGET, MedusaConfig(2, tied=True)), TARGET, TOKENIZER)
    tied = load_medusa(tmp_path / "tied.pt", TARGET, TOKENIZER, dtype=torch.float64)[0]
    assert tied.config.tied and tied.shared_head[0] is TARGET.lm_head


# ---- greedy: token-identical to plain, caches exact ----------------------------------------------

TREES = {"chain": "chain", "tree 4": build_tree(GREEDY_ACCURACIES, 4),
         "tree 10": build_tree(GREEDY_ACCURACIES, 10), "tree 25": build_tree(GREEDY_ACCURACIES, 25)}
HEADS = informative_heads(5)


@functools.cache
def plain_greedy(prompt):
    return generate(TARGET, list(prompt), 60, Sampling())[0]


@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_medusa_is_token_identical_to_plain(tree):
    accepted = judged = 0
    for prompt in PROMPTS:
        spec, stats = generate(TARGET, prompt, 60, Sampling(), proposer=Medusa(HEADS, TREES[tree]))
        assert spec == plain_greedy(tuple(prompt))
        assert 0 < stats.draft_forwards < stats.target_forwards  # the heads run once a round, after the first
        accepted, judged = accepted + stats.accepted, judged + stats.judged
    assert 0.2 < accepted / judged < 0.9  # the test must exercise both accepted and rejected candidates


class CheckedMedusa(Medusa):
    """After every round, the target's cache must equal a fresh prefill of the tokens it holds."""

    def update(self, tokens, verdict, logits, hidden):
        super().update(tokens, verdict, logits, hidden)
        cache = self.recorder.cache  # holds every accepted token but the newest
        assert_holds_context(self.recorder.model, cache, tokens)
        self.rounds += 1
        self.deepest = max(self.deepest, len(verdict.path))


@pytest.mark.parametrize("tree", ["chain", "tree 25"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)])
def test_target_cache_equals_a_fresh_prefill_after_every_round(tree, sampling):
    recorder = RecordingTarget(TARGET)
    proposer = CheckedMedusa(HEADS, TREES[tree])  # the chain is 5 deep
    proposer.recorder, proposer.rounds, proposer.deepest = recorder, 0, 0
    generate(recorder, [3, 1, 4], 70, sampling, torch.Generator().manual_seed(0), proposer=proposer)
    assert proposer.rounds > 10 and proposer.deepest >= (3 if sampling.greedy else 1)


def test_typical_acceptance_at_temperature_0_is_greedy():
    for prompt in PROMPTS:
        spec, stats = generate(TARGET, prompt, 60, Sampling(), proposer=Medusa(HEADS, TREES["tree 10"], typical=TYPICAL))
        assert spec == plain_greedy(tuple(prompt)) and stats.accepted > 0


# ---- sampling: exact with the shared verifier (test_sampling_exactness.py), not with typical acceptance

@pytest.mark.parametrize("tree, sampling", [("chain", T1), (MEDUSA_TREE, TRUNCATED)], ids=["chain", "tree, top-k top-p"])
def test_typical_acceptance_changes_the_distribution(tree, sampling):
    typical = Setting(lambda: Medusa(ToyMedusaHeads(TARGET_TABLE, 3), tree, typical=TYPICAL), sampling, sampled=False)
    assert sampled_fit(typical, TOKENS, seed=0)[2] < SIGNIFICANCE


def test_typical_rule_at_one_node():
    # root p = (0.5, 0.3, 0.12, 0.08): H = 1.164 nats, threshold min(0.09, 0.3 e^-1.164 = 0.094) = 0.09;
    # elsewhere p uniform: threshold min(0.09, 0.3 / 4) = 0.075
    probs = torch.tensor([[0.5, 0.3, 0.12, 0.08]] + [[0.25] * 4] * 3, dtype=torch.float64)
    for token, accepted in ((0, True), (2, True), (3, False)):
        verdict = verify_typical(probs, Candidates([token], [-1]))
        assert (verdict.path == [1]) == accepted and verdict.judged == 1 and verdict.corrected == (not accepted)
    verdict = verify_typical(probs, Candidates([3, 1, 2], [-1, -1, 1]))  # 3 fails, 1 passes, then 2 (p 0.25)
    assert verdict.path == [2, 3] and verdict.judged == 3 and not verdict.corrected
