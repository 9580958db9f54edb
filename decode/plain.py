"""Plain autoregressive decoding: one target forward per new token.

The baseline: every speculative method must say exactly what this says (greedy), or draw from
exactly the distribution this draws from (sampling), only with fewer target forwards.
"""
import time

import torch

from decode.context import prefill, slide_window
from decode.sampling import next_token
from decode.stats import DecodeStats


@torch.inference_mode()
def generate(model, prompt, max_new_tokens, sampling, generator=None, on_token=None):
    """Continue the token list `prompt` by max_new_tokens tokens. Calls on_token(id) for each new
    token as soon as it exists. Returns (new token ids, DecodeStats)."""
    block_size = model.config.block_size
    if not 0 < len(prompt) <= block_size:
        raise ValueError(f"prompt must have 1 to {block_size} tokens, got {len(prompt)}")
    start = time.perf_counter()
    stats = DecodeStats()
    cache = model.new_cache(scratch=0)
    tokens = list(prompt)
    logits = prefill(model, cache, tokens)
    stats.target_forwards += 1
    for i in range(max_new_tokens):
        token = next_token(logits, sampling, generator)
        tokens.append(token)
        if on_token:
            on_token(token)
        if i == max_new_tokens - 1:
            break  # the last token needs no forward of its own
        if cache.length == block_size:
            logits = slide_window(model, cache, tokens)
        else:
            logits = model(torch.tensor([[token]], device=cache.k.device), cache)[0, -1]
            cache.commit()
        stats.target_forwards += 1
    stats.new_tokens = len(tokens) - len(prompt)
    stats.seconds = time.perf_counter() - start
    return tokens[len(prompt):], stats
