"""The speculative loop every decoding method shares.

Each round:
  1. the method (a "proposer") proposes candidate tokens as a tree (a chain for a draft model),
     with the draft probabilities it sampled them from, if any;
  2. the target runs ONE forward over the tokens not yet in its cache (the root: the last accepted
     token) and all candidates, under the tree mask, positions = prefix length + depth;
  3. the shared verifier picks the accepted path and the target's next token;
  4. the cache commits the root and that path; everything else in the pass is dropped;
  5. the method updates its own state (a draft model rolls its cache back; Medusa and EAGLE heads
     read the target's final hidden states of this pass).
Plain decoding is the degenerate case: no candidates, one new token per target forward.

Past the context window the cache slides (decode/window.py): when the root would no longer fit,
the next pass re-prefills the last half window. Candidates are never deeper than the room left in
the window, so every method predicts every token from the same context, which is what makes greedy
speculation token-identical to plain greedy.

A batch of prompts runs the same rounds, every row with a proposer of its own (a method may serve
its rows together: a draft model runs their draft steps as one forward of its own). The rows' passes
(each its tail and its candidates) are padded to one length and run as ONE target forward, each row
after its own committed length, under its own mask; each row's verdict commits its own path. A
padding token sees only itself and is never committed, so every row says exactly what it would say
alone. In a round where some rows re-prefill their window after a slide, those rows run a forward of
their own (a RowView of the cache), so that the others are not padded to half a window. A row that
has its tokens leaves the batch.

Where speculating does not pay (at large batch sizes nothing does), a Fallback (decode/fallback.py)
keeps the whole batch plain, round by round, for as long as plain rounds are measured faster.
"""
import time
from dataclasses import dataclass, field

import torch

from decode.plain import Plain
from decode.proposer import Proposer
from decode.sampling import token_probs
from decode.stats import DecodeStats
from decode.tree import Candidates, pass_mask, padded_pass
from decode.verify import verify_greedy, verify_sampling
from decode.window import ContextWindow
from model.kv_cache import RowView


NO_CANDIDATES = Candidates([], [])
PHASES = ("propose", "pass", "verify", "commit", "update")  # of a round, in order (DecodeStats.phase_seconds)


@dataclass
class _Row:
    """One sequence of a batch: its tokens, its proposer and what its part of the cache holds."""
    index: int  # in the batch as given (its place in the cache shifts as other rows finish)
    prompt_length: int
    tokens: list
    proposer: Proposer
    window: ContextWindow
    stats: DecodeStats = field(default_factory=DecodeStats)
    tail: list = field(default_factory=list)  # this round: the tokens the pass caches, ending with the root
    candidates: Candidates = field(default_factory=lambda: NO_CANDIDATES)

    @property
    def new_tokens(self):
        return len(self.tokens) - self.prompt_length

    @property
    def pass_size(self):
        return len(self.tail) + len(self.candidates) + (len(self.candidates.side.tokens) if self.candidates.side else 0)

    @property
    def checked_size(self):
        """The pass's tokens that are checked or carried (root, candidates, side), as pass_sizes counts."""
        return self.pass_size - len(self.tail) + 1

    def pass_tokens(self):
        side = self.candidates.side.tokens if self.candidates.side else []
        return self.tail + self.candidates.tokens + side

    def pass_positions(self, length):
        """Position ids of this row's pass after `length` committed tokens."""
        root_pos = length + len(self.tail) - 1
        offsets = self.candidates.depths() + (self.candidates.side.offsets if self.candidates.side else [])
        return list(range(length, root_pos + 1)) + [root_pos + o for o in offsets]


def _propose(rows, depth_limits, sampling, generator):
    """Every row's candidates (None: it proposes nothing), each method proposing for all of its
    rows at once: a draft model runs their steps as one forward."""
    proposals = [None] * len(rows)
    by_method = {}
    for b, row in enumerate(rows):
        by_method.setdefault(type(row.proposer), []).append(b)
    for method, members in by_method.items():
        texts = [rows[b].tokens for b in members]
        limits = [depth_limits[b] for b in members]
        for b, candidates in zip(members, method.propose_rows([rows[b].proposer for b in members], texts, limits,
                                                              sampling, generator)):
            proposals[b] = candidates
    return proposals


def _pass_groups(rows):
    """Which rows run one forward together: all of them, unless some re-prefill their window (half
    a window after a slide) while the others pass their usual few tokens. Padded to the refill's
    width, the others would cost as much as a refill each; so the two groups run apart."""
    refilling = [b for b, row in enumerate(rows) if len(row.tail) > 1]
    if 0 < len(refilling) < len(rows):
        return [refilling, [b for b, row in enumerate(rows) if len(row.tail) == 1]]
    return [list(range(len(rows)))]


def _pass_inputs(rows, cache, device):
    """The one forward's tokens (B, n), positions and masks for the rows' passes. A batch of chains of
    one length (plain steps among them) is causal and needs neither: the model goes on from each
    row's own length in the cache; a single row's tree takes an (n, n) mask; anything else is padded
    to the longest pass, padding tokens seeing only themselves."""
    n = max(row.pass_size for row in rows)
    if all(row.candidates.is_chain() and row.pass_size == n for row in rows):
        return torch.tensor([row.pass_tokens() for row in rows], device=device), None, None
    if len(rows) == 1:
        (row,) = rows
        return (torch.tensor([row.pass_tokens()], device=device),
                torch.tensor(row.pass_positions(cache.lengths[0]), device=device),
                pass_mask(row.candidates, len(row.tail)).to(device))
    return padded_pass([(row.pass_tokens(), row.pass_positions(length), pass_mask(row.candidates, len(row.tail)))
                        for row, length in zip(rows, cache.lengths)], device)


@torch.inference_mode()
def generate(model, prompt, max_new_tokens, sampling, generator=None, on_token=None, proposer=None,
             fallback=None):
    """Continue the token list `prompt` by max_new_tokens tokens, speculating with `proposer`
    (plain decoding when None). on_token(token, source) is called for each new token as soon as it
    is accepted; source is "draft" (an accepted candidate), "corrected" (the target's token in place
    of a rejected candidate), "bonus" (the target's token after a fully accepted path) or "target"
    (nothing was proposed). fallback: a Fallback that decodes plainly while speculating is measured
    slower (None: speculate every round). Returns (new token ids, DecodeStats)."""
    streamed = on_token and (lambda row, token, source: on_token(token, source))
    outputs, stats = generate_batch(model, [prompt], max_new_tokens, sampling, generator, streamed,
                                    [proposer or Plain()], fallback)
    return outputs[0], stats[0]


@torch.inference_mode()
def generate_batch(model, prompts, max_new_tokens, sampling, generator=None, on_token=None, proposers=None,
                   fallback=None):
    """Continue each of the token lists `prompts` by max_new_tokens tokens, all in one batch, row b
    speculating with proposers[b] (a proposer keeps state: one object per row; plain decoding when
    None). on_token(b, token, source) streams row b's tokens as generate's does. fallback decides
    for the whole batch, round by round, whether its rows propose (a padded pass costs every row).
    Returns (the new token ids of each row, a DecodeStats per row)."""
    proposers = proposers or [Plain() for _ in prompts]
    block_size = model.config.block_size
    if not prompts or len(proposers) != len(prompts):
        raise ValueError(f"generate_batch needs one proposer per prompt, got {len(proposers)} for {len(prompts)}")
    for prompt in prompts:
        if not 0 < len(prompt) <= block_size:
            raise ValueError(f"prompt must have 1 to {block_size} tokens, got {len(prompt)}")
    started = time.perf_counter()
    # in a batch one row may re-prefill half a window after its slide while another's prefix is full
    scratch = max(p.max_candidates for p in proposers) + 1 + (block_size // 2 if len(prompts) > 1 else 0)
    cache = model.new_cache(batch_size=len(prompts), scratch=scratch)
    device = cache.k.device
    rows = []
    for index, (prompt, proposer) in enumerate(zip(prompts, proposers)):
        proposer.start(prompt)
        rows.append(_Row(index, len(prompt), list(prompt), proposer, ContextWindow(cache, block_size)))
    active = list(rows)
    clock = time.perf_counter
    while active:
        t0 = clock()
        speculating = fallback is None or fallback.speculate()
        depth_limits = []
        for b, row in enumerate(active):
            row.window.slide_if_full(len(row.tokens), row=b)  # the root must fit
            row.tail = row.tokens[row.window.cached:]
            # the pass adds one token of its own
            depth_limits.append(min(row.window.room(len(row.tokens)), max_new_tokens - row.new_tokens - 1))
            row.stats.held_rounds += not speculating
        proposals = _propose(active, depth_limits, sampling, generator) if speculating else [None] * len(active)
        for row, candidates in zip(active, proposals):
            row.candidates = NO_CANDIDATES if candidates is None else candidates
        t1 = clock()
        outputs = [None] * len(active)  # per row: (logits, hidden states, the width its pass was padded to)
        for group in _pass_groups(active):
            members = [active[b] for b in group]
            view = cache if len(members) == len(active) else RowView(cache, group)
            idx, pos, mask = _pass_inputs(members, view, device)
            logits, hidden = model(idx, view, pos=pos, mask=mask, return_hidden=True)
            width = max(row.checked_size for row in members)
            for i, (b, row) in enumerate(zip(group, members)):
                # logits at [root, candidates..., side...], which the verifier reads; hidden states of
                # every row, for a proposer that reads the features of the tokens the cache will keep
                outputs[b] = (logits[i, len(row.tail) - 1:row.pass_size], hidden[i, :row.pass_size], width)
        t2 = clock()
        verdicts = []
        for row, (row_logits, _, _) in zip(active, outputs):
            judged = row_logits[:1 + len(row.candidates)]
            if row.proposer.verify:  # an opt-in rule that gives up exactness for speed (Medusa's typical acceptance)
                verdict = row.proposer.verify(judged, row.candidates, sampling, generator)
            elif sampling.greedy:
                verdict = verify_greedy(judged, row.candidates)
            else:
                verdict = verify_sampling(token_probs(judged, sampling), row.candidates, generator)
            verdicts.append(verdict)
        t3 = clock()
        cache.commit([list(range(len(row.tail))) + [len(row.tail) - 1 + c for c in verdict.path]
                      for row, verdict in zip(active, verdicts)])
        for row, verdict, (_, _, width) in zip(active, verdicts, outputs):
            candidates, stats = row.candidates, row.stats
            row.window.cached = len(row.tokens) + len(verdict.path)
            accepted = [candidates.tokens[c - 1] for c in verdict.path]
            last_source = "target" if not candidates else ("corrected" if verdict.corrected else "bonus")
            new = list(zip(accepted, ["draft"] * len(accepted))) + [(verdict.next_token, last_source)]
            row.tokens += [t for t, _ in new]
            if on_token:
                for token, source in new:
                    on_token(row.index, token, source)
            stats.target_forwards += 1
            stats.pass_sizes[row.checked_size] += 1
            stats.pass_widths[width] += 1
            stats.judged += verdict.judged
            stats.accepted += len(verdict.path)
            if candidates:
                stats.record_depths(max(candidates.depths()), len(verdict.path))
        t4 = clock()
        for row, verdict, (row_logits, row_hidden, _) in zip(active, verdicts, outputs):
            row.proposer.update(row.tokens, verdict, row_logits, row_hidden)
        t5 = clock()
        if fallback and all(len(row.tail) == 1 for row in active):
            # a round whose pass checked or carried nothing beyond the root (no row proposed) is a
            # plain one, whatever the mode: a method that guesses in bursts is judged by its guesses
            checked = any(row.checked_size > 1 for row in active)
            fallback.record(checked, sum(len(v.path) + 1 for v in verdicts) / len(active), t5 - t0)
        for row in active:
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                row.stats.phase_seconds[phase] += seconds
        going_on = [b for b, row in enumerate(active) if row.new_tokens < max_new_tokens]
        if len(going_on) < len(active):
            for row in active:
                if row.new_tokens >= max_new_tokens:
                    row.stats.seconds = clock() - started
            if going_on:
                cache.select_rows(going_on)
            active = [active[b] for b in going_on]
    for row in rows:
        row.stats.new_tokens = row.new_tokens
        row.stats.draft_forwards = row.proposer.forwards
    return [row.tokens[row.prompt_length:] for row in rows], [row.stats for row in rows]
