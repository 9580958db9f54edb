"""Vanilla draft-model speculation (Leviathan et al. 2023; Chen et al. 2023).

A small draft model with the target's tokenizer guesses k tokens one at a time, sampling each from
its own (processed) distribution q; the target checks all k in one forward and the shared verifier
keeps each guess x with probability min(1, p(x)/q(x)) (greedy: while it equals the target's
argmax). The draft then rolls its cache back to the accepted prefix and, next round, catches up on
the tokens it has not seen (the target's correction or bonus token).

Guesses per round: a fixed k; "auto", the k of most expected tokens per unit of time by the running
acceptance and this machine's measured costs, 0 (a plain step) when no k pays (decode/sizing.py
AutoK); or "heuristic", Hugging Face transformers' schedule: k + 2 after a fully accepted round,
else k - 1.
"""
import time

import torch

from decode.proposer import Proposer
from decode.sampling import token_probs
from decode.sizing import AutoK
from decode.tree import Candidates, padded_pass
from decode.window import ContextWindow
from model.kv_cache import RowView

DEFAULT_K = 4               # guesses per round; also where "auto" and "heuristic" start
MAX_K = 16                  # the largest fixed k
AUTO_K_MAX = 8              # the most that "auto" and "heuristic" grow to


def parse_k(value):
    """(k, schedule) from a k setting: a number from 1 to MAX_K, "auto" or "heuristic"."""
    if value in ("auto", "heuristic"):
        return DEFAULT_K, value
    if not value.isdigit() or not 1 <= int(value) <= MAX_K:
        raise ValueError(f"k must be a number from 1 to {MAX_K}, 'auto' or 'heuristic', got {value!r}")
    return int(value), "fixed"


class DraftBatch:
    """The draft's KV cache for the rows of a batch, a row each, so that one draft forward serves
    every row that guesses (docs/2026-12-05-epyc-l.md)."""

    def __init__(self, draft, members):
        self.draft, self.members = draft, list(members)  # members: the rows' proposers, in cache order
        # a row's catch-up may be padded to another's, up to a window after a slide
        scratch = 1 if len(members) == 1 else draft.config.block_size
        self.cache = draft.new_cache(batch_size=len(members), scratch=scratch)

    def keep(self, members):
        """Keep the rows of these proposers only: the others' texts are done."""
        if members != self.members:
            self.cache.select_rows([self.members.index(p) for p in members])
            self.members = list(members)

    def row(self, proposer):
        return self.members.index(proposer)

    def step(self, sequences):
        """One forward in which row b reads sequences[b] after its committed prefix and keeps it
        (None: the row sits this one out). Returns {b: the logits after row b's last token}."""
        rows = [b for b, tokens in enumerate(sequences) if tokens]
        passes = [sequences[b] for b in rows]
        view = self.cache if len(rows) == len(sequences) else RowView(self.cache, rows)
        device = self.cache.k.device
        if all(len(tokens) == len(passes[0]) for tokens in passes):  # causal, each row after its own length
            logits = self.draft(torch.tensor(passes, device=device), view)
        else:
            idx, pos, mask = padded_pass([(tokens, range(length, length + len(tokens)), torch.ones(
                len(tokens), len(tokens), dtype=torch.bool).tril()) for tokens, length in zip(passes, view.lengths)], device)
            logits = self.draft(idx, view, pos=pos, mask=mask)
        self.cache.commit([list(range(len(tokens))) if tokens else [] for tokens in sequences])
        return {b: logits[i, len(tokens) - 1] for i, (b, tokens) in enumerate(zip(rows, passes))}


class DraftModel(Proposer):
    def __init__(self, draft, k=DEFAULT_K, schedule="fixed", costs=None):
        """schedule "auto" needs this machine's Costs (decode/methods.py measures them)."""
        self.draft, self.schedule = draft, schedule
        self.max_candidates = self.k_max = k if schedule == "fixed" else AUTO_K_MAX
        self.k_start = k
        self.auto = AutoK(costs, AUTO_K_MAX) if schedule == "auto" else None

    def start(self, prompt):
        self.batch = None  # the DraftBatch holding this text's row of the draft's cache, from the first guess
        self.forwards = 0
        self.k = self.k_start
        self.k_used = 0  # guesses proposed this round
        if self.auto:
            self.auto.start()

    def propose(self, tokens, max_depth, sampling, generator):
        return self.propose_rows([self], [tokens], [max_depth], sampling, generator)[0]

    @classmethod
    def propose_rows(cls, proposers, texts, max_depths, sampling, generator):
        """Each row guesses its own k tokens (k = 0: a plain step pays best; the draft catches up when
        it next guesses), the rows' draft steps running as one forward: first each guessing row's
        catch-up (often two tokens, a whole prompt at first), then a step per guess."""
        batch = proposers[0].batch
        if batch is None or any(p.batch is not batch for p in proposers):  # a new text
            batch = DraftBatch(proposers[0].draft, proposers)
            for p in proposers:
                p.batch, p.context = batch, ContextWindow(batch.cache, p.draft.config.block_size)
        batch.keep(proposers)
        ks = []
        for b, (p, tokens, max_depth) in enumerate(zip(proposers, texts, max_depths)):
            k = min(p.auto.choose() if p.auto else p.k, max_depth) if max_depth > 0 else 0
            # the draft will hold its window of the text plus k - 1 of its own guesses
            if k and p.context.slide_if_full(len(tokens), ahead=k - 1, row=b):
                k = min(k, p.draft.config.block_size // 2)
            ks.append(k)
        if not any(ks):
            return [None] * len(proposers)
        logits = batch.step([tokens[p.context.cached:] if k else None for p, tokens, k in zip(proposers, texts, ks)])
        for b, (p, tokens, k) in enumerate(zip(proposers, texts, ks)):
            if k:
                p.context.cached, p.root_length, p.k_used = len(tokens), batch.cache.lengths[b], k
                p.forwards += k  # the catch-up and k - 1 guesses: the last guess is only checked, never extended
        started = time.perf_counter()
        guesses, draws = [[] for _ in ks], [[] for _ in ks]
        for i in range(max(ks)):
            for b in logits:
                if sampling.greedy:  # the verifier needs no q: a greedy guess stands or falls by the argmax
                    guesses[b].append(int(logits[b].argmax()))
                else:
                    q = token_probs(logits[b], sampling)
                    guesses[b].append(int(torch.multinomial(q, 1, generator=generator)))
                    draws[b].append(q)
            going_on = [[guesses[b][-1]] if b in logits and ks[b] > i + 1 else None for b in range(len(ks))]
            if not any(going_on):
                break
            logits = batch.step(going_on)
        steps = max(ks) - 1
        for p, k in zip(proposers, ks):
            if p.auto and k and steps:  # c as this loop pays it
                p.auto.timed(time.perf_counter() - started, steps)
        return [Candidates.chain(g, torch.stack(d) if d else None) if k else None
                for g, d, k in zip(guesses, draws, ks)]

    def update(self, tokens, verdict, logits, hidden):
        if not self.k_used:  # nothing was proposed this round (no room before a slide)
            return
        kept = min(len(verdict.path), self.k_used - 1)  # accepted guesses the draft has already seen
        self.batch.cache.rollback(self.root_length + kept, row=self.batch.row(self))
        self.context.cached += kept
        if self.auto:
            self.auto.record(len(verdict.path), verdict.judged)
        if self.schedule == "heuristic":
            self.k = min(self.k_max, self.k + 2) if len(verdict.path) == self.k_used else max(1, self.k - 1)
        self.k_used = 0
