"""What a forward pass costs, relative to one single-token target step.

r(n) = time of one forward with n new tokens / time with 1: near 1 for small n on a GPU, growing
sooner on a small CPU model, where it decides whether checking k guesses can beat k plain steps.
"""
import json
import os
import statistics
import time

import torch

from decode.tree import verify_mask


def profile_prefix(model):
    """The cached prefix a cost is measured after: half the context, the middle of what decoding
    sees (attention over the prefix is a small part of a pass at these sizes)."""
    return model.config.block_size // 2


def _prefilled_cache(model, prefix, scratch, generator, batch_size=1):
    cache = model.new_cache(batch_size=batch_size, scratch=scratch)
    if prefix:
        idx = torch.randint(model.config.vocab_size, (batch_size, prefix), generator=generator)
        model(idx.to(cache.k.device), cache)
        cache.commit()
    return cache


def _time_pass(model, cache, idx, prefix, tree=False):
    t0 = time.perf_counter()
    if tree:  # as the loop runs a tree pass: a mask built for it and explicit positions
        n = idx.size(1)
        mask = verify_mask(list(range(-1, n - 2))).to(idx.device)
        model(idx, cache, pos=torch.arange(prefix, prefix + n, device=idx.device), mask=mask)
    else:
        model(idx, cache)
    if cache.k.device.type == "cuda":
        torch.cuda.synchronize()
    cache.rollback(prefix)  # a verify pass that keeps nothing
    return time.perf_counter() - t0


def median_seconds(run, device, repeats=7):
    """Median wall time of run() over `repeats` calls, after one that warms up."""
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        run()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[1:])


@torch.inference_mode()
def forward_seconds(model, n, prefix, repeats=7, batch_size=1):
    """Median wall time of one forward with n new tokens (in each of batch_size rows) after `prefix`
    cached tokens (random ones, from torch's global generator)."""
    cache = _prefilled_cache(model, prefix, n, None, batch_size)
    idx = torch.randint(model.config.vocab_size, (batch_size, n)).to(cache.k.device)
    return median_seconds(lambda: _time_pass(model, cache, idx, prefix), cache.k.device, repeats)


@torch.inference_mode()
def cost_curve(model, max_n, prefix, repeats=7, tree=False, batch_size=1):
    """[r(1), ..., r(max_n)] after `prefix` cached tokens, and the seconds of r(1). tree=True times
    passes of n > 1 tokens as tree passes (mask and positions built and applied), chains otherwise.
    With batch_size B, r(n) is the cost of a pass of B rows x n tokens over a step of B x 1: what
    speculating n - 1 tokens deep costs in each row of a batch. The sizes are timed round-robin, so
    that a drift in the machine's speed hits them alike, and the medians are fitted non-decreasing
    (nondecreasing_fit): a pass does not get cheaper by growing."""
    gen = torch.Generator().manual_seed(0)
    cache = _prefilled_cache(model, prefix, max_n, gen, batch_size)
    inputs = [torch.randint(model.config.vocab_size, (batch_size, n), generator=gen).to(cache.k.device)
              for n in range(1, max_n + 1)]
    samples = [[] for _ in inputs]
    for repeat in range(repeats + 1):
        for idx, times in zip(inputs, samples):
            seconds = _time_pass(model, cache, idx, prefix, tree and idx.size(1) > 1)
            if repeat:  # the first round warms up
                times.append(seconds)
    medians = nondecreasing_fit([statistics.median(times) for times in samples])
    return [m / medians[0] for m in medians], medians[0]


def nondecreasing_fit(values):
    """The non-decreasing sequence closest to `values` in least squares (pool adjacent violators):
    a size whose median ran high is averaged with the sizes after it, and one that ran low with
    those before it: one noisy median is spread over the sizes around it, not carried on to every
    larger one (docs/2026-12-05-epyc-r.md)."""
    pools = []  # [mean, count] of runs of neighbours fitted to one value
    for value in values:
        pools.append([value, 1])
        while len(pools) > 1 and pools[-2][0] > pools[-1][0]:
            mean, count = pools.pop()
            before, counted = pools[-1]
            pools[-1] = [(before * counted + mean * count) / (counted + count), counted + count]
    return [mean for mean, count in pools for _ in range(count)]


class StoredCosts:
    """Cost measurements kept in a JSON file and reused, since timing the machine takes longer than
    a short generation. `machine` names everything a cost depends on (the model files, device,
    dtype, attention backend, threads); each machine's costs are kept apart under it. path=None
    keeps nothing: every cost is measured when asked for."""

    def __init__(self, path=None, machine="", on_measure=None):
        self.path, self.machine = path, machine
        self.on_measure = on_measure or (lambda name: None)  # called with a cost's name before it is measured

    def _read(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                stored = json.load(f)
        except (OSError, ValueError):  # none yet, unreadable or not JSON: measure again
            return {}
        return stored if isinstance(stored, dict) else {}

    def _write(self, stored):
        try:
            with open(self.path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(stored, f)
            os.replace(self.path + ".tmp", self.path)
        except OSError:
            pass  # a read-only directory: the costs are measured again next time

    def kept(self):
        """Every cost this machine has kept, by name: one read of the file."""
        return (self._read() if self.path else {}).get(self.machine, {})

    def get(self, name, measure=None):
        """The cost called `name`, from the file if it was measured before, else measure() now (or
        None, without a measure)."""
        value = self.kept().get(name)
        if value is None and measure is not None:
            self.on_measure(name)
            value = measure()
            self.put(name, value)
        return value

    def put(self, name, value):
        """Keep `value` (JSON) as what this machine measured for `name`, replacing what was kept."""
        if self.path:
            stored = self._read()
            self._write(dict(stored, **{self.machine: dict(stored.get(self.machine, {}), **{name: value})}))

    def forget(self):
        """Drop this machine's costs, so that the next use measures them again."""
        stored = self._read() if self.path else {}
        if stored.pop(self.machine, None) is not None:
            self._write(stored)

