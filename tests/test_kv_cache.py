"""Commit and rollback: after every step the cache holds exactly what a fresh prefill would."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from model.kv_cache import KVCache, RowView
from tests.conftest import assert_matches_prefill, cache_row, tiny_model
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
    cache = MODEL.new_cache(scratch=8)
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
    cache = MODEL.new_cache(scratch=0)
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


def padded_batch(rows):
    """One pass for rows of different sizes: each row's (tokens, parents) padded to the longest with
    tokens that see only themselves. Returns idx (B, n), each row's tree mask (B, n, n) and depths (B, n)."""
    n = max(len(tokens) for tokens, _ in rows)
    idx = torch.zeros(len(rows), n, dtype=torch.long)
    masks = torch.eye(n, dtype=torch.bool).repeat(len(rows), 1, 1)
    depths = torch.zeros(len(rows), n, dtype=torch.long)
    for b, (tokens, parents) in enumerate(rows):
        mask, depth = tree_mask_and_depths(list(parents))
        idx[b, :len(tokens)] = torch.tensor(tokens)
        masks[b, :len(tokens), :len(tokens)] = mask
        depths[b, :len(tokens)] = depth
    return idx, masks, depths


@settings(max_examples=25, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=8), min_size=3, max_size=3),
       rounds=st.lists(st.lists(round_strategy, min_size=3, max_size=3), max_size=4))
@torch.no_grad()
def test_batch_rows_of_different_lengths_are_each_decoded_as_if_alone(prompts, rounds):
    """A batch whose rows commit different numbers of entries: every pass gives each row the logits
    it would get alone, and each row's cache stays a fresh prefill of its own tokens."""
    cache = MODEL.new_cache(scratch=8, batch_size=3)
    alone = [MODEL.new_cache(scratch=8) for _ in prompts]
    committed = [list(p) for p in prompts]
    # the prompts as a first pass of causal chains of different lengths, each row keeping its own
    idx, masks, depths = padded_batch([(p, list(range(-1, len(p) - 1))) for p in prompts])
    MODEL(idx, cache, pos=depths, mask=masks)
    cache.commit([list(range(len(p))) for p in prompts])
    for row_cache, p in zip(alone, prompts):
        MODEL(torch.tensor([p]), row_cache)
        row_cache.commit()
    for batch_round in rounds:
        for b, (_, _, _, back) in enumerate(batch_round):
            cache.rollback(max(0, cache.lengths[b] - back), row=b)
            alone[b].rollback(cache.lengths[b])
            committed[b] = committed[b][:cache.lengths[b]]
        idx, masks, depths = padded_batch([(tokens, parents) for tokens, parents, _, _ in batch_round])
        logits = MODEL(idx, cache, pos=torch.tensor(cache.lengths)[:, None] + depths, mask=masks)
        keep = []
        for b, (tokens, parents, node, _) in enumerate(batch_round):
            mask, depth = tree_mask_and_depths(list(parents))
            expected = MODEL(torch.tensor([tokens]), alone[b], pos=alone[b].length + depth, mask=mask)
            torch.testing.assert_close(logits[b:b + 1, :len(tokens)], expected, rtol=0, atol=1e-10)
            path = [] if node is None else path_to(list(parents), node)
            alone[b].commit(path)
            keep.append(path)
            committed[b] += [tokens[i] for i in path]
        cache.commit(keep)
        for b in range(3):
            assert_cache_is_fresh_prefill(cache_row(cache, b), committed[b])


@torch.no_grad()
def test_finished_rows_are_dropped_from_the_batch():
    cache = MODEL.new_cache(scratch=0, batch_size=3)
    idx, masks, depths = padded_batch([([1, 2, 3], [-1, 0, 1]), ([4], [-1]), ([5, 6], [-1, 0])])
    MODEL(idx, cache, pos=depths, mask=masks)
    cache.commit([[0, 1, 2], [0], [0, 1]])
    cache.select_rows([0, 2])
    assert cache.lengths == [3, 2] and cache.k.size(1) == 2
    MODEL(torch.tensor([[7], [8]]), cache)  # a ragged decode step: each row at its own position
    cache.commit()
    for b, tokens in enumerate([[1, 2, 3, 7], [5, 6, 8]]):
        assert_cache_is_fresh_prefill(cache_row(cache, b), tokens)


@torch.no_grad()
def test_a_forward_over_some_rows_writes_theirs_alone():
    """RowView: rows 0 and 2 (of different lengths) pass three tokens in one forward, row 1 one token
    in another; each row gets the logits it would alone, and after the one commit of the cache each
    row is a fresh prefill of its own tokens."""
    cache = MODEL.new_cache(scratch=0, batch_size=3)
    idx, masks, depths = padded_batch([([1, 2, 3], [-1, 0, 1]), ([4], [-1]), ([5, 6], [-1, 0])])
    MODEL(idx, cache, pos=depths, mask=masks)
    cache.commit([[0, 1, 2], [0], [0, 1]])
    wide = MODEL(torch.tensor([[7, 8, 9], [10, 11, 12]]), RowView(cache, [0, 2]))
    narrow = MODEL(torch.tensor([[13]]), RowView(cache, [1]))
    for logits, whole, prefix in [(wide[0], [1, 2, 3, 7, 8, 9], 3), (narrow[0], [4, 13], 1),
                                  (wide[1], [5, 6, 10, 11, 12], 2)]:
        torch.testing.assert_close(logits, MODEL(torch.tensor([whole]))[0, prefix:], rtol=0, atol=1e-10)
    cache.commit([[0, 1, 2], [0], [0, 1]])
    for b, tokens in enumerate([[1, 2, 3, 7, 8, 9], [4, 13], [5, 6, 10, 11]]):
        assert_cache_is_fresh_prefill(cache_row(cache, b), tokens)
    assert not hasattr(RowView(cache, [0]), "commit")  # only the cache commits
