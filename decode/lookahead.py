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

Sizing. Fu et al. size W, N, G to the accelerator's idle compute: there the extra tokens of a pass
cost almost nothing. On a CPU every token of a pass costs a measurable share of a step (r(n), see
decode/cost.py) and fixed sizes lose to plain decoding. So by default each pass is sized: with
running estimates of how many candidates get accepted at each depth (ReachTally) and how many
accepted tokens the window's n-grams have earned per pass it rode in, the proposer picks the
verification depth (0..N-1) and whether the window rides, maximising expected new tokens per unit
of pass cost,

    (1 + E[accepted candidates at depth d] + E[tokens owed to the window]) / r(pass size).

When nothing pays, the pass is the root alone: exactly a plain decoding step. What was switched off
rides along again now and then (after 4 rounds, then 8, 16, ... at most 64) so that the estimates
can recover when the text turns repetitive.
"""
from collections import OrderedDict, defaultdict

import torch

from decode.cost import cost_curve, extended, profile_prefix
from decode.jacobi import random_context_tokens
from decode.proposer import Proposer
from decode.tree import Candidates, SideBranch

# W, N, G: the bounds a sized pass works within. Small, because on a CPU every token of a pass
# costs a share of a step; larger ones were measured slower here (docs/).
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


class ReachTally:
    """How deep the verifier's accepted path reaches, counted over the passes so far:
    reach(d) estimates P(at least d candidates accepted | the candidates offered went d deep), so
    that sum(reach(1..D)) is the expected number of accepted candidates when offering depth D.
    Before any pass it assumes reach(d) = prior^d, worth `weight` passes: optimistic enough that
    every depth gets tried before the counts take over."""

    def __init__(self, max_depth, prior=0.5, weight=2):
        self.hits, self.tries = [0] * (max_depth + 1), [0] * (max_depth + 1)
        self.prior, self.weight = prior, weight

    def reach(self, depth):
        return (self.hits[depth] + self.prior ** depth * self.weight) / (self.tries[depth] + self.weight)

    def expected(self, depth):
        return sum(self.reach(d) for d in range(1, depth + 1))

    def record(self, offered, accepted):
        for d in range(1, offered + 1):
            self.tries[d] += 1
            self.hits[d] += accepted >= d


WINDOW_PRIOR, WINDOW_PRIOR_WEIGHT = 0.5, 2  # tokens a window pass is assumed to earn, worth 2 passes
FIRST_PROBE, MAX_PROBE_GAP = 4, 64          # rounds before a switched-off part rides along again


def trie_size(sequences, depth):
    """Candidates in the trie of `sequences` cut at `depth` (shared prefixes count once)."""
    return len({tuple(seq[:d]) for seq in sequences for d in range(1, min(depth, len(seq)) + 1)})


def measured_cost(model, window, ngram_size, max_ngrams, batch_size=1):
    """The target's cost curve for tree passes up to the largest a lookahead pass can be (of a
    batch of batch_size rows), timed here and now, and extended by its slope past half the context."""
    largest_pass, prefix = (window + max_ngrams) * (ngram_size - 1) + 1, profile_prefix(model)
    curve = cost_curve(model, min(largest_pass, prefix), prefix, repeats=5, tree=True, batch_size=batch_size)[0]
    return extended(curve, largest_pass)


class Lookahead(Proposer):
    def __init__(self, window=WINDOW, ngram_size=NGRAM_SIZE, max_ngrams=MAX_NGRAMS,
                 pool_from_prompt=False, cost=None):
        """cost: None carries the whole window and all G n-grams in every pass (the paper's fixed
        sizes); the target's cost curve [r(1), r(2), ...] (measured_cost, at least
        max_candidates + 1 long) sizes each pass (see the module's docstring)."""
        if ngram_size < 2:
            raise ValueError("lookahead needs n-grams of at least 2 tokens (N = 2 is Jacobi decoding with a pool)")
        self.window, self.max_ngrams = window, max_ngrams
        self.pool_from_prompt = pool_from_prompt
        self.levels = ngram_size - 1
        self.mask = lookahead_mask(window, self.levels)
        self.offsets = [1 + col + level for level in range(self.levels) for col in range(window)]
        self.max_candidates = (max_ngrams + window) * self.levels
        if cost is not None and len(cost) <= self.max_candidates:
            raise ValueError(f"the cost curve must cover passes of up to {self.max_candidates + 1} tokens")
        self.cost = cost
        # what the sizing has learnt, kept from one generation to the next (the same target)
        self.reach = ReachTally(self.levels)
        self.window_earned = self.window_passes = 0
        self.round, self.next_probe, self.probe_gap = 0, FIRST_PROBE, FIRST_PROBE

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
        depth, self.rides = self.size([g for g, _ in grams], window_fits) if self.cost else (self.levels, window_fits)
        self.offered = [(gram[:depth], source) for gram, source in grams] if depth else []
        candidates = Candidates.from_sequences([gram for gram, _ in self.offered])
        if self.rides:
            side_tokens = [t for level in self.grid for t in level]
            candidates.side = SideBranch(side_tokens, self.offsets, self.mask)
        self.n_candidates = len(candidates)
        return candidates

    def size(self, grams, window_fits):
        """(verification depth, whether the window rides) with the most expected new tokens per unit
        of pass cost; now and then the largest pass instead, to keep the estimates honest."""
        window_gain = ((self.window_earned + WINDOW_PRIOR * WINDOW_PRIOR_WEIGHT)
                       / (self.window_passes + WINDOW_PRIOR_WEIGHT))
        rides = (False, True) if window_fits else (False,)
        options = [(depth, ride) for depth in range(max(map(len, grams), default=0) + 1) for ride in rides]

        def tokens_per_cost(option):
            depth, ride = option
            size = 1 + trie_size(grams, depth) + (len(self.offsets) if ride else 0)
            return (1 + self.reach.expected(depth) + (window_gain if ride else 0)) / self.cost[size - 1]

        best, largest = max(options, key=tokens_per_cost), options[-1]
        self.round += 1
        if best != largest and self.round >= self.next_probe:
            self.probe_gap = min(2 * self.probe_gap, MAX_PROBE_GAP)
            self.next_probe = self.round + self.probe_gap
            return largest
        return best

    def update(self, tokens, verdict, logits, hidden):
        offered, rides = self.offered, self.rides
        self.offered, self.rides = [], False  # a round without a proposal (before a slide) offers nothing
        accepted = len(verdict.path)
        self.reach.record(max((len(gram) for gram, _ in offered), default=0), accepted)
        if accepted:  # credit the window with the tokens its n-grams brought in
            path = tokens[-1 - accepted:-1]
            source = next(source for gram, source in offered if list(gram[:accepted]) == path)
            self.window_earned += accepted if source == "window" else 0
        if not rides:
            return
        self.window_passes += 1
        side = logits[1 + self.n_candidates:]  # (levels*W, vocab), level-major
        top = side[-self.window:].argmax(-1).tolist()  # after each top-level guess
        for col in range(self.window):
            self.remember([level[col] for level in self.grid] + [top[col]], "window")
        self.grid = self.grid[1:] + [top]
