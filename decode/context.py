"""Filling the target's context, and going past its window.

The model has block_size learned positions, so the committed context can never be longer. When a
decoder needs room it re-prefills the cache with the last half window of the text so far: the
model then continues from block_size // 2 tokens of context (the shortest it ever sees again),
and the next re-prefill is half a window of new tokens away.
"""
import torch


def prefill(model, cache, tokens):
    """Reset `cache` to hold exactly `tokens`; return the logits after the last one, (vocab,)."""
    cache.rollback(0)
    idx = torch.tensor([tokens], device=cache.k.device)  # (1, T)
    logits = model(idx, cache)
    cache.commit()
    return logits[0, -1]


def slide_window(model, cache, tokens):
    """Re-prefill with the last half window of `tokens`; return the next-token logits."""
    return prefill(model, cache, tokens[-(model.config.block_size // 2):])
