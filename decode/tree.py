"""Candidate token trees: what a speculative method proposes and the target checks in one pass.

A chain of k draft tokens is a tree with one child per node; Medusa and lookahead propose wider
trees. The root is the last accepted token, whose K/V is not yet in the cache; the verify pass runs it
and the candidates together. In `children`, position 0 is the root and candidate i is position i + 1.

    root -- a -- b          tokens  [a, b, c, d]
        \\-- c -- d          parents [-1, 0, -1, 2]    (-1: a child of the root)
"""
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SideBranch:
    """Tokens that ride along in the verify pass without being candidates: lookahead decoding's
    Jacobi window. They see the committed context and the root, never the candidates (nor the
    candidates them); among themselves they see what `mask` allows. Their K/V is never committed;
    the proposer reads their outputs from the pass's hidden states."""
    tokens: list
    offsets: list          # position of each token relative to the root's (>= 1)
    mask: torch.Tensor     # bool (m, m) among the side tokens


@dataclass
class Candidates:
    tokens: list           # candidate tokens, every parent listed before its children
    parents: list          # each candidate's parent candidate, -1 for the root
    draft_probs: torch.Tensor | None = None  # (n, vocab): the distribution each candidate was drawn
    #                                          from; None when candidates are deterministic guesses
    side: SideBranch | None = None

    @classmethod
    def chain(cls, tokens, draft_probs=None):
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    @classmethod
    def from_sequences(cls, sequences):
        """Deterministic guesses as a trie under the root: shared prefixes become shared nodes."""
        tokens, parents, children = [], [], {}  # children[(parent, token)] = node
        for seq in sequences:
            node = -1
            for token in seq:
                if (node, token) not in children:
                    children[(node, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = children[(node, token)]
        return cls(tokens, parents)

    def __len__(self):
        return len(self.tokens)

    def checked_size(self):
        """The tokens a verify pass checks or carries for these candidates: the root, the candidates,
        the side branch (not the uncached tail before the root)."""
        return 1 + len(self) + (len(self.side.tokens) if self.side else 0)

    def is_chain(self):
        return self.parents == list(range(-1, len(self) - 1)) and self.side is None

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
    mask = np.tri(tail + len(parents), dtype=bool)  # numpy, not torch (docs/2026-12-06-epyc-t.md)
    mask[tail:, tail:] = False
    for i, p in enumerate(parents):
        row = tail + i
        if p >= 0:
            mask[row, tail:] = mask[tail + p, tail:]
        mask[row, row] = True
    return torch.from_numpy(mask)


def pass_mask(candidates, tail):
    """verify_mask, widened by the side branch: it sees the tail (root included) and itself only."""
    mask = verify_mask(candidates.parents, tail)
    if candidates.side is None:
        return mask
    m, width = len(candidates.side.tokens), tail + len(candidates)
    full = np.zeros((width + m, width + m), dtype=bool)
    full[:width, :width] = mask.numpy()
    full[width:, :tail] = True
    full[width:, width:] = candidates.side.mask.numpy()
    return torch.from_numpy(full)


def padded_pass(passes, device):
    """The inputs of one forward over batch rows that pass different tokens: tokens (B, n), positions
    (B, n) and a bool mask (B, n, n) among them, every row padded to the longest pass. passes: per
    row (tokens, positions, bool mask among its tokens). A padding token sees only itself, and no
    commit keeps it."""
    n = max(len(tokens) for tokens, _, _ in passes)
    idx = torch.zeros(len(passes), n, dtype=torch.long)
    pos = torch.zeros(len(passes), n, dtype=torch.long)
    mask = torch.eye(n, dtype=torch.bool).repeat(len(passes), 1, 1)  # (B, n, n)
    for b, (tokens, positions, row_mask) in enumerate(passes):
        idx[b, :len(tokens)] = torch.tensor(tokens)
        pos[b, :len(tokens)] = torch.tensor(positions)
        mask[b, :len(tokens), :len(tokens)] = row_mask
    return idx.to(device), pos.to(device), mask.to(device)
