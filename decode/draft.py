"""Vanilla draft-model speculation (Leviathan et al. 2023; Chen et al. 2023).

A small draft model with the target's tokenizer guesses k tokens one at a time, sampling each from
its own (processed) distribution q; the target checks all k in one forward and the shared verifier
keeps each guess x with probability min(1, p(x)/q(x)) (greedy: while it equals the target's
argmax). The draft then rolls its cache back to the accepted prefix and, next round, catches up on
the tokens it has not seen (the target's correction or bonus token).

How many guesses per round:
  - a fixed k;
  - "auto": the k that maximises expected tokens per unit of time, E(k) / (r(k+1) + k*c), where
    E(k) = (1 - alpha^(k+1)) / (1 - alpha) for the running acceptance estimate alpha, r is the
    target's verify-pass cost curve and c the draft's step cost, both measured on this machine
    (in a batch: the batch's pass costs, and the draft steps of all its rows); c is timed alone at
    first, then rescaled by the proposer's own timing of its steps, which inside the loop run slower
    than alone (the target's pass has evicted the draft's weights from the cache); k = 0, a plain
    step, when no k is predicted to beat one (probing now and then, ever more rarely);
  - "heuristic": Hugging Face transformers' schedule, k + 2 after a fully accepted round, else k - 1.
"""
import time

import torch

from decode.cost import cost_curve, forward_seconds, profile_prefix
from decode.proposer import Proposer
from decode.sampling import token_probs
from decode.tree import Candidates
from decode.window import ContextWindow

DEFAULT_K = 4               # guesses per round; also where "auto" and "heuristic" start
MAX_K = 16                  # the largest fixed k
AUTO_K_MAX = 8              # the most that "auto" and "heuristic" grow to
ALPHA_PRIOR, PRIOR_WEIGHT = 0.6, 4  # the acceptance assumed before any round is judged
COST_DECAY = 0.2            # the weight of the latest round in the running cost of a draft step
# while auto decodes plainly it guesses anyway after 16 rounds, to measure the acceptance and the
# step cost again, then after twice as many, up to 64: a probe costs a whole round of draft steps
PROBE_ROUNDS, MAX_PROBE_ROUNDS = 16, 64


def expected_tokens(alpha, k):
    """Expected tokens per round with k guesses, each accepted independently with probability alpha."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha, k, r, c):
    """Tokens per unit of time with k guesses, in plain steps: E(k) / (r(k+1) + k*c)."""
    return expected_tokens(alpha, k) / (r[k] + k * c)


def parse_k(value):
    """(k, schedule) from a k setting: a number from 1 to MAX_K, "auto" or "heuristic"."""
    if value in ("auto", "heuristic"):
        return DEFAULT_K, value
    if not value.isdigit() or not 1 <= int(value) <= MAX_K:
        raise ValueError(f"k must be a number from 1 to {MAX_K}, 'auto' or 'heuristic', got {value!r}")
    return int(value), "fixed"


def measured_costs(target, draft, batch_size=1):
    """(r, c, seconds) for "auto": the target's chain-pass cost curve r(1..AUTO_K_MAX+1), the draft's
    step cost c in target steps and that step's seconds, timed here and now. In a batch of B rows r
    is the batch's curve and c counts the B draft steps (one per row) against one batched target step."""
    r, target_step = cost_curve(target, AUTO_K_MAX + 1, profile_prefix(target), batch_size=batch_size)
    seconds = forward_seconds(draft, 1, profile_prefix(draft))
    return r, batch_size * seconds / target_step, seconds


class DraftModel(Proposer):
    def __init__(self, draft, k=DEFAULT_K, schedule="fixed", target=None, costs=None):
        """schedule "auto" needs the costs (r, c, seconds) of measured_costs: given, or measured from `target`."""
        self.draft = draft
        self.schedule = schedule
        self.k_max = k if schedule == "fixed" else AUTO_K_MAX
        self.k_start = k
        self.max_candidates = self.k_max
        if schedule == "auto":  # the cost model of the choice
            self.r, self.bare_c, self.step_seconds = costs or measured_costs(target, draft)
            self.c = self.bare_c  # corrected as the rounds' steps are timed

    def start(self, prompt):
        self.cache = self.draft.new_cache(scratch=1)
        self.context = ContextWindow(self.cache, self.draft.config.block_size)
        self.forwards = 0
        self.k = self.k_start
        self.k_used = 0  # guesses proposed this round
        self.accepted = self.judged = 0
        self.plain_rounds = 0  # since auto last guessed, while it finds that no k pays
        self.probe_after = PROBE_ROUNDS

    def choose_k(self):
        if self.schedule != "auto":
            return self.k
        alpha = (self.accepted + ALPHA_PRIOR * PRIOR_WEIGHT) / (self.judged + PRIOR_WEIGHT)
        k = max(range(1, self.k_max + 1), key=lambda k: predicted_speedup(alpha, k, self.r, self.c))
        if predicted_speedup(alpha, k, self.r, self.c) > 1:
            self.plain_rounds, self.probe_after = 0, PROBE_ROUNDS
            return k
        self.plain_rounds += 1
        if self.plain_rounds < self.probe_after:
            return 0
        self.plain_rounds, self.probe_after = 0, min(2 * self.probe_after, MAX_PROBE_ROUNDS)
        return k

    def _step(self, new_tokens):
        """Feed new_tokens to the draft, keep them, return the logits after the last one."""
        idx = torch.tensor([new_tokens], device=self.cache.k.device)
        logits = self.draft(idx, self.cache)[0, -1]
        self.cache.commit()
        self.forwards += 1
        return logits

    def propose(self, tokens, max_depth, sampling, generator):
        k = min(self.choose_k(), max_depth)
        if k == 0:  # a plain step pays best; the draft catches up when it next guesses
            return None
        # the draft will hold its window of the text plus k - 1 of its own guesses
        if self.context.slide_if_full(len(tokens), ahead=k - 1):
            k = min(k, self.draft.config.block_size // 2)
        logits = self._step(tokens[self.context.cached:])  # the catch-up: often two tokens, a whole prompt at first
        self.context.cached = len(tokens)
        self.root_length = self.cache.length
        started = time.perf_counter()
        guesses, draft_probs = [], []
        for i in range(k):
            if sampling.greedy:  # the verifier needs no q: a greedy guess stands or falls by the argmax
                guess = int(logits.argmax())
            else:
                q = token_probs(logits, sampling)
                guess = int(torch.multinomial(q, 1, generator=generator))
                draft_probs.append(q)
            guesses.append(guess)
            if i < k - 1:  # the last guess is only checked, never extended
                logits = self._step([guess])
        self.k_used = k
        if self.schedule == "auto" and k > 1:  # c as this loop pays it: a guess's step, against one timed alone
            paid = (time.perf_counter() - started) / (k - 1) / self.step_seconds
            self.c = (1 - COST_DECAY) * self.c + COST_DECAY * self.bare_c * paid
        return Candidates.chain(guesses, torch.stack(draft_probs) if draft_probs else None)

    def update(self, tokens, verdict, logits, hidden):
        if not self.k_used:  # nothing was proposed this round (no room before a slide)
            return
        kept = min(len(verdict.path), self.k_used - 1)  # accepted guesses the draft has already seen
        self.cache.rollback(self.root_length + kept)
        self.context.cached += kept
        self.accepted += len(verdict.path)
        self.judged += verdict.judged
        if self.schedule == "heuristic":
            self.k = min(self.k_max, self.k + 2) if len(verdict.path) == self.k_used else max(1, self.k - 1)
        self.k_used = 0
