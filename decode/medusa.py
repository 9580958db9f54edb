"""Medusa (Cai et al. 2024): the target guesses its own future with extra heads, no draft model.

Every verify pass leaves the target's final hidden state at the last accepted position; the
target's lm_head reads the next token from it (the root of the next round) and Medusa head j reads
a guess at the token j+1 places beyond that (model/medusa.py). Next round the proposer turns the
heads' top choices into a tree of candidates and the shared verifier checks them all in one pass,
so speculation costs no forward of the target or of a draft model, only the heads' own on one
hidden state a round; the first round, before any pass, proposes nothing.

The tree is a fixed set of paths of choices: (i_1, ..., i_d) is head 0's i_1-th likeliest token
(0 = top), then head 1's i_2-th, ..., head d-1's i_d-th. Which paths to include is decided once,
from each head's measured top-i accuracy (build_tree); "chain" is the top-1 of every head.

    paths [(0,), (1,), (0, 0)]      root -- head 0's top-1 -- head 1's top-1
                                        \\-- head 0's top-2

Candidates are deterministic, so the shared verifier keeps the output exact (greedy: identical
tokens; sampling: one-hot q, i.e. multi-candidate rejection). Typical acceptance, Medusa's faster
and lossy rule, is here as an opt-in alternative verifier (verify_typical).
"""
import heapq
import math

import torch

from decode.cost import median_seconds
from decode.proposer import Proposer
from decode.sampling import token_probs
from decode.tree import Candidates
from decode.verify import walk

DEFAULT_TREE = "saved"   # the tree chosen at training time from the heads' measured accuracies
DEFAULT_TREE_SIZE = 4    # candidates in that tree (docs/2026-12-02-2core-a.md)
TYPICAL = (0.09, 0.3)    # typical acceptance's epsilon and delta, as in the Medusa reference code


def build_tree(accuracies, budget):
    """The `budget` paths that maximise the expected number of accepted candidates per round.

    accuracies[d][i]: measured probability that head d's (i+1)-th likeliest token is the right one.
    Treating heads as independent, path (i_1, ..., i_d) is accepted with probability
    accuracies[0][i_1] * ... * accuracies[d-1][i_d], and a tree's expected accepted length is the
    sum of that over its paths. A path needs its parent (i_1, ..., i_{d-1}) in the tree, and never
    beats it, so adding the best path whose parent is in, `budget` times, is optimal (Medusa's
    greedy construction). Returned parents first: sorted by (length, path).

    Example: accuracies [[0.6, 0.2], [0.5, 0.1]] give the values (0,) 0.6, (0, 0) 0.3, (1,) 0.2, ..., so
        build_tree([[0.6, 0.2], [0.5, 0.1]], 3) == [(0,), (1,), (0, 0)]   # expected length 1.1
    """
    frontier = [(-acc, (i,)) for i, acc in enumerate(accuracies[0])]  # (-value, path): a max-heap
    heapq.heapify(frontier)
    tree = []
    while frontier and len(tree) < budget:
        neg_value, path = heapq.heappop(frontier)  # ties go to the lexicographically first path
        tree.append(path)
        if len(path) < len(accuracies):
            for i, acc in enumerate(accuracies[len(path)]):
                heapq.heappush(frontier, (neg_value * acc, path + (i,)))
    return sorted(tree, key=lambda p: (len(p), p))


def expected_length(accuracies, paths):
    """Expected accepted candidates per round of the tree `paths` (the sum of its path values)."""
    return sum(math.prod(accuracies[d][i] for d, i in enumerate(path)) for path in paths)


def chain_tree(depth):
    """Top-1 of heads 0..depth-1 as one chain: [(0,), (0, 0), ...]."""
    return [(0,) * d for d in range(1, depth + 1)]


def tree_parents(paths):
    """Each path's parent as an index into `paths` (-1 for the root), for decode.tree.Candidates."""
    index = {path: i for i, path in enumerate(paths)}
    return [index[path[:-1]] if len(path) > 1 else -1 for path in paths]


def verify_typical(probs, candidates, epsilon=TYPICAL[0], delta=TYPICAL[1], generator=None):
    """Medusa's typical acceptance: a lossy verifier, faster at high temperature.

    At a node whose target distribution is p, accept the first child whose token x has
    p(x) > min(epsilon, delta * exp(-H(p))); if none does, draw the next token from p; after a fully
    accepted path, draw a bonus token from p. A confident p (low entropy) demands a likely token,
    a flat p accepts anything not too unlikely. Unlike rejection sampling this is NOT exact: a
    candidate that passes is always taken, so the heads' favourite tokens come out more often than
    p says. At temperature 0 p is one-hot and the rule is the greedy verifier exactly.
    probs: (n+1, vocab), the processed target distributions at [root, candidates...]."""

    def rule_at(node):
        p = probs[node]
        threshold = min(epsilon, delta * math.exp(-float(torch.special.entr(p).sum())))
        return (lambda child: bool(p[candidates.tokens[child - 1]] > threshold),
                lambda: int(torch.multinomial(p, 1, generator=generator)))

    return walk(candidates, rule_at)


class Medusa(Proposer):
    """heads: MedusaHeads (or anything with an `n_heads` attribute and a `decoder()` that returns a
    function from one hidden state (C,) to the heads' logits (K, V)), used as they are now;
    tree_paths: "chain" or a list of paths (build_tree); typical: None for the exact shared
    verifier, or (epsilon, delta) for typical acceptance, which then replaces it (`verify`)."""

    def __init__(self, heads, tree_paths="chain", typical=None):
        paths = chain_tree(heads.n_heads) if tree_paths == "chain" else [tuple(p) for p in tree_paths]
        paths = sorted(paths, key=lambda p: (len(p), p))
        if not paths or len(set(paths)) < len(paths) or any(len(p) > heads.n_heads for p in paths):
            raise ValueError(f"a tree needs distinct paths of 1 to {heads.n_heads} choices (one per head)")
        if any(len(p) > 1 and p[:-1] not in set(paths) for p in paths):
            raise ValueError("every path's parent must be in the tree")
        self.paths, self.parents = paths, tree_parents(paths)
        self.head_logits = heads.decoder()
        self.max_candidates = len(paths)
        self.width = 1 + max(i for p in paths for i in p)  # how many top tokens of a head the tree uses
        # n_within[d]: how many paths are at most d deep; sorted by length, they are a prefix of the list
        self.n_within = [sum(len(p) <= d for p in paths) for d in range(len(paths[-1]) + 1)]
        if typical is not None:
            self.verify = lambda logits, candidates, sampling, generator: verify_typical(
                token_probs(logits, sampling), candidates, *typical, generator)

    def start(self, prompt):
        self.last_pass = None  # (hidden states, logits, accepted path) of the target's last pass
        self.forwards = 0

    def propose(self, tokens, max_depth, sampling, generator):
        if self.last_pass is None:  # the first round: no pass has run yet
            return None
        hidden, pass_logits, path = self.last_pass
        predicted_last = hidden.shape[0] - pass_logits.shape[0] + (path[-1] if path else 0)
        n = self.n_within[min(max_depth, len(self.n_within) - 1)]
        # ranked by raw logits also when sampling: temperature, top-k and top-p never reorder tokens
        logits = self.head_logits(hidden[predicted_last])  # (K, V)
        self.forwards += 1
        ranked = logits.topk(self.width, dim=-1).indices.tolist()  # (K, width): likeliest first
        return Candidates([ranked[len(p) - 1][p[-1]] for p in self.paths[:n]], self.parents[:n])

    def update(self, tokens, verdict, logits, hidden):
        self.last_pass = hidden, logits, verdict.path  # read only if a round proposes: a held round costs nothing


@torch.inference_mode()
def heads_seconds(heads):
    """Median wall time of the heads' forward on one hidden state, as a round's proposal runs it."""
    weight = heads.blocks[0].linear.weight
    hidden = torch.randn(weight.size(1), generator=torch.Generator().manual_seed(0)).to(weight)
    decoder = heads.decoder()
    return median_seconds(lambda: decoder(hidden), weight.device)
