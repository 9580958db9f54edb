"""Turning logits into the next token: temperature, top-k, top-p, greedy.

Every decoder (plain and speculative) draws from `token_probs`, so "the distribution a speculative
method must preserve" is defined once, here.
"""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy: always the argmax
    top_k: int | None = None  # keep only the k most likely tokens
    top_p: float = 1.0        # keep the smallest set of most likely tokens whose mass reaches top_p

    @property
    def greedy(self):
        return self.temperature == 0


def token_probs(logits, sampling):
    """The distribution (..., vocab) that `sampling` draws from, given logits (..., vocab).
    Greedy is a one-hot on the argmax."""
    logits = logits.double() if logits.dtype == torch.float64 else logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.size(-1):
        kth_largest = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # the top-1 token always has 0 before it
        drop_sorted = mass_before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def next_token(logits, sampling, generator=None):
    """One token id from logits (vocab,)."""
    if sampling.greedy:
        return int(logits.argmax())
    return int(torch.multinomial(token_probs(logits, sampling), 1, generator=generator))
