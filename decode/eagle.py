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

Sizing ("auto"), from the target's tree-pass cost curve r(n) and the head's cost per forward c, both
in target steps: a depth is expanded only while the best nodes of the last one could repay a head
forward, and the tree keeps the n best nodes that maximise

    (1 + sum of their values) / (r(n + 1) + head forwards * c),

where n = 0 may win: the round then proposes nothing. When the recent rounds' predictions (a
running mean) fall below 1, the proposer stops drafting, and catching up, and tries again after 4
rounds, then 8, ... at most 64: where nothing pays, the loop is plain decoding. c is the head
forward's cost as the loop pays it: timed alone at start-up, then scaled by the proposer's own
timing of its expansions. A probe proposes at least one node: verdicts are what calibrate.
"""
import heapq
import time

import numpy as np
import torch

from decode.cost import cost_curve, extended, median_seconds, profile_prefix
from decode.proposer import Proposer
from decode.sampling import token_probs
from decode.tree import Candidates

DEFAULT = "tree:auto"
TREE_WIDTH = 4        # nodes expanded per depth and children per node (EAGLE-2's top-k)
MAX_DEPTH = 6         # a tree's depth, and its head forwards after the catch-up, at most
MAX_AUTO_NODES = 24   # the largest sized tree
MAX_CHAIN, MAX_TREE = 16, 64
CALIBRATION_BINS, CALIBRATION_WEIGHT = 5, 2
OUTLOOK_DECAY = 0.2                    # weight of the newest round in the running outlook
FIRST_PROBE, MAX_PROBE_GAP = 4, 64     # rounds before drafting is tried again after switching off


def parse_shape(value):
    """(shape, size) from "chain:K", "chain:auto", "tree:N" or "tree:auto"."""
    shape, _, size = value.partition(":")
    largest = {"chain": MAX_CHAIN, "tree": MAX_TREE}.get(shape)
    if largest is None or not (size == "auto" or size.isdigit() and 1 <= int(size) <= largest):
        raise ValueError(f"takes chain:K (K from 1 to {MAX_CHAIN}), tree:N (N from 1 to {MAX_TREE}), "
                         f"chain:auto or tree:auto; got {value!r}")
    return shape, size if size == "auto" else int(size)


class Calibration:
    """P(a drafted node is accepted | its parent was), as a function of its rank among its siblings
    and the head's probability for it, counted from the verdicts in CALIBRATION_BINS bins of that
    probability per rank. The head learnt the target's distribution, which says how often the
    target would SAMPLE a token, not how often it is the target's argmax: on a flat distribution a
    top guess of probability 0.2 may be the argmax most of the time, and a second guess of the same
    probability far less often. Before any verdict a cell assumes the head's measured accuracy at
    that rank (ranks[i]: how often the target's argmax was the head's (i+1)-th choice on val), or
    its probability where none was measured, worth CALIBRATION_WEIGHT nodes."""

    def __init__(self, ranks=None):
        self.ranks = ranks
        self.hits = [[0.0] * CALIBRATION_BINS for _ in range(TREE_WIDTH)]
        self.tries = [[0.0] * CALIBRATION_BINS for _ in range(TREE_WIDTH)]

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


def measured_costs(target, head, batch_size=1):
    """(r, c, seconds) for sizing: the target's tree-pass cost curve r(1..MAX_AUTO_NODES+1), the
    head's cost per forward in target steps, and that forward's seconds, timed here and now. In a
    batch of B rows r is the batch's curve and c counts B head forwards (one per row) against one
    batched target step."""
    prefix = profile_prefix(target)
    r, step = cost_curve(target, min(MAX_AUTO_NODES + 1, prefix), prefix, tree=True, batch_size=batch_size)
    seconds = head_seconds(head, target.config.vocab_size, prefix)
    return extended(r, MAX_AUTO_NODES + 1), batch_size * seconds / step, seconds


class Eagle(Proposer):
    """The EAGLE proposer for decode.speculative.generate.

    head: an EagleHead (or anything with its new_cache and forward); shape: "chain" or "tree";
    size: guesses (chain) or nodes (tree) per round, or "auto"; ranks: the head's measured
    accuracy at each sibling rank (saved with it), the calibration's prior; costs: (r, c, seconds) of
    measured_costs, needed by "auto". A head forward costs more inside propose than timed alone
    (the tree's bookkeeping around it), so "auto" times its own rounds and scales c to match."""

    def __init__(self, head, shape="tree", size="auto", costs=None, ranks=None):
        self.head = head
        self.width = 1 if shape == "chain" else TREE_WIDTH
        self.sized = size == "auto"
        if self.sized:
            self.r, self.bare_c, self.head_seconds = costs
            self.c = self.bare_c  # corrected as rounds are timed
            self.depth = MAX_DEPTH
            self.max_candidates = MAX_DEPTH if shape == "chain" else MAX_AUTO_NODES
        else:
            self.depth = min(size, MAX_DEPTH) if shape == "tree" else size
            self.max_candidates = size
        # what sizing has learnt, kept from one generation to the next (the same head)
        self.calibration = Calibration(ranks)
        self.probing = False
        self.outlook = 1.0  # recent rounds' predicted tokens per step, optimistic at first
        self.round, self.next_probe, self.probe_gap = 0, 0, FIRST_PROBE

    def start(self, prompt):
        self.cache = self.head.new_cache(scratch=self.width * self.depth)
        self.fed = None        # the head has read, or holds pending, the pairs of its window up to tokens[fed]
        self.pending = []      # pairs known but not read yet: chunks of (features (m, C), the m tokens after them)
        self.forwards = 0
        self.judging = None    # ((rank, head probability), parent) of each candidate proposed this round

    # ---- the head's cache ------------------------------------------------------------------------

    def update(self, tokens, verdict, logits, hidden):
        """hidden: (tail + n, C), every row of the pass: the uncached tail ending with the root,
        then the candidates. The rows of the tail and of the accepted path are the features of the
        tokens the target has just committed; each pairs with the token after it."""
        tail = len(hidden) - len(logits) + 1
        rows = list(range(tail)) + [tail - 1 + c for c in verdict.path]
        first = len(tokens) - 1 - len(rows)  # the first of those tokens
        if first != self.fed:  # the target re-read its window after a slide: so does the head
            self.cache.rollback(0)
            self.pending = []
        self.pending.append((hidden[rows], tokens[first + 1:]))
        self.fed = len(tokens) - 1
        if self.judging is not None:  # each candidate whose parent held was judged on its own
            held = {0, *verdict.path}  # pass positions: the root, then candidate i at i + 1
            for i, ((rank, p), parent) in enumerate(self.judging):
                if parent + 1 in held:
                    self.calibration.record(rank, p, i + 1 in held)
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

    # ---- drafting --------------------------------------------------------------------------------

    def sitting_out(self):
        """True on the rounds a sized proposer skips, while its recent rounds predicted less than a
        plain step's 1 token per step; it probes after 4 such rounds, then 8, ... at most 64. A
        probe proposes its best tree even if none looks worth it: verdicts are what calibrate."""
        self.round += 1
        self.probing = False
        if not self.sized or self.outlook >= 1:
            return False
        if self.round < self.next_probe:
            return True
        self.next_probe = self.round + self.probe_gap
        self.probe_gap = min(2 * self.probe_gap, MAX_PROBE_GAP)
        self.probing = True
        return False

    def propose(self, tokens, max_depth, sampling, generator):
        if self.fed is None or self.sitting_out():
            return None
        root_feature, root_logits = self._catch_up()
        started = time.perf_counter()  # the expansions: the catch-up's size varies with the rounds sat out
        L = self.cache.length
        depth_limit = min(self.depth, max_depth)
        # every node drafted: token, parent node (-1: the root), (rank among its siblings, the head's
        # probability), value (the calibrated chance that its path is accepted), depth, head scratch slot
        tok, parent, prob, value, depth, slot = [], [], [], [], [], []
        draws = []  # a sampled chain's q per guess
        frontier = [-1]  # nodes whose children come next
        features, logits = root_feature[None], root_logits[None]  # (len(frontier), C), (len(frontier), V)
        forwards = 1
        for d in range(1, depth_limit + 1):
            sample = not sampling.greedy and self.width == 1
            probs = token_probs(logits, sampling) if not sampling.greedy else torch.softmax(logits.float(), -1)
            if sample:
                children = torch.multinomial(probs, 1, generator=generator)  # (1, 1)
                draws.append(probs[0])
            else:
                children = probs.topk(self.width, dim=-1).indices  # (frontier, width), likeliest first
            child_p = probs.gather(-1, children)
            for i, node in enumerate(frontier):
                for rank, (x, p) in enumerate(zip(children[i].tolist(), child_p[i].tolist())):
                    tok.append(x)
                    parent.append(node)
                    prob.append((rank, p))
                    value.append((value[node] if node >= 0 else 1.0) * self.calibration(rank, p))
                    depth.append(d)
                    slot.append(-1)
            newest = range(len(tok) - len(frontier) * children.size(1), len(tok))
            expand = sorted(newest, key=lambda v: -value[v])[:self.width]
            if (d == depth_limit or len(value) >= self.max_candidates
                    and heapq.nlargest(self.max_candidates, value)[-1] >= value[expand[0]]):
                break  # the deepest allowed, or no deeper node could make the tree (it is worth less)
            if self.sized and sum(value[v] for v in expand) < self.c:
                break  # the best of this depth cannot repay a head forward
            features, logits = self._expand(expand, features, frontier, parent, tok, slot, L)
            frontier = expand
            forwards += 1
        self.cache.rollback(L)
        self.forwards += forwards - 1
        if self.sized and forwards > 1:  # c as this loop pays it: seconds per expansion, against the bare head's
            paid = (time.perf_counter() - started) / (forwards - 1) / self.head_seconds
            self.c = (1 - OUTLOOK_DECAY) * self.c + OUTLOOK_DECAY * self.bare_c * paid
        chosen = self._choose(value, depth, forwards)
        if not chosen:
            return None
        index = {v: i for i, v in enumerate(chosen)}
        parents = [index.get(parent[v], -1) for v in chosen]
        self.judging = [(prob[v], p) for v, p in zip(chosen, parents)]
        return Candidates([tok[v] for v in chosen], parents,
                          torch.stack(draws[:len(chosen)]) if draws else None)

    def _expand(self, nodes, parent_features, frontier, parent, tok, slot, L):
        """Run the head on `nodes`, each with its parent's predicted feature and its own token,
        seeing the committed context and its ancestors' scratch entries: their (features, logits)."""
        row_of = {node: i for i, node in enumerate(frontier)}  # the parent's row in parent_features
        features = torch.stack([parent_features[row_of[parent[v]]] for v in nodes])[None]  # (1, n, C)
        tokens = torch.tensor([[tok[v] for v in nodes]], device=features.device)
        start, n = self.cache.length, len(nodes)
        mask = np.zeros((n, start + n), dtype=bool)  # numpy: element writes ~20x cheaper than torch's
        mask[:, :L] = True
        for i, v in enumerate(nodes):
            slot[v] = start + i
            ancestor = parent[v]
            while ancestor >= 0:
                mask[i, slot[ancestor]] = True
                ancestor = parent[ancestor]
            mask[i, start + i] = True
        out, logits = self.head(features, tokens, self.cache, torch.from_numpy(mask).to(features.device))
        self.cache.commit()  # kept until the round's rollback, for the next depth to attend to
        return out[0], logits[0]

    def _choose(self, value, depth, forwards):
        """The candidates, as node indices in drafting order (parents before children): the
        max_candidates of highest value, or, sized, the count the cost model prefers, which may
        be none. Ties go to the shallower node, so a parent is always chosen
        before its child (a child's value is at most its parent's)."""
        ranked = sorted(range(len(value)), key=lambda v: (-value[v], depth[v]))
        if not self.sized:
            return sorted(ranked[:self.max_candidates])
        gains = [0.0]
        for v in ranked[:self.max_candidates]:
            gains.append(gains[-1] + value[v])
        rates = [(1 + gain) / (self.r[n] + forwards * self.c) for n, gain in enumerate(gains)]
        best = max(range(1 if self.probing else 0, len(rates)), key=rates.__getitem__)
        self.outlook = (1 - OUTLOOK_DECAY) * self.outlook + OUTLOOK_DECAY * rates[best]
        if self.outlook >= 1:  # should it fall below, the first probe comes FIRST_PROBE rounds later
            self.probe_gap, self.next_probe = FIRST_PROBE, self.round + FIRST_PROBE
        return sorted(ranked[:best])
