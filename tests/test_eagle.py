"""EAGLE: the head, its training and file, the proposer (chain and dynamic tree) in the shared loop.

Greedy EAGLE is token-identical to plain greedy across the context slide, with the target's cache
and the head's own both equal to fresh prefills after every round. Sampling through it keeps the
target's distribution: test_sampling_exactness.py.
"""
import copy

import pytest
import torch

import decode.verify
from decode.eagle import TREE_WIDTH, Eagle, parse_shape
from decode.sampling import Sampling
from decode.speculative import generate
from model.checkpoint import CheckpointError
from model.eagle import EagleHead, load_eagle, save_eagle
from model.tokenizer import Tokenizer
from tests.conftest import assert_holds_context, target_context, tiny_model
from tests.test_medusa import TARGET, fitted, plain_greedy, sampled_corpus  # context 32: 60 tokens slide twice
from tests.test_speculative import PROMPTS, RecordingTarget
from heads_training import EAGLE_TRAINING, EagleTraining, evaluate_eagle

TOKENIZER = Tokenizer({"kind": "bpe", "merges": []})
# (r, c, seconds) for "auto": cheap passes and a head whose timed forwards cost nothing against an
# infinite bare time, so that its sizing never depends on this machine's speed
COSTS = ([1.0 + 0.1 * n for n in range(32)], 0.1, float("inf"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(head, its val accuracies, untrained accuracies): a head trained briefly on text the target
    writes itself, right often but not always."""
    corpus, val = sampled_corpus(TARGET), sampled_corpus(TARGET, seed=1)
    untrained = evaluate_eagle(TARGET, EagleHead(TARGET), val, 8, 32, 2, "cpu")
    opt = dict(EAGLE_TRAINING, max_iters=150, batch_size=8, min_lr=3e-4, warmup_iters=5, eval_interval=150,
               eval_iters=2)
    path = tmp_path_factory.mktemp("eagle") / "eagle.pt"
    fitted(EagleTraining(TARGET, TOKENIZER, corpus, val, path, opt, log=lambda *args: None))
    head, state = load_eagle(path, TARGET, TOKENIZER, dtype=torch.float64)
    return head, state, untrained


# ---- the head, its training and its file -----------------------------------------------------------

def test_the_head_reads_features_and_tokens_through_the_targets_own_embedding_and_lm_head():
    head = EagleHead(TARGET)
    assert all(name.startswith(("fuse.", "block.")) for name in head.state_dict())  # the target's stay its own
    logits, features = TARGET(torch.tensor([[1, 2, 3, 4]]), return_hidden=True)
    predicted, head_logits = head(features, torch.tensor([[2, 3, 4, 5]]))
    assert predicted.shape == features.shape and head_logits.shape == logits.shape
    torch.testing.assert_close(head_logits, TARGET.lm_head(predicted))


def test_training_lowers_the_losses_and_saves_the_accuracies(trained):
    head, state, untrained = trained
    assert state["feature_loss"] < untrained[0] and state["token_loss"] < untrained[1]
    accuracies, ranks = state["accuracies"], state["ranks"]
    assert len(accuracies) == 4 and accuracies[0] > untrained[2][0] and accuracies[0] > 0.3
    assert len(ranks) == 4 and ranks[0] == pytest.approx(accuracies[0]) and sum(ranks) <= 1  # rank 0 is top-1
    assert not any(p.requires_grad for p in TARGET.parameters())  # the target stays frozen


def test_the_head_refuses_another_target(trained, tmp_path):
    head, _, _ = trained
    path = tmp_path / "eagle.pt"
    save_eagle(path, head, TARGET, TOKENIZER, accuracies=[0.5] * 4)
    loaded, state = load_eagle(path, TARGET, TOKENIZER, dtype=torch.float64)
    assert torch.equal(loaded.fuse.weight, head.fuse.weight) and state["accuracies"] == [0.5] * 4
    target32 = copy.deepcopy(TARGET).float()  # the same weights in float32: still the head's target
    head32 = load_eagle(path, target32, TOKENIZER)[0]
    saved = head.state_dict()
    assert head32.state_dict().keys() == saved.keys() and all(
        w.dtype == torch.float32 and torch.equal(w, saved[name].float()) for name, w in head32.state_dict().items())
    features, tokens = TARGET(torch.tensor([[1, 2, 3]]), return_hidden=True)[1], torch.tensor([[2, 3, 4]])
    torch.testing.assert_close(head32(features.float(), tokens)[1], head(features, tokens)[1].float(), rtol=1e-4,
                               atol=1e-4)  # it drafts through the float32 target's embedding and lm_head
    with pytest.raises(CheckpointError, match="trained for another target model") as refused:
        load_eagle(path, tiny_model(seed=1), TOKENIZER)
    assert refused.value.retrain == "eagle"
    with pytest.raises(CheckpointError, match="another target"):  # same weights, another tokenizer
        load_eagle(path, TARGET, Tokenizer({"kind": "bpe", "merges": [[32, 116]]}))
    with pytest.raises(CheckpointError, match="no eagle checkpoint"):
        load_eagle(tmp_path / "missing.pt", TARGET, TOKENIZER)


@pytest.mark.parametrize("value, parsed", [("chain:4", ("chain", 4)), ("tree:auto", ("tree", "auto")),
                                           ("tree:64", ("tree", 64)), ("chain:auto", ("chain", "auto"))])
def test_settings(value, parsed):
    assert parse_shape(value) == parsed


@pytest.mark.parametrize("value", ["chain", "tree:0", "chain:17", "tree:65", "bush:4", "tree:x", ""])
def test_bad_settings_are_refused(value):
    with pytest.raises(ValueError, match="chain:K"):
        parse_shape(value)


# ---- greedy: token-identical to plain, both caches exact -------------------------------------------

SHAPES = [("chain", 1), ("chain", 4), ("chain", "auto"), ("tree", 4), ("tree", 12), ("tree", "auto")]


@pytest.mark.parametrize("shape, size", SHAPES)
def test_greedy_eagle_is_token_identical_to_plain(trained, shape, size):
    head = trained[0]
    accepted = judged = forwards = 0
    for prompt in PROMPTS:
        spec, stats = generate(TARGET, prompt, 60, Sampling(), proposer=Eagle(head, shape, size, COSTS))
        assert spec == plain_greedy(tuple(prompt))
        accepted, judged, forwards = accepted + stats.accepted, judged + stats.judged, forwards + stats.target_forwards
    assert forwards < 4 * 60 and accepted > 0  # speculation saved target passes
    if size != "auto":  # the test must exercise both accepted and rejected candidates (a sized
        assert 0.2 < accepted / judged < 0.95  # proposer may offer only what it is sure of)


def assert_head_holds_context(proposer, target, tokens):
    """The head's cache, caught up after a round that wrote `tokens`, is a fresh prefill of its
    pairs: the target's fresh features of the tokens of the target's context, each with the token
    after it."""
    held = target_context(tokens, target.config.block_size)
    features = target(torch.tensor([held]), return_hidden=True)[1]
    fresh = proposer.head.new_cache(scratch=0)
    proposer.head(features, torch.tensor([tokens[len(tokens) - len(held):]]), fresh)
    fresh.commit()
    assert proposer.cache.length == fresh.length == len(held)
    for cached, expected in ((proposer.cache.k, fresh.k), (proposer.cache.v, fresh.v)):
        torch.testing.assert_close(cached[..., :fresh.length, :], expected[..., :fresh.length, :], rtol=0, atol=1e-10)


def checking_the_head(proposer, target):
    """`proposer` (an Eagle), checking its head's cache whenever it catches up: every round it drafts."""
    propose = proposer.propose
    proposer.head_checks = 0

    def propose_and_check(tokens, max_depth, sampling, generator):
        forwards = proposer.forwards
        candidates = propose(tokens, max_depth, sampling, generator)
        if proposer.forwards > forwards:
            assert_head_holds_context(proposer, target, tokens)
            proposer.head_checks += 1
        return candidates

    proposer.propose = propose_and_check
    return proposer


class CheckedEagle(Eagle):
    """After every round the target's cache must equal a fresh prefill of its context, and the
    head's whenever it catches up (checking_the_head)."""

    def update(self, tokens, verdict, logits, hidden):
        super().update(tokens, verdict, logits, hidden)
        assert_holds_context(self.recorder.model, self.recorder.cache, tokens)


@pytest.mark.parametrize("shape, size", [("chain", 4), ("tree", 12), ("tree", "auto")])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0)])
def test_both_caches_equal_fresh_prefills_after_every_round(trained, shape, size, sampling):
    checked = accepted = 0
    for prompt in PROMPTS:  # a sized tree sits out rounds whose guesses would not pay: several prompts
        recorder = RecordingTarget(TARGET)
        proposer = checking_the_head(CheckedEagle(trained[0], shape, size, COSTS, ranks=trained[1]["ranks"]), TARGET)
        proposer.recorder = recorder
        _, stats = generate(recorder, prompt, 70, sampling, torch.Generator().manual_seed(0), proposer=proposer)
        checked, accepted = checked + proposer.head_checks, accepted + stats.accepted
    assert checked > 20 and accepted > 0


class SurerHead:
    """An EAGLE head's guesses held three times as surely (its logits tripled): the trained head's
    best guess has a probability of about 0.1, which leaves a tree of 12 nodes two levels deep and
    the choice of which nodes to expand untested."""

    def __init__(self, head):
        self.head = head

    def new_cache(self, scratch):
        return self.head.new_cache(scratch)

    def __call__(self, features, tokens, cache=None, mask=None):
        predicted, logits = self.head(features, tokens, cache, mask)
        return predicted, 3 * logits


def test_a_dynamic_tree_holds_the_most_confident_nodes_parents_first(trained):
    head, max_depth = SurerHead(trained[0]), 5
    proposer = Eagle(head, "tree", 12)
    # a node's value uncalibrated: EAGLE-2's confidence, the product of the head's probabilities down
    # its path (the calibration's prior before any verdict rounds them to bins, which ties them)
    proposer.calibration = lambda rank, p: p
    proposer.start([3, 1, 4])
    logits, hidden = TARGET(torch.tensor([[3, 1, 4]]), return_hidden=True)  # the first pass: the prompt
    token = int(logits[0, -1].argmax())
    proposer.update([3, 1, 4, token], decode.verify.Verdict([], token, 0, False), logits[0, -1:], hidden[0])
    candidates = proposer.propose([3, 1, 4, token], max_depth, Sampling(), None)
    assert len(candidates) == 12 and candidates.draft_probs is None  # deterministic guesses
    assert all(p < i for i, p in enumerate(candidates.parents))  # parents listed first
    assert 2 < max(candidates.depths()) <= max_depth
    assert proposer.cache.length == 3  # the drafts' scratch is rolled back; the 3 real pairs stay

    def likeliest_children(path):
        """{token: the head's probability} of the TREE_WIDTH likeliest tokens after the drafted `path`,
        the head run over the real pairs and the path in sequence: no cache, no tree mask."""
        features, tokens = hidden[0], [1, 4, token]
        for x in path:
            predicted = head(features[None], torch.tensor([tokens]))[0][0, -1:]
            features, tokens = torch.cat([features, predicted]), tokens + [x]
        top = torch.softmax(head(features[None], torch.tensor([tokens]))[1][0, -1].float(), -1).topk(TREE_WIDTH)
        return dict(zip(top.indices.tolist(), top.values.tolist()))

    # EAGLE-2's tree: depth by depth, the likeliest children of the most confident nodes of the depth
    # before are drafted; the tree is the most confident of all the nodes drafted
    confidence, frontier = {(): 1.0}, [()]
    for depth in range(1, max_depth + 1):
        for path in frontier:
            for x, p in likeliest_children(path).items():
                confidence[path + (x,)] = confidence[path] * p
        frontier = sorted((path for path in confidence if len(path) == depth), key=confidence.get)[-TREE_WIDTH:]
    paths = []
    for x, parent in zip(candidates.tokens, candidates.parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (x,))
    drafted = sorted((path for path in confidence if path), key=confidence.get)
    assert set(paths) == set(drafted[-12:])
