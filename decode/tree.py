"""Candidate token trees: what a speculative method proposes and the target checks in one pass.

A chain of k draft tokens is a tree with one child per node; Medusa and lookahead propose wider
trees. The root is the last accepted token, whose K/V is not yet in the cache; the verify pass runs it
and the candidates together. In `children`, position 0 is the root and candidate i is position i + 1.

    root -- a -- b          tokens  [a, b, c, d]
        \\-- c -- d          parents [-1, 0, -1, 2]    (-1: a child of the root)
"""
from dataclasses import dataclass

import torch


@dataclass
class Candidates:
    tokens: list           # candidate tokens, every parent listed before its children
    parents: list          # each candidate's parent candidate, -1 for the root
    draft_probs: torch.Tensor | None = None  # (n, vocab): the distribution each candidate was drawn
    #                                          from; None when candidates are deterministic guesses

    @classmethod
    def chain(cls, tokens, draft_probs=None):
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    def __len__(self):
        return len(self.tokens)

    def is_chain(self):
        return self.parents == list(range(-1, len(self) - 1))

    def depths(self):
        """Depth of each candidate: 1 for children of the root."""
        depth = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def children(self):
        """children[v] for every pass position v (0 = root): its children as pass positions, in order."""
        kids = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i + 1)
        return kids


def verify_mask(parents, tail=1):
    """Bool (tail+n, tail+n) mask of a verify pass [tail..., candidates...]. The tail is the run of
    accepted tokens not yet in the cache, ending with the root (usually the root alone; the whole
    prompt on the first pass): it is causal. Each candidate sees the whole tail and its own
    ancestors, so it sees exactly its root-to-node path."""
    n = len(parents)
    mask = torch.ones(tail + n, tail + n, dtype=torch.bool).tril()
    mask[tail:, tail:] = False
    for i, p in enumerate(parents):
        row = tail + i
        if p >= 0:
            mask[row, tail:] = mask[tail + p, tail:]
        mask[row, row] = True
    return mask
