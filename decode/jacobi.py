"""Jacobi decoding (Santilli et al. 2023), the baseline of lookahead decoding.

Guess a block of m future tokens; the target runs once over the root and the guesses, which
predicts the token after each of them; the verifier keeps the guesses that already equal the
target's own prediction (the prefix that has reached its fixed point) and adds the target's next
token, so every pass yields at least one token. The predictions beyond the accepted point become
the next round's guesses: each Jacobi iteration refines the whole block at once.
"""
import torch

from decode.proposer import Proposer
from decode.tree import Candidates

DEFAULT_WINDOW = 5  # guesses per pass


def random_context_tokens(tokens, count, generator):
    """`count` tokens drawn from the text so far: guesses that at least speak its vocabulary."""
    picks = torch.randint(len(tokens), (count,), generator=generator).tolist()
    return [tokens[i] for i in picks]


class Jacobi(Proposer):
    def __init__(self, window=DEFAULT_WINDOW):
        self.window = self.max_candidates = window

    def start(self, prompt):
        self.rng = torch.Generator().manual_seed(0)  # padding guesses; not the sampling generator
        self.guesses, self.proposed = [], 0

    def propose(self, tokens, max_depth, sampling, generator):
        missing = self.window - len(self.guesses)
        self.guesses += random_context_tokens(tokens, missing, self.rng) if missing > 0 else []
        guesses = self.guesses[:min(self.window, max_depth)]
        self.proposed = len(guesses)
        return Candidates.chain(guesses)

    def update(self, tokens, verdict, logits, hidden):
        if not self.proposed:  # a held round guessed nothing: nothing to refine
            self.guesses = []
            return
        predictions = logits[:1 + self.proposed].argmax(-1).tolist()  # after the root and each guess
        # prediction i follows guess i; those after the accepted prefix and the new token are next
        self.guesses = predictions[len(verdict.path) + 1:]
        self.proposed = 0
