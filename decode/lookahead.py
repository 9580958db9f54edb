"""Lookahead decoding (Fu, Bailis, Stoica, Zhang 2024): Jacobi iteration that keeps its history.

Each target pass carries two branches that cannot see each other:

  - the lookahead branch, a window of W columns and N-1 levels of Jacobi guesses. Column j holds
    an n-gram in the making: level l sits at position root + 1 + j + l. Level 0 is causal along
    the window; a token at a higher level also sees the earlier levels of its own column, so
    along column j it reads one contiguous run of positions:

        level 2   .  .  c2 .        position root+1+j+2  sees  level 0 up to column j, c1, c2
        level 1   .  .  c1 .        position root+1+j+1
        level 0   a0 a1 c0 a3       positions root+1 .. root+W, causal
                  j=0 1  2  3

  - the verification branch: up to G n-grams from the pool whose first token is the root (the
    last accepted token), as a trie of candidates checked by the shared verifier.

After the pass, the top level's predictions complete W n-grams (column j: its N-1 guesses and the
prediction after them), which go into the pool; the levels shift down by one and the predictions
become the new top level. The window never enters the cache and never reaches the output: only
verified candidates do.
"""
from collections import OrderedDict, defaultdict

import torch

from decode.jacobi import random_context_tokens
from decode.tree import Candidates, SideBranch


def lookahead_mask(window, levels):
    """Bool (levels*W, levels*W) mask of the lookahead branch, level-major (index l * W + j)."""
    size = levels * window
    mask = torch.zeros(size, size, dtype=torch.bool)
    for level in range(levels):
        for col in range(window):
            row = level * window + col
            mask[row, :col + 1] = True  # level 0, columns 0..col
            for earlier in range(1, level + 1):  # its own column above level 0, itself included
                mask[row, earlier * window + col] = True
    return mask


class Lookahead:
    forwards = 0  # no draft model: the target drafts for itself

    def __init__(self, model, window=5, ngram=3, guesses=5, pool_from_prompt=False):
        if ngram < 2:
            raise ValueError("lookahead needs n-grams of at least 2 tokens")
        self.model = model
        self.window, self.ngram, self.guesses = window, ngram, guesses
        self.pool_from_prompt = pool_from_prompt
        self.levels = ngram - 1
        self.mask = lookahead_mask(window, self.levels)
        self.offsets = [1 + col + level for level in range(self.levels) for col in range(window)]
        self.max_candidates = (guesses + window) * (ngram - 1)

    def start(self, prompt):
        self.rng = torch.Generator().manual_seed(0)  # initial guesses; not the sampling generator
        self.pool = defaultdict(OrderedDict)  # first token -> {rest of the n-gram: None}, oldest first
        self.grid = [random_context_tokens(prompt, self.window, self.rng) for _ in range(self.levels)]
        self.n_candidates = None
        if self.pool_from_prompt:
            for i in range(len(prompt) - self.ngram + 1):
                self.remember(prompt[i:i + self.ngram])

    def remember(self, gram):
        grams = self.pool[gram[0]]
        grams.pop(tuple(gram[1:]), None)
        grams[tuple(gram[1:])] = None  # most recent last
        if len(grams) > self.guesses:
            grams.popitem(last=False)

    def propose(self, tokens, max_depth, sampling, generator):
        recent = list(self.pool.get(tokens[-1], {}))[-self.guesses:]
        candidates = Candidates.from_sequences([gram[:max_depth] for gram in reversed(recent)])
        if max(self.offsets) <= max_depth:  # the window fits in the context: let it ride along
            side_tokens = [t for level in self.grid for t in level]
            candidates.side = SideBranch(side_tokens, self.offsets, self.mask)
            self.n_candidates = len(candidates)
        return candidates

    def update(self, tokens, verdict, hidden):
        if self.n_candidates is None:  # the window did not ride along this round
            return
        side = hidden[1 + self.n_candidates:]  # (levels*W, C), level-major
        top = self.model.lm_head(side[-self.window:]).argmax(-1).tolist()  # after each top-level guess
        for col in range(self.window):
            self.remember([level[col] for level in self.grid] + [top[col]])
        self.grid = self.grid[1:] + [top]
        self.n_candidates = None
