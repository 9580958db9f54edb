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
become the new top level. The pool also collects, for free, the n-grams of the text as it is
committed (as prompt lookup would find them), and with pool_from_prompt those of the prompt. The
window never enters the cache and never reaches the output: only verified candidates do.

Sizing. By default each pass takes the verification depth and whether the window rides, or neither
(a plain step), that pay best by this machine's measured costs (decode/sizing.py LookaheadSizing).
"""
from collections import OrderedDict, defaultdict

import torch

from decode.jacobi import random_context_tokens
from decode.proposer import Proposer
from decode.sizing import LookaheadSizing
from decode.tree import Candidates, SideBranch

# W, N, G: the bounds a sized pass works within, small: on a CPU every token of a pass costs a share
# of a step (docs/2026-12-03-epyc-c.md)
WINDOW, NGRAM_SIZE, MAX_NGRAMS = 2, 2, 2
SIZING = "auto"


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


class Lookahead(Proposer):
    def __init__(self, window=WINDOW, ngram_size=NGRAM_SIZE, max_ngrams=MAX_NGRAMS,
                 pool_from_prompt=False, costs=None):
        """costs: None carries the whole window and all G n-grams in every pass (the paper's fixed
        sizes); this machine's Costs (r at least max_candidates + 1 long) size each pass."""
        if ngram_size < 2:
            raise ValueError("lookahead needs n-grams of at least 2 tokens (N = 2 is Jacobi decoding with a pool)")
        self.window, self.max_ngrams, self.pool_from_prompt = window, max_ngrams, pool_from_prompt
        self.levels = ngram_size - 1
        self.mask = lookahead_mask(window, self.levels)
        self.offsets = [1 + col + level for level in range(self.levels) for col in range(window)]
        self.max_candidates = (max_ngrams + window) * self.levels
        if costs is not None and len(costs.r) <= self.max_candidates:
            raise ValueError(f"the cost curve must cover passes of up to {self.max_candidates + 1} tokens")
        self.sizing = LookaheadSizing(costs, self.levels, len(self.offsets)) if costs is not None else None

    def start(self, prompt):
        self.rng = torch.Generator().manual_seed(0)  # initial guesses; not the sampling generator
        self.pool = defaultdict(OrderedDict)  # first token -> {rest of the n-gram: its source}, oldest first
        self.grid = [random_context_tokens(prompt, self.window, self.rng) for _ in range(self.levels)]
        self.harvested = self.levels if self.pool_from_prompt else len(prompt)  # next n-gram end to harvest
        self.offered, self.rides = [], False  # this round's verified n-grams (with sources), window or not

    def remember(self, gram, source):
        grams = self.pool[gram[0]]
        grams.pop(tuple(gram[1:]), None)
        grams[tuple(gram[1:])] = source  # most recent last
        if len(grams) > self.max_ngrams:
            grams.popitem(last=False)

    def propose(self, tokens, max_depth, sampling, generator):
        for end in range(self.harvested, len(tokens)):  # the committed text's n-grams: free candidates
            self.remember(tokens[end - self.levels:end + 1], "text")
        self.harvested = len(tokens)
        pool = self.pool.get(tokens[-1], {})
        grams = [(gram[:max_depth], pool[gram]) for gram in reversed(pool)]  # most recent first
        window_fits = max(self.offsets) <= max_depth
        depth, self.rides = (self.sizing.size([g for g, _ in grams], window_fits) if self.sizing
                             else (self.levels, window_fits))
        self.offered = [(gram[:depth], source) for gram, source in grams] if depth else []
        candidates = Candidates.from_sequences([gram for gram, _ in self.offered])
        if self.rides:
            candidates.side = SideBranch([t for level in self.grid for t in level], self.offsets, self.mask)
        return candidates

    def update(self, tokens, verdict, logits, hidden):
        offered, rides = self.offered, self.rides
        self.offered, self.rides = [], False  # a round without a proposal (before a slide) offers nothing
        accepted = len(verdict.path)
        if self.sizing:  # crediting the window with the tokens its n-grams brought in
            path = tokens[-1 - accepted:-1]
            source = accepted and next(source for gram, source in offered if list(gram[:accepted]) == path)
            self.sizing.record(max((len(gram) for gram, _ in offered), default=0), accepted,
                               accepted if source == "window" else 0, rides)
        if not rides:
            return
        # the side branch (levels*W rows, level-major) ends the pass: its last W follow the top-level guesses
        top = logits[-self.window:].argmax(-1).tolist()
        for col in range(self.window):
            self.remember([level[col] for level in self.grid] + [top[col]], "window")
        self.grid = self.grid[1:] + [top]
