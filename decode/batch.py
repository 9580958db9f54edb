"""The batch engine: the rounds of decode/speculative.py for a batch of prompts, timed phase by phase,
with the fallback to plain decoding. The commands decode with it, one prompt or many.

Every row has a proposer of its own (a draft model runs all its rows' steps as one forward of its
own). The rows' passes are padded to one length and run as ONE target forward, each row after its
own committed length, under its own mask, and each row commits its own path. A padding token sees
only itself and is never committed, so every row says exactly what it would say alone. Rows that
re-prefill their window after a slide run a forward of their own (a RowView of the cache), so that
the others are not padded to half a window; a row that has its tokens leaves the batch. Where
speculating does not pay (at large batch sizes nothing does), a Fallback (decode/fallback.py) keeps
the whole batch plain while plain rounds are measured faster. One hook observes a round: each row's
DecodeStats records its Round, and so does on_round, if given."""
import time
from dataclasses import dataclass, field

import torch

from decode.plain import Plain
from decode.proposer import Proposer
from decode.speculative import NO_CANDIDATES, check_prompt, new_tokens, pass_inputs, pass_positions, pass_tokens
from decode.stats import PHASES, DecodeStats, Round
from decode.tree import Candidates, pass_mask, padded_pass
from decode.verify import verify
from decode.window import ContextWindow
from model.kv_cache import RowView


@dataclass
class _Row:
    """One sequence of a batch: its text, proposer and window, and this round's pass and verdict."""
    index: int  # in the batch as given (its place in the cache shifts as other rows finish)
    prompt_length: int
    tokens: list
    proposer: Proposer
    window: ContextWindow
    stats: DecodeStats = field(default_factory=DecodeStats)
    tail: list = field(default_factory=list)  # the tokens the pass caches, ending with the root
    candidates: Candidates = field(default_factory=lambda: NO_CANDIDATES)
    logits: torch.Tensor = None  # (1 + n + side, V) at [root, candidates..., side...]
    hidden: torch.Tensor = None  # (tail + n + side, C): every token of its pass
    width: int = 0               # the checked size its pass was padded to
    verdict: object = None
    new: list = field(default_factory=list)  # (token, source) added this round

    @property
    def new_tokens(self):
        return len(self.tokens) - self.prompt_length

    @property
    def pass_size(self):
        return len(self.tail) - 1 + self.candidates.checked_size()


class _Batch:
    """The rows still decoding and the five phases of their round, one method each."""

    def __init__(self, model, cache, rows, max_new_tokens, sampling, generator, on_token):
        self.model, self.cache, self.active = model, cache, list(rows)
        self.max_new_tokens, self.sampling, self.generator, self.on_token = max_new_tokens, sampling, generator, on_token
        self.speculating = True

    def propose(self):
        """Slide where the root would not fit; then every method proposes for all of its rows at once."""
        limits = []
        for b, row in enumerate(self.active):
            row.window.slide_if_full(len(row.tokens), row=b)
            row.tail = row.tokens[row.window.cached:]
            limits.append(min(row.window.room(len(row.tokens)), self.max_new_tokens - row.new_tokens - 1))
            row.candidates = NO_CANDIDATES
        if not self.speculating:
            return
        by_method = {}
        for b, row in enumerate(self.active):
            by_method.setdefault(type(row.proposer), []).append(b)
        for method, members in by_method.items():
            rows = [self.active[b] for b in members]
            proposals = method.propose_rows([row.proposer for row in rows], [row.tokens for row in rows],
                                            [limits[b] for b in members], self.sampling, self.generator)
            for row, candidates in zip(rows, proposals):
                row.candidates = NO_CANDIDATES if candidates is None else candidates

    def run_pass(self):
        """ONE target forward for the batch, or one per group when some rows re-prefill a window."""
        for group in _pass_groups(self.active):
            rows = [self.active[b] for b in group]
            view = self.cache if len(rows) == len(self.active) else RowView(self.cache, group)
            idx, pos, mask = _pass_inputs(rows, view)
            logits, hidden = self.model(idx, view, pos=pos, mask=mask, return_hidden=True)
            width = max(row.candidates.checked_size() for row in rows)
            for i, row in enumerate(rows):
                row.logits, row.hidden = logits[i, len(row.tail) - 1:row.pass_size], hidden[i, :row.pass_size]
                row.width = width

    def verify(self):
        for row in self.active:
            row.verdict = verify(row.logits[:1 + len(row.candidates)], row.candidates, self.sampling,
                                 self.generator, row.proposer.verify)

    def commit(self):
        self.cache.commit([list(range(len(row.tail))) + [len(row.tail) - 1 + c for c in row.verdict.path]
                           for row in self.active])
        for row in self.active:
            row.window.cached = len(row.tokens) + len(row.verdict.path)
            row.new = new_tokens(row.candidates, row.verdict)
            row.tokens += [token for token, _ in row.new]

    def stream(self):
        for row in self.active:
            for token, source in row.new:
                self.on_token(row.index, token, source)

    def update(self):
        for row in self.active:
            row.proposer.update(row.tokens, row.verdict, row.logits, row.hidden)

    def drop_finished(self, started):
        going_on = [b for b, row in enumerate(self.active) if row.new_tokens < self.max_new_tokens]
        if len(going_on) < len(self.active):
            for row in self.active:
                if row.new_tokens >= self.max_new_tokens:
                    row.stats.seconds = time.perf_counter() - started
            if going_on:
                self.cache.select_rows(going_on)
            self.active = [self.active[b] for b in going_on]


def _pass_groups(rows):
    """Which rows run one forward together: all of them, unless some re-prefill their window (half
    a window after a slide) while the others pass their usual few tokens. Padded to the refill's
    width, the others would cost as much as a refill each; so the two groups run apart."""
    refilling = [b for b, row in enumerate(rows) if len(row.tail) > 1]
    if 0 < len(refilling) < len(rows):
        return [refilling, [b for b, row in enumerate(rows) if len(row.tail) == 1]]
    return [list(range(len(rows)))]


def _pass_inputs(rows, cache):
    """tokens (B, n), positions and masks of one forward over `rows` of `cache`: a single row's as
    the one-sequence loop builds them; a batch of chains of one length (plain steps among them) is
    causal and needs neither, the model going on from each row's own length in the cache; anything
    else is padded to the longest pass, padding tokens seeing only themselves."""
    device = cache.k.device
    if len(rows) == 1:
        return pass_inputs(rows[0].tail, rows[0].candidates, cache.lengths[0], device)
    n = max(row.pass_size for row in rows)
    if all(row.candidates.is_chain() and row.pass_size == n for row in rows):
        return torch.tensor([pass_tokens(row.tail, row.candidates) for row in rows], device=device), None, None
    return padded_pass([(pass_tokens(row.tail, row.candidates), pass_positions(row.tail, row.candidates, length),
                         pass_mask(row.candidates, len(row.tail))) for row, length in zip(rows, cache.lengths)], device)


@torch.inference_mode()
def generate_batch(model, prompts, max_new_tokens, sampling, generator=None, on_token=None, proposers=None,
                   fallback=None, on_round=None):
    """Continue each of the token lists `prompts` by max_new_tokens tokens, all in one batch, row b
    speculating with proposers[b] (a proposer keeps state: one object per row; plain decoding when
    None). on_token(b, token, source) streams row b's tokens as decode.speculative.generate's does,
    after each round: its time is the caller's, left out of the rows' seconds (printing would
    otherwise count against whichever of two runs streams, docs/2026-12-07-epyc-ac.md). on_round(b,
    Round) follows each of row b's rounds. fallback decides for the whole batch, round by round,
    whether its rows propose (a padded pass costs every row).
    Returns (the new token ids of each row, a DecodeStats per row)."""
    proposers = proposers or [Plain() for _ in prompts]
    block_size = model.config.block_size
    if not prompts or len(proposers) != len(prompts):
        raise ValueError(f"generate_batch needs one proposer per prompt, got {len(proposers)} for {len(prompts)}")
    for prompt in prompts:
        check_prompt(prompt, block_size)
    started = time.perf_counter()
    # in a batch one row may re-prefill half a window after its slide while another's prefix is full
    scratch = max(p.max_candidates for p in proposers) + 1 + (block_size // 2 if len(prompts) > 1 else 0)
    cache = model.new_cache(batch_size=len(prompts), scratch=scratch)
    rows = []
    for index, (prompt, proposer) in enumerate(zip(prompts, proposers)):
        proposer.start(prompt)
        rows.append(_Row(index, len(prompt), list(prompt), proposer, ContextWindow(cache, block_size)))
    batch = _Batch(model, cache, rows, max_new_tokens, sampling, generator, on_token)
    one_length = len(prompts) > 1 and len({len(prompt) for prompt in prompts}) == 1  # rows apart only by speculating
    while batch.active:
        if fallback:
            batch.speculating = fallback.speculate()
            left_apart = one_length and cache.ragged  # by earlier rounds that speculated
            if batch.speculating:
                furthest_behind = min(row.new_tokens for row in batch.active)
        seconds = []
        for phase in (batch.propose, batch.run_pass, batch.verify, batch.commit, batch.update):
            t0 = time.perf_counter()
            phase()
            seconds.append(time.perf_counter() - t0)
        phase_seconds = dict(zip(PHASES, seconds))
        if on_token:
            t0 = time.perf_counter()
            batch.stream()
            started += time.perf_counter() - t0  # the caller's time (printing it), not decoding's
        for row in batch.active:
            outcome = Round(row.candidates, row.verdict, row.new, row.width, not batch.speculating, phase_seconds,
                            row.logits)
            row.stats.record(outcome)
            if on_round:
                on_round(row.index, outcome)
        if fallback and all(len(row.tail) == 1 for row in batch.active):
            # a round whose pass checked or carried nothing beyond the root (no row proposed) is a
            # plain one, whatever the mode: a method that guesses in bursts is judged by its guesses
            checked = batch.speculating and any(row.candidates.checked_size() > 1 for row in batch.active)
            # a batch is done when its last row is: a round gains what its row furthest behind gains
            # (in a plain round, every row's one token)
            gained = min(row.new_tokens for row in batch.active) - furthest_behind if checked else 1
            fallback.record(checked, gained, sum(seconds), left_apart)
        batch.drop_finished(started)
    for row in rows:
        row.stats.new_tokens, row.stats.draft_forwards = row.new_tokens, row.proposer.forwards
    return [row.tokens[row.prompt_length:] for row in rows], [row.stats for row in rows]
