"""Speculative decoding, one sequence: the loop every method shares.

Each round:
  1. the method (a "proposer", decode/proposer.py) proposes candidate tokens after the last
     accepted one, as a tree (a chain for a draft model), with the draft probabilities it sampled
     them from, if any;
  2. the target runs ONE forward over the tokens not yet in its cache (the root: the last accepted
     token) and all candidates, under the tree mask, positions = prefix length + depth;
  3. the shared verifier (decode/verify.py) picks the accepted path and the target's next token;
  4. the cache commits the root and that path; everything else in the pass is dropped;
  5. the method updates its own state (a draft model rolls its cache back; Medusa and EAGLE heads
     read the target's final hidden states of this pass).
Plain decoding is the degenerate case: no candidates, one new token per target forward.

Past the context window the cache slides (decode/window.py): when the root would no longer fit,
the next pass re-prefills the last half window. Candidates are never deeper than the room left in
the window, so every method predicts every token from the same context, which is what makes greedy
speculation token-identical to plain greedy.

The engine the commands run (decode/batch.py) does the same rounds for a batch of prompts, timed,
with the fallback to plain decoding; it is tested token for token against this loop.
"""
import torch

from decode.plain import Plain
from decode.stats import DecodeStats, Round
from decode.tree import Candidates, pass_mask
from decode.verify import verify
from decode.window import ContextWindow

NO_CANDIDATES = Candidates([], [])


@torch.inference_mode()
def generate(model, prompt, max_new_tokens, sampling, generator=None, on_token=None, proposer=None, on_round=None):
    """Continue the token list `prompt` by max_new_tokens tokens, speculating with `proposer`
    (plain decoding when None). on_token(token, source) is called for each new token as soon as it
    is accepted, source being "draft" (an accepted candidate), "corrected" (the target's token in
    place of a rejected candidate), "bonus" (the target's token after a fully accepted path) or
    "target" (nothing was proposed); on_round(Round) after each round. Returns (new token ids,
    DecodeStats, untimed: the engine, decode/batch.py, times its rounds)."""
    check_prompt(prompt, model.config.block_size)
    proposer = proposer or Plain()
    cache = model.new_cache(batch_size=1, scratch=proposer.max_candidates + 1)
    window = ContextWindow(cache, model.config.block_size)
    tokens, stats = list(prompt), DecodeStats()
    proposer.start(prompt)
    while len(tokens) - len(prompt) < max_new_tokens:
        window.slide_if_full(len(tokens))  # the root must fit
        tail = tokens[window.cached:]  # accepted but not yet cached, ending with the root
        # 1. propose, no deeper than the window's room and the tokens still wanted (the pass adds one)
        room = min(window.room(len(tokens)), max_new_tokens - (len(tokens) - len(prompt)) - 1)
        candidates = proposer.propose(tokens, room, sampling, generator) if room > 0 else None
        candidates = NO_CANDIDATES if candidates is None else candidates
        # 2. one verify pass: logits and hidden states at [tail..., candidates..., side...]
        idx, pos, mask = pass_inputs(tail, candidates, cache.length, cache.k.device)
        logits, hidden = model(idx, cache, pos=pos, mask=mask, return_hidden=True)
        logits, hidden = logits[0, len(tail) - 1:], hidden[0]  # logits from the root on
        # 3. verify
        verdict = verify(logits[:1 + len(candidates)], candidates, sampling, generator, proposer.verify)
        # 4. commit the tail and the accepted path
        cache.commit(list(range(len(tail))) + [len(tail) - 1 + c for c in verdict.path])
        window.cached = len(tokens) + len(verdict.path)
        new = new_tokens(candidates, verdict)
        tokens += [token for token, _ in new]
        if on_token:
            for token, source in new:
                on_token(token, source)
        # 5. the method's own update
        proposer.update(tokens, verdict, logits, hidden)
        outcome = Round(candidates, verdict, new, logits=logits)
        stats.record(outcome)
        if on_round:
            on_round(outcome)
    stats.new_tokens, stats.draft_forwards = len(tokens) - len(prompt), proposer.forwards
    return tokens[len(prompt):], stats


def check_prompt(prompt, block_size):
    if not 0 < len(prompt) <= block_size:
        raise ValueError(f"prompt must have 1 to {block_size} tokens, got {len(prompt)}")


def pass_tokens(tail, candidates):
    side = candidates.side.tokens if candidates.side else []
    return tail + candidates.tokens + side


def pass_positions(tail, candidates, length):
    """Position ids of a pass after `length` cached tokens: the tail's run, then root + depth."""
    root = length + len(tail) - 1
    offsets = candidates.depths() + (candidates.side.offsets if candidates.side else [])
    return list(range(length, root + 1)) + [root + offset for offset in offsets]


def pass_inputs(tail, candidates, length, device):
    """tokens (1, n), positions (n,) and mask (n, n) of a pass. A chain is causal and needs neither:
    the model goes on from the cache's length."""
    idx = torch.tensor([pass_tokens(tail, candidates)], device=device)
    if candidates.is_chain():
        return idx, None, None
    return (idx, torch.tensor(pass_positions(tail, candidates, length), device=device),
            pass_mask(candidates, len(tail)).to(device))


def new_tokens(candidates, verdict):
    """(token, source) for the accepted candidates, then the target's own token."""
    accepted = [(candidates.tokens[c - 1], "draft") for c in verdict.path]
    last = "target" if not candidates else ("corrected" if verdict.corrected else "bonus")
    return accepted + [(verdict.next_token, last)]
