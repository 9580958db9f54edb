"""What a forward pass costs, relative to one single-token target step.

r(n) = time of one forward with n new tokens / time with 1. On a GPU r(n) stays near 1 for small n
(the weights are read once either way), which is why speculation pays; on a small CPU model it
grows sooner, and it decides whether checking k guesses at once can beat k plain steps at all.
"""
import statistics
import time

import torch


@torch.inference_mode()
def forward_seconds(model, n, prefix, repeats=7, generator=None):
    """Median wall time of one forward with n new tokens after `prefix` cached tokens."""
    cache = model.new_cache(scratch=n)
    device = cache.k.device
    vocab = model.config.vocab_size
    if prefix:
        model(torch.randint(vocab, (1, prefix), generator=generator).to(device), cache)
        cache.commit()
    idx = torch.randint(vocab, (1, n), generator=generator).to(device)
    samples = []
    for _ in range(repeats + 1):  # the first run warms up
        t0 = time.perf_counter()
        model(idx, cache)
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
        cache.rollback(prefix)  # a verify pass that keeps nothing
    return statistics.median(samples[1:])


def cost_curve(model, max_n, prefix, repeats=7):
    """[r(1), ..., r(max_n)] after `prefix` cached tokens, and the seconds of r(1)."""
    gen = torch.Generator().manual_seed(0)
    seconds = [forward_seconds(model, n, prefix, repeats, gen) for n in range(1, max_n + 1)]
    return [s / seconds[0] for s in seconds], seconds[0]
