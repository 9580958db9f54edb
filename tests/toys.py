"""Toy models with the model interface, for exactness tests whose answer can be enumerated.

A bigram model's next-token logits depend only on the current token, so the exact probability of any
short continuation is a product of table entries: with vocabulary 4 and 4 new tokens there are 256
outcomes, each with a known probability, to hold sampled frequencies against.
"""
import itertools
import math
from types import SimpleNamespace

import torch

from decode.sampling import token_probs
from model.kv_cache import KVCache


class ToyBigram(torch.nn.Module):
    """Logits (B, n, V) = table[idx]. Writes placeholder K/V so every cache commit and rollback runs
    exactly as with a real model."""

    def __init__(self, table, block_size=64):
        super().__init__()
        self.table = table.double()  # (V, V): row = current token, columns = next-token logits
        self.config = SimpleNamespace(block_size=block_size, vocab_size=table.size(0))
        self.lm_head = torch.nn.Identity()  # its "hidden states" are already logits

    def new_cache(self, batch_size=1, scratch=256):
        return KVCache(1, batch_size, 1, 1, self.config.block_size + scratch, dtype=torch.float64)

    def forward(self, idx, cache=None, pos=None, mask=None, return_hidden=False):
        if cache is not None:
            placeholder = torch.zeros(idx.size(0), 1, idx.size(1), 1, dtype=torch.float64)
            cache.write(0, placeholder, placeholder)
        logits = self.table[idx]  # (B, n, V)
        return (logits, logits) if return_hidden else logits  # the logits stand in for hidden states


def random_table(vocab, seed, scale=1.5):
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def exact_joint(table, sampling, first, length):
    """{continuation: probability} of `length` tokens after token `first`, sampling the bigram table."""
    probs = token_probs(table, sampling)  # (V, V)
    joint = {}
    for seq in itertools.product(range(table.size(0)), repeat=length):
        p, prev = 1.0, first
        for t in seq:
            p *= float(probs[prev, t])
            prev = t
        joint[seq] = p
    return joint


def total_variation(counts, joint, n):
    return 0.5 * sum(abs(counts.get(seq, 0) / n - p) for seq, p in joint.items())


def chi_square(counts, joint, n):
    """(statistic, degrees of freedom) over the outcomes of positive probability; an outcome of
    probability 0 that was drawn makes the statistic infinite."""
    if any(joint.get(seq, 0.0) == 0.0 for seq in counts):
        return math.inf, 1
    support = [p for p in joint.values() if p > 0]
    stat = sum((counts.get(seq, 0) - n * p) ** 2 / (n * p) for seq, p in joint.items() if p > 0)
    return stat, len(support) - 1


def chi_square_critical(df, z=3.09):
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.09 is the 0.999 normal quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
