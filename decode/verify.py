"""The one verifier every speculative method shares.

Given the target's distributions at the root and at every candidate (one verify pass), pick the
accepted root-to-node path and the token after it, so that the output is exactly what plain
decoding would produce: the same tokens (greedy), or the same distribution (sampling).

Sampling uses recursive rejection (SpecInfer; for a chain it is Leviathan et al.'s rule). At a node
with target distribution p, try its children x in turn, each drawn from a draft distribution q:
accept x with probability min(1, p(x) / q(x)); after a rejection replace p by
normalize(max(0, p - q)) and try the next child. If none survives, draw from what is left of p;
if every candidate on the path survives, draw a bonus token from p at its end. For a deterministic
candidate q is one-hot, so it is accepted with probability p(x), and a rejection zeroes p(x).
Why it is exact: P(emit x) = min(p(x), q(x)) + (1 - sum min(p, q)) * residual(x) = p(x).
"""
from dataclasses import dataclass

import torch

from decode.sampling import token_probs


@dataclass
class Verdict:
    path: list        # accepted candidates, as pass positions (1..n), root to leaf
    next_token: int   # the target's own token after the path: a correction or a bonus
    judged: int       # candidates the verifier accepted or rejected (for alpha)
    corrected: bool   # True if next_token replaces a rejected candidate, False if it is a bonus


def walk(candidates, rule_at):
    """The verifier's walk down the candidate tree, shared by every accept rule. At node v (0 = the
    root) rule_at(v) gives (accept, after): accept(child) judges one child, tried in order until one
    is accepted and the walk moves to it; when none is, after() is the token that follows v."""
    children = candidates.children()
    path, node, judged = [], 0, 0
    while True:
        accept, after = rule_at(node)
        for child in children[node]:
            judged += 1
            if accept(child):
                path.append(child)
                node = child
                break
        else:
            return Verdict(path, after(), judged, corrected=bool(children[node]))


def verify_greedy(logits, candidates):
    """The longest path whose every token is the target's argmax at its parent, then the argmax
    after it. logits: (n+1, vocab) at [root, candidates...]."""
    best = logits.argmax(-1).tolist()
    return walk(candidates, lambda node: (lambda child: candidates.tokens[child - 1] == best[node],
                                          lambda: best[node]))


def residual(p, q):
    """What is left of p after a rejected draw from q: normalize(max(0, p - q))."""
    left = (p - q).clamp_min(0)
    total = left.sum()
    return left / total if total > 0 else p  # total is 0 only if p == q, where nothing is ever rejected


def guess_distribution(candidates, child, p):
    """q, the distribution the guess at `child` was drawn from, like p: the drafter's, or one-hot on
    the guess for a deterministic one."""
    if candidates.draft_probs is None:
        q = torch.zeros_like(p)
        q[candidates.tokens[child - 1]] = 1.0
        return q
    return candidates.draft_probs[child - 1].to(p.dtype)


def verify_sampling(probs, candidates, generator=None):
    """Recursive rejection sampling. probs: (n+1, vocab), the processed target distribution
    (temperature, top-k, top-p already applied) at [root, candidates...]."""

    def rule_at(node):
        p = probs[node]  # what is left of the target's distribution after the children rejected so far

        def accept(child):
            nonlocal p
            x, q = candidates.tokens[child - 1], guess_distribution(candidates, child, p)
            if torch.rand((), generator=generator, dtype=p.dtype) * q[x] < p[x]:  # prob min(1, p/q)
                return True
            p = residual(p, q)
            return False

        return accept, lambda: int(torch.multinomial(p, 1, generator=generator))

    return walk(candidates, rule_at)


def verify(logits, candidates, sampling, generator=None, rule=None):
    """The verdict on one pass, logits (n+1, vocab) at [root, candidates...]: a method's own lossy
    `rule` if it declares one (Medusa's typical acceptance), else the exact verifier."""
    if rule:
        return rule(logits, candidates, sampling, generator)
    if sampling.greedy:
        return verify_greedy(logits, candidates)
    return verify_sampling(token_probs(logits, sampling), candidates, generator)
