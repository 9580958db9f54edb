"""The reference of kernels.attention and its torch backend (SDPA) against a from-the-definition
softmax(QK^T / sqrt(d)) V."""
import math

import pytest
import torch

from kernels import reference_attention, sdpa_attention

IMPLEMENTATIONS = pytest.mark.parametrize("attention", [reference_attention, sdpa_attention])


def naive_attention(q, k, v, mask):
    prefix = k.size(-2) - q.size(-2)
    full = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool)
    full[:, prefix:] = mask
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    return torch.softmax(scores.masked_fill(~full, float("-inf")), dim=-1) @ v


@IMPLEMENTATIONS
@pytest.mark.parametrize("n,prefix", [(1, 0), (1, 9), (5, 0), (5, 7), (16, 3)])
def test_matches_definition(attention, n, prefix):
    gen = torch.Generator().manual_seed(n * 100 + prefix)
    q = torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, prefix + n, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, prefix + n, 8, generator=gen, dtype=torch.float64)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    torch.testing.assert_close(attention(q, k, v), naive_attention(q, k, v, causal))
    tree = torch.rand(n, n, generator=gen) < 0.5
    tree.fill_diagonal_(True)
    torch.testing.assert_close(attention(q, k, v, tree), naive_attention(q, k, v, tree))


@IMPLEMENTATIONS
@pytest.mark.parametrize("n", [1, 4])
def test_rows_with_their_own_prefix_lengths_attend_as_if_alone(attention, n):
    """Batched decoding: row b's prefix is its first lengths[b] keys, its n new keys follow at once,
    and what lies after them (another row's longer prefix) is not seen."""
    gen = torch.Generator().manual_seed(n)
    lengths = torch.tensor([0, 5, 9])
    q = torch.randn(3, 2, n, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 2, 9 + n, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 2, 9 + n, 8, generator=gen, dtype=torch.float64)
    trees = torch.rand(3, n, n, generator=gen) < 0.5
    trees |= torch.eye(n, dtype=torch.bool)
    for mask in (None, trees[1], trees):  # causal, one mask for every row, a mask per row
        out = attention(q, k, v, mask, lengths)
        for b, length in enumerate(lengths.tolist()):
            alone = slice(b, b + 1), slice(None), slice(0, length + n)
            row_mask = torch.ones(n, n, dtype=torch.bool).tril() if mask is None else mask if mask.dim() == 2 else mask[b]
            torch.testing.assert_close(out[b:b + 1], naive_attention(q[b:b + 1], k[alone], v[alone], row_mask))


def test_a_pass_mask_is_reused_only_for_the_same_lengths_and_mask():
    """Every layer of a pass reuses the mask its first layer built; the next pass, with new lengths of
    the same shape, or a new mask, gets its own."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 1, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.bool)
    for lengths in (torch.tensor([6, 2]), torch.tensor([6, 2]), torch.tensor([3, 6]), torch.tensor([3, 6])):
        for mask in (None, one, one):
            out = sdpa_attention(q, k, v, mask, lengths)
            for b, length in enumerate(lengths.tolist()):
                alone = slice(b, b + 1), slice(None), slice(0, length + 1)
                torch.testing.assert_close(out[b:b + 1], naive_attention(q[b:b + 1], k[alone], v[alone], one))


def test_rows_going_on_by_the_same_steps_attend_as_if_alone_pass_after_pass():
    """Plain decoding of rows of different lengths: each pass's keys are one longer, the rows as far
    apart as before, until they move apart (a row accepted more) or the keys outgrow the mask built."""
    gen = torch.Generator().manual_seed(0)
    one = torch.ones(1, 1, dtype=torch.bool)
    for lengths in [[2, 5, 3]] * 3 + [[9, 4, 5], [10, 5, 6]] + [[11 + step, 6 + step, 7 + step] for step in range(30)]:
        total = max(lengths) + 1
        q = torch.randn(3, 2, 1, 8, generator=gen, dtype=torch.float64)
        k = torch.randn(3, 2, total, 8, generator=gen, dtype=torch.float64)
        v = torch.randn(3, 2, total, 8, generator=gen, dtype=torch.float64)
        out = sdpa_attention(q, k, v, None, torch.tensor(lengths))
        for b, length in enumerate(lengths):
            alone = slice(b, b + 1), slice(None), slice(0, length + 1)
            torch.testing.assert_close(out[b:b + 1], naive_attention(q[b:b + 1], k[alone], v[alone], one))


@IMPLEMENTATIONS
def test_strided_cache_views_are_fine(attention):
    gen = torch.Generator().manual_seed(0)
    cache_k = torch.randn(1, 2, 40, 8, generator=gen, dtype=torch.float64)  # a cache slot bigger than what is in use
    cache_v = torch.randn(1, 2, 40, 8, generator=gen, dtype=torch.float64)
    q = torch.randn(1, 2, 3, 8, generator=gen, dtype=torch.float64)
    k, v = cache_k[:, :, :10], cache_v[:, :, :10]
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    for mask in (None, tree):  # against the definition, which reads contiguous copies
        expected = naive_attention(q, k.contiguous(), v.contiguous(), causal if mask is None else mask)
        torch.testing.assert_close(attention(q, k, v, mask), expected)


@IMPLEMENTATIONS
def test_bad_shapes_are_refused(attention):
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError):
        attention(q, torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))  # fewer keys than queries
    with pytest.raises(ValueError):
        attention(q, torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.ones(2, 2, dtype=torch.bool))
