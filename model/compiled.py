"""The compiled path: every pass of the model at a few static shapes, as gpt-fast runs its decode.

A compiler makes a pass fast by fusing its operators and, on a CPU, by generating GEMM micro-kernels
for the exact shapes, but it needs shapes that do not change. A pass has n new tokens after a
committed prefix of P tokens, and both vary, so:
  - n is padded up to one of BUCKETS. The padding rows come after the real ones; their K/V land in
    scratch slots that no commit keeps (the cache's `pending` counts only the n real entries) and
    their outputs are sliced off;
  - attention reads the cache's whole capacity under a mask over every slot: the committed prefix,
    then the pass's own n x n mask (causal, or the tree's). P is a tensor in the graph, so one
    compiled graph serves every prefix length;
  - the new K/V are written with index_copy_ at the tensor positions P .. P+b-1.
Inside runs the model's own forward with a cache view that writes at tensor positions: there is one
model, compiled or not. Passes larger than the largest bucket (a long prompt's prefill) run eagerly.

Each bucket is compiled ahead of time with AOTInductor into a package on disk (weights frozen in,
GEMMs autotuned), built on its first use and loaded in a moment afterwards. In-process torch.compile
builds the same kernels, but its on-disk cache refuses graphs holding the CPU's prepacked weights,
so it would compile every bucket again in every run (docs/2026-12-03-epyc-e.md). Without a package
folder the static pass runs eagerly: slower than the plain model, but it checks the padding, masking
and writing above.
"""
import contextlib
import hashlib
import io
import os
import sys
import time

import torch
import torch.nn as nn

import kernels
from kernels import reference
from model import gpt
from model.kv_cache import Cache, KVCache

# dense where the methods' passes are (a draft's k + 1, small trees), sparse beyond: a pass pays for
# its padding, and every bucket costs a compile
BUCKETS = (1, 2, 4, 5, 6, 8, 12, 16, 32, 64)
# weights frozen in as constants; GEMMs chosen by timing inductor's own against the library's
COMPILE_OPTIONS = {"freezing": True, "max_autotune": True}
GEMM_BACKENDS = {"cpu": "CPP,ATEN", "cuda": "TRITON,ATEN"}


class _StaticCacheView(Cache):
    """The cache as a static pass hands it to GPT.forward: written at tensor positions, read whole."""

    def __init__(self, k, v, prefix, b):
        self.k, self.v = k, v  # (L, B, nh, capacity, hs)
        self.slots = prefix + torch.arange(b, device=k.device)  # (b,); prefix: 0-d tensor

    def write(self, layer, k_new, v_new):
        self.k[layer].index_copy_(2, self.slots, k_new)
        self.v[layer].index_copy_(2, self.slots, v_new)
        return self.k[layer], self.v[layer]  # (B, nh, capacity, hs)

    def row_lengths(self):
        return None  # the mask over every key already says where the prefix ends


class StaticPass(nn.Module):
    """One padded pass of b tokens, every input a tensor of fixed shape: what gets compiled."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, pos, prefix, inner, k, v):
        """idx (1, b), pos (b,); prefix: 0-d tensor, the committed length; inner: bool (b, b), who
        sees whom among the new tokens; k, v: the cache's tensors, written in place.
        Returns logits (1, b, vocab) and final hidden states (1, b, C)."""
        mask = kernels.keys_mask(prefix, inner, k.size(3))  # (b, capacity): over every key
        return self.model(idx, _StaticCacheView(k, v, prefix, idx.size(1)), pos=pos, mask=mask, return_hidden=True)


class StaticGPT:
    """A GPT whose cached passes run at static shapes, called like the model, with the same results.

    package_dir: where the compiled passes are kept (one package per bucket); None runs the static
    pass eagerly. on_compile(bucket, seconds) is called as a bucket's first compile starts
    (seconds=None) and when it ends."""

    def __init__(self, model, package_dir=None, buckets=BUCKETS, on_compile=None):
        self.model, self.config, self.lm_head = model, model.config, model.lm_head
        self.package_dir, self.buckets = package_dir, buckets
        self.on_compile = on_compile or (lambda bucket, seconds: None)
        # A compiled pass allocates buffers above glibc's first mmap threshold (128 KiB) on every call,
        # each a fresh mapping faulted in page by page (2-4x slower at one token: docs/2026-12-06-epyc-w.md).
        # Freeing one large mapped block raises that threshold for the process, as glibc does by design.
        torch.empty(16 << 20, dtype=torch.uint8)
        self.static_pass = StaticPass(model)
        self.passes = {}  # bucket -> a callable running StaticPass at that size
        device = model.lm_head.weight.device
        # contiguous, one per bucket: a compiled pass assumes its inputs' strides (a slice of a larger
        # mask would be read with the wrong row stride)
        self._causal = {b: torch.ones(b, b, dtype=torch.bool, device=device).tril() for b in buckets}
        self._eye = {b: torch.eye(b, dtype=torch.bool, device=device) for b in buckets}

    def new_cache(self, scratch, batch_size=1):
        # one capacity for every method, so that each bucket is compiled once, with room for the padding
        return self.model.new_cache(max(scratch, self.buckets[-1]), batch_size)

    @torch.inference_mode()
    def __call__(self, idx, cache=None, pos=None, mask=None, return_hidden=False):
        B, n = idx.size()
        bucket = next((b for b in self.buckets if b >= n), None)
        if cache is None or bucket is None or B != 1 or not isinstance(cache, KVCache):  # a whole one-row cache
            return self.model(idx, cache, pos=pos, mask=mask, return_hidden=return_hidden)
        prefix = cache.length
        if pos is None:
            pos = torch.arange(prefix, prefix + n, device=idx.device)
        self.model.check_positions(pos)
        cache.end_of_pass(bucket)  # room for the padding too, or an overflow error
        if mask is None:
            inner = self._causal[bucket]
        else:
            inner = self._eye[bucket].clone()  # padding rows see only themselves
            inner[:n, :n] = mask
        pad = bucket - n
        args = (nn.functional.pad(idx, (0, pad)), nn.functional.pad(pos, (0, pad)),
                torch.tensor(prefix, device=idx.device), inner, cache.k, cache.v)
        if bucket not in self.passes:
            self.passes[bucket] = self._load_or_compile(bucket, args)
        logits, hidden = (out[:, :n] for out in self.passes[bucket](*args))
        cache.wrote(n)  # the real entries: a commit never keeps the padding
        return (logits, hidden) if return_hidden else logits

    def prepare(self, sizes=None):
        """Load or compile now, rather than on first use, the buckets of passes of `sizes` tokens
        (default: of every size): a timed run must not load a package, let alone compile one."""
        sizes = range(1, self.buckets[-1] + 1) if sizes is None else sizes
        buckets = {next((b for b in self.buckets if b >= n), None) for n in sizes}
        cache = self.new_cache(scratch=0)
        for bucket in sorted(buckets - {None}):
            if bucket <= self.config.block_size:  # no pass is longer than the context
                self(torch.zeros(1, bucket, dtype=torch.long, device=cache.k.device), cache)
                cache.rollback(0)

    def _load_or_compile(self, bucket, args):
        if self.package_dir is None:
            return self.static_pass
        # a hash of the code a pass is compiled from, so that a package built from older code is never loaded
        h = hashlib.sha256()
        for module in (gpt, kernels, reference, sys.modules[__name__]):
            with open(module.__file__, "rb") as f:
                h.update(f.read())
        path = os.path.join(self.package_dir, f"pass{bucket}-capacity{args[-1].size(3)}-code{h.hexdigest()[:12]}.pt2")
        if not os.path.exists(path):
            self.on_compile(bucket, None)
            started = time.perf_counter()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            chatter = io.StringIO()  # the compiler's autotuning tables, kept off the terminal unless it fails
            try:
                with contextlib.redirect_stderr(chatter):
                    program = torch.export.export(self.static_pass, args)
                    backends = GEMM_BACKENDS.get(args[0].device.type, "ATEN")
                    options = dict(COMPILE_OPTIONS, max_autotune_gemm_backends=backends)
                    partial = path.removesuffix(".pt2") + ".partial.pt2"  # written atomically
                    built = torch._inductor.aoti_compile_and_package(program, package_path=partial,
                                                                     inductor_configs=options)
            except Exception:
                print(chatter.getvalue()[-4000:], end="", file=sys.stderr)
                raise
            os.replace(built, path)
            self.on_compile(bucket, time.perf_counter() - started)
        # the runner torch._inductor.aoti_load_package wraps, without importing torch._inductor for it
        # (~2 s on a 2-core CPU, docs/2026-12-06-epyc-w.md); it takes the pass's tensors as one list
        runner = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        return lambda *tensors: runner.boxed_run(list(tensors))
