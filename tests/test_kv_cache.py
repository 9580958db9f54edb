"""Commit and rollback: after every step the cache holds exactly what a fresh prefill would."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from model.kv_cache import KVCache
from tests.conftest import assert_matches_prefill, tiny_model
from tests.test_model import path_to, tree_mask_and_depths

MODEL = tiny_model(block_size=48)


def assert_cache_is_fresh_prefill(cache, tokens):
    assert_matches_prefill(MODEL, cache, tokens)


# One round: a candidate tree of new tokens (each node's parent, or -1 for the root), which node's
# root-to-node path to commit (None: commit nothing), and how many committed tokens to roll back first.
round_strategy = st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 63), min_size=n, max_size=n),
    st.tuples(*[st.integers(-1, i - 1) for i in range(n)]),
    st.one_of(st.none(), st.integers(0, n - 1)),
    st.integers(0, 3),
))


@settings(max_examples=60, deadline=None)
@given(first=st.lists(st.integers(0, 63), min_size=1, max_size=8), rounds=st.lists(round_strategy, max_size=6))
@torch.no_grad()
def test_random_commit_and_rollback_patterns(first, rounds):
    cache = MODEL.new_cache()
    MODEL(torch.tensor([first]), cache)
    cache.commit()
    committed = list(first)
    for tokens, parents, node, back in rounds:
        cache.rollback(max(0, cache.length - back))
        committed = committed[:cache.length]
        assert_cache_is_fresh_prefill(cache, committed)
        mask, depth = tree_mask_and_depths(list(parents))
        MODEL(torch.tensor([tokens]), cache, pos=cache.length + depth, mask=mask)
        path = [] if node is None else path_to(list(parents), node)
        cache.commit(path)
        committed += [tokens[i] for i in path]
        assert_cache_is_fresh_prefill(cache, committed)


@torch.no_grad()
def test_plain_decoding_commits_everything_it_wrote():
    cache = MODEL.new_cache()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    for t in tokens:
        MODEL(torch.tensor([[t]]), cache)
        cache.commit()
    assert_cache_is_fresh_prefill(cache, tokens)


def test_overflow_is_an_error_not_corruption():
    cache = KVCache(n_layer=1, batch_size=1, n_head=1, head_dim=2, capacity=4)
    cache.write(0, torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    cache.commit()
    with pytest.raises(RuntimeError, match="overflow"):
        cache.write(0, torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    assert cache.length == 3


def test_bad_commit_and_rollback_are_refused():
    cache = KVCache(n_layer=1, batch_size=1, n_head=1, head_dim=2, capacity=8)
    cache.write(0, torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    with pytest.raises(ValueError):
        cache.commit([0, 3])  # only 3 scratch entries
    with pytest.raises(ValueError):
        cache.commit([1, 1])
    cache.commit([2, 0])
    assert cache.length == 2
    with pytest.raises(ValueError):
        cache.rollback(3)
