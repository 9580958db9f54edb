"""EAGLE (Li et al. 2024) and EAGLE-2's dynamic tree: drafting with the target's own features.

The head (model/eagle.py) keeps a KV cache of its own, one entry per token the target has
committed: entry j reads the target's feature f_j and the token x_{j+1} that followed. Each round:

  1. catch up: the head reads the pairs the last verify pass made known (the accepted tokens'
     features, from the pass's hidden states, and the tokens after them) in one forward; its last
     output is the predicted feature after the newest token, and its logits the guesses at the
     token after that: the children of the root;
  2. expand, depth by depth: the `width` likeliest nodes of the newest depth (by their value, the
     chance that their whole path is accepted: EAGLE-2's confidence, the product of the head's
     probabilities along the path, here each calibrated against the verdicts seen so far) each run
     through the head at once, fed their parent's predicted feature and their own token, under a
     tree mask over the head's scratch; each gives `width` children;
  3. rerank: the nodes of highest value, parents before children, go to ONE target pass;
  4. after the verdict the head rolls its scratch back, and catch-up of the next round replaces
     the predicted features of the accepted tokens by the target's real ones.

    root ── a (0.7) ── c (0.49)        width 2, depth 2 (a's second child left out); the 3 best
        └── b (0.2) ── d (0.10)        nodes are a, c and b: a tree of 3 candidates, expected
                   └── e (0.06)        0.7 + 0.49 + 0.2 accepted

A chain is the tree of width 1. Tree nodes are the head's top choices, deterministic guesses, so
the shared verifier checks them exactly at any temperature (rejection with a one-hot q: accept x
with probability p(x), then take x out of p). A chain at temperature > 0 instead samples each
guess from the head's processed distribution q and carries q, as a draft model does. Sampled
children must not be pruned by what was drawn, which is why the tree does not sample.

Sizing ("auto"): how deep to expand and how many of the nodes to propose, or none, from this
machine's measured costs (decode/sizing.py TreeSizing).
"""
import heapq
import time
from dataclasses import dataclass

import numpy as np
import torch

from decode.cost import median_seconds
from decode.proposer import Proposer
from decode.sampling import token_probs
from decode.sizing import TreeSizing
from decode.tree import Candidates

DEFAULT = "tree:auto"
TREE_WIDTH = 4        # nodes expanded per depth and children per node (EAGLE-2's top-k)
MAX_DEPTH = 6         # a tree's depth, and its head forwards after the catch-up, at most
MAX_AUTO_NODES = 24   # the largest sized tree
MAX_CHAIN, MAX_TREE = 16, 64
CALIBRATION_BINS, CALIBRATION_WEIGHT = 5, 2


def parse_shape(value):
    shape, _, size = value.partition(":")
    largest = {"chain": MAX_CHAIN, "tree": MAX_TREE}.get(shape)
    if largest is None or not (size == "auto" or size.isdigit() and 1 <= int(size) <= largest):
        raise ValueError(f"takes chain:K (K from 1 to {MAX_CHAIN}), tree:N (N from 1 to {MAX_TREE}), "
                         f"chain:auto or tree:auto; got {value!r}")
    return shape, size if size == "auto" else int(size)


@dataclass
class Node:
    """A drafted token of the tree."""
    token: int
    parent: int     # its parent's index among the tree's nodes, -1: the root
    rank: int       # among its siblings: 0 is the head's likeliest
    p: float        # the head's probability for it
    value: float    # the calibrated chance that its whole path is accepted
    depth: int
    slot: int = -1  # its entry in the head's scratch, once expanded


class Eagle(Proposer):
    """head: an EagleHead (or anything with its new_cache and forward); shape: "chain" or "tree";
    size: guesses (chain) or nodes (tree) per round, or "auto"; ranks: the head's measured
    accuracy at each sibling rank (saved with it), the calibration's prior; costs: this machine's
    Costs, needed by "auto"."""

    def __init__(self, head, shape="tree", size="auto", costs=None, ranks=None):
        self.head = head
        self.width = 1 if shape == "chain" else TREE_WIDTH
        auto = size == "auto"
        self.depth = MAX_DEPTH if auto else min(size, MAX_DEPTH) if shape == "tree" else size
        self.max_candidates = (MAX_DEPTH if shape == "chain" else MAX_AUTO_NODES) if auto else size
        # what drafting and sizing learn, kept from one generation to the next (the same head)
        self.calibration = Calibration(ranks)
        self.sizing = TreeSizing(costs) if auto else None
        self.cache = head.new_cache(scratch=self.width * self.depth)

    def start(self, prompt):
        self.cache.rollback(0)
        self.fed = None        # the head has read, or holds pending, the pairs of its window up to tokens[fed]
        self.pending = []      # pairs known but not read yet: chunks of (features (m, C), the m tokens after them)
        self.forwards = 0
        self.judging = None    # (Node, parent) of each candidate proposed this round

    def propose(self, tokens, max_depth, sampling, generator):
        if self.fed is None or self.sizing and self.sizing.sits_out():
            return None
        root = self._catch_up()
        started = time.perf_counter()  # the expansions: the catch-up's size varies with the rounds sat out
        tree, draws, expansions = self._draft(*root, min(self.depth, max_depth), sampling, generator)
        self.forwards += expansions
        if self.sizing and expansions:  # c as this loop pays it
            self.sizing.timed(time.perf_counter() - started, expansions)
        chosen = self._choose(tree, 1 + expansions)
        if not chosen:
            return None
        index = {v: i for i, v in enumerate(chosen)}
        parents = [index.get(tree[v].parent, -1) for v in chosen]
        self.judging = [(tree[v], parent) for v, parent in zip(chosen, parents)]
        return Candidates([tree[v].token for v in chosen], parents, torch.stack(draws[:len(chosen)]) if draws else None)

    def update(self, tokens, verdict, logits, hidden):
        """hidden: (tail + n, C), every row of the pass: the uncached tail ending with the root,
        then the candidates. The rows of the tail and of the accepted path are the features of the
        tokens the target has just committed; each pairs with the token after it."""
        # a held round must cost ~nothing: shapes (len() of a tensor takes 3x as long), and its pass
        # was the tail alone, so hidden is its features as they are (docs/2026-12-06-epyc-ab.md)
        tail = hidden.shape[0] - logits.shape[0] + 1
        if verdict.path:
            features = hidden[[*range(tail), *(tail - 1 + c for c in verdict.path)]]
        else:
            features = hidden if tail == hidden.shape[0] else hidden[:tail]
        first = len(tokens) - 1 - tail - len(verdict.path)  # the first of those tokens
        if first != self.fed:  # the target re-read its window after a slide: so does the head
            self.cache.rollback(0)
            self.pending = []
        self.pending.append((features, tokens[first + 1:]))
        self.fed = len(tokens) - 1
        if self.judging is not None:  # each candidate whose parent held was judged on its own
            held = {0, *verdict.path}  # pass positions: the root, then candidate i at i + 1
            for i, (node, parent) in enumerate(self.judging):
                if parent + 1 in held:
                    self.calibration.record(node.rank, node.p, i + 1 in held)
            self.judging = None

    def _catch_up(self):
        """Read the pending pairs; (predicted feature, logits) after the newest token."""
        features = torch.cat([f for f, _ in self.pending])[None]  # (1, m, C)
        tokens = torch.tensor([[t for _, chunk in self.pending for t in chunk]], device=features.device)
        out, logits = self.head(features, tokens, self.cache)
        self.cache.commit()
        self.pending = []
        self.forwards += 1
        return out[0, -1], logits[0, -1]

    def _draft(self, root_feature, root_logits, depth_limit, sampling, generator):
        """The tree, depth by depth: (its nodes in drafting order, a sampled chain's q per guess,
        the head forwards of its expansions)."""
        committed = self.cache.length
        tree, draws, expansions = [], [], 0
        frontier = [-1]  # nodes whose children come next (-1: the root)
        features, logits = {-1: root_feature}, root_logits[None]  # node -> (C,); (len(frontier), V)
        for depth in range(1, depth_limit + 1):
            probs = token_probs(logits, sampling) if not sampling.greedy else torch.softmax(logits.float(), -1)
            if not sampling.greedy and self.width == 1:
                children = torch.multinomial(probs, 1, generator=generator)  # (1, 1)
                draws.append(probs[0])
            else:
                children = probs.topk(self.width, dim=-1).indices  # (frontier, width), likeliest first
            for parent, tokens, ps in zip(frontier, children.tolist(), probs.gather(-1, children).tolist()):
                for rank, (token, p) in enumerate(zip(tokens, ps)):
                    value = (tree[parent].value if parent >= 0 else 1.0) * self.calibration(rank, p)
                    tree.append(Node(token, parent, rank, p, value, depth))
            newest = range(len(tree) - len(frontier) * children.size(1), len(tree))
            expand = sorted(newest, key=lambda v: -tree[v].value)[:self.width]
            if (depth == depth_limit or len(tree) >= self.max_candidates and heapq.nlargest(
                    self.max_candidates, (node.value for node in tree))[-1] >= tree[expand[0]].value):
                break  # the deepest allowed, or no deeper node could make the tree (it is worth less)
            if self.sizing and sum(tree[v].value for v in expand) < self.sizing.c:
                break  # the best of this depth cannot repay a head forward
            features, logits = self._expand(tree, expand, features, committed)
            frontier = expand
            expansions += 1
        self.cache.rollback(committed)
        return tree, draws, expansions

    def _expand(self, tree, nodes, features, committed):
        """Run the head on `nodes`, each fed its parent's predicted feature (features: node -> (C,))
        and its own token, seeing the `committed` context and its ancestors' scratch entries:
        their predicted features (node -> (C,)) and logits (len(nodes), V)."""
        inputs = torch.stack([features[tree[v].parent] for v in nodes])[None]  # (1, n, C)
        tokens = torch.tensor([[tree[v].token for v in nodes]], device=inputs.device)
        start, n = self.cache.length, len(nodes)
        mask = np.zeros((n, start + n), dtype=bool)  # numpy (docs/2026-12-06-epyc-t.md)
        mask[:, :committed] = True
        for i, v in enumerate(nodes):
            tree[v].slot = start + i
            ancestor = tree[v].parent
            while ancestor >= 0:
                mask[i, tree[ancestor].slot] = True
                ancestor = tree[ancestor].parent
            mask[i, start + i] = True
        out, logits = self.head(inputs, tokens, self.cache, torch.from_numpy(mask).to(inputs.device))
        self.cache.commit()  # kept until the round's rollback, for the next depth to attend to
        return dict(zip(nodes, out[0])), logits[0]

    def _choose(self, tree, forwards):
        """The candidates, as node indices in drafting order (parents before children): the
        max_candidates of highest value, or, sized, as many of them as pay best after `forwards`
        head forwards, which may be none. Ties go to the shallower node, so a parent is always
        chosen before its child (a child's value is at most its parent's)."""
        ranked = sorted(range(len(tree)), key=lambda v: (-tree[v].value, tree[v].depth))[:self.max_candidates]
        n = self.sizing.count([tree[v].value for v in ranked], forwards) if self.sizing else len(ranked)
        return sorted(ranked[:n])


class Calibration:
    """P(a drafted node is accepted | its parent was), by its rank among its siblings and the head's
    probability for it (CALIBRATION_BINS bins per rank), counted from the verdicts. The head learnt
    the target's distribution: how often the target would SAMPLE a token, not how often it is the
    argmax; on a flat distribution a top guess of probability 0.2 may be the argmax most of the
    time, a second guess of the same probability far less often. Before any verdict a cell assumes
    ranks[rank] (how often the target's argmax was the head's (rank+1)-th choice on val), or its
    probability where none was measured, worth CALIBRATION_WEIGHT nodes."""

    def __init__(self, ranks=None):
        self.ranks = ranks
        self.hits, self.tries = ([[0.0] * CALIBRATION_BINS for _ in range(TREE_WIDTH)] for _ in range(2))

    def _bin(self, p):
        return min(int(p * CALIBRATION_BINS), CALIBRATION_BINS - 1)

    def __call__(self, rank, p):
        b = self._bin(p)
        prior = self.ranks[rank] if self.ranks else (b + 0.5) / CALIBRATION_BINS
        return (self.hits[rank][b] + CALIBRATION_WEIGHT * prior) / (self.tries[rank][b] + CALIBRATION_WEIGHT)

    def record(self, rank, p, accepted):
        b = self._bin(p)
        self.tries[rank][b] += 1
        self.hits[rank][b] += accepted


@torch.inference_mode()
def head_seconds(head, vocab_size, prefix, width=TREE_WIDTH):
    """Median wall time of one head forward of `width` nodes (a tree's expansion; 1 for a chain's)
    after `prefix` cached pairs."""
    cache = head.new_cache(scratch=width)
    gen = torch.Generator().manual_seed(0)
    device, dtype = head.fuse.weight.device, head.fuse.weight.dtype

    def inputs(n):
        features = torch.randn(1, n, head.config.n_embd, generator=gen).to(device=device, dtype=dtype)
        return features, torch.randint(vocab_size, (1, n), generator=gen).to(device)
    head(*inputs(prefix), cache)
    cache.commit()
    features, tokens = inputs(width)

    def expand():
        head(features, tokens, cache)
        cache.rollback(prefix)
    return median_seconds(expand, device)
