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
"""
import time

import torch

from decode.plain import Plain
from decode.sampling import token_probs
from decode.stats import DecodeStats
from decode.tree import Candidates, pass_mask
from decode.verify import verify_greedy, verify_sampling
from decode.window import ContextWindow


NO_CANDIDATES = Candidates([], [])
PHASES = ("propose", "pass", "verify", "commit", "update")  # of a round, in order (DecodeStats.phase_seconds)


@torch.inference_mode()
def generate(model, prompt, max_new_tokens, sampling, generator=None, on_token=None, proposer=None):
    """Continue the token list `prompt` by max_new_tokens tokens, speculating with `proposer`
    (plain decoding when None). on_token(token, source) is called for each new token as soon as it
    is accepted; source is "draft" (an accepted candidate), "corrected" (the target's token in place
    of a rejected candidate), "bonus" (the target's token after a fully accepted path) or "target"
    (nothing was proposed). Returns (new token ids, DecodeStats)."""
    proposer = proposer or Plain()
    block_size = model.config.block_size
    if not 0 < len(prompt) <= block_size:
        raise ValueError(f"prompt must have 1 to {block_size} tokens, got {len(prompt)}")
    started = time.perf_counter()
    stats = DecodeStats()
    cache = model.new_cache(scratch=proposer.max_candidates + 1)
    context = ContextWindow(cache, block_size)
    device = cache.k.device
    proposer.start(prompt)
    tokens = list(prompt)
    clock, phases = time.perf_counter, stats.phase_seconds
    while len(tokens) - len(prompt) < max_new_tokens:
        t0 = clock()
        context.slide_if_full(len(tokens))  # the root must fit
        tail = tokens[context.cached:]
        remaining = max_new_tokens - (len(tokens) - len(prompt))
        depth_limit = min(context.room(len(tokens)), remaining - 1)  # the pass adds one token of its own
        candidates = proposer.propose(tokens, depth_limit, sampling, generator) if depth_limit > 0 else None
        candidates = NO_CANDIDATES if candidates is None else candidates
        t1 = clock()
        side = candidates.side.tokens if candidates.side else []
        idx = torch.tensor([tail + candidates.tokens + side], device=device)
        pos = mask = None  # a chain needs neither: it is a causal run of consecutive positions
        if not candidates.is_chain():
            mask = pass_mask(candidates, len(tail)).to(device)
            root_pos = cache.length + len(tail) - 1
            offsets = candidates.depths() + (candidates.side.offsets if side else [])
            pos = torch.tensor(list(range(cache.length, root_pos + 1)) + [root_pos + o for o in offsets],
                               device=device)
        logits, hidden = model(idx, cache, pos=pos, mask=mask, return_hidden=True)
        # logits at [root, candidates..., side...], which the verifier reads; hidden states of every
        # row, for a proposer that reads the features of the tokens the cache is about to keep
        logits, hidden = logits[0, len(tail) - 1:], hidden[0]
        judged = logits[:1 + len(candidates)]
        stats.target_forwards += 1
        stats.pass_sizes[len(logits)] += 1
        t2 = clock()
        if proposer.verify:  # an opt-in rule that gives up exactness for speed (Medusa's typical acceptance)
            verdict = proposer.verify(judged, candidates, sampling, generator)
        elif sampling.greedy:
            verdict = verify_greedy(judged, candidates)
        else:
            verdict = verify_sampling(token_probs(judged, sampling), candidates, generator)
        t3 = clock()
        cache.commit(list(range(len(tail))) + [len(tail) - 1 + c for c in verdict.path])
        context.cached = len(tokens) + len(verdict.path)
        accepted = [candidates.tokens[c - 1] for c in verdict.path]
        last_source = "target" if not candidates else ("corrected" if verdict.corrected else "bonus")
        new = list(zip(accepted, ["draft"] * len(accepted))) + [(verdict.next_token, last_source)]
        tokens += [t for t, _ in new]
        if on_token:
            for token, source in new:
                on_token(token, source)
        stats.judged += verdict.judged
        stats.accepted += len(verdict.path)
        if candidates:
            stats.record_depths(max(candidates.depths()), len(verdict.path))
        t4 = clock()
        proposer.update(tokens, verdict, logits, hidden)
        t5 = clock()
        for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            phases[phase] += seconds
    stats.new_tokens = len(tokens) - len(prompt)
    stats.draft_forwards = proposer.forwards
    stats.seconds = time.perf_counter() - started
    return tokens[len(prompt):], stats
