"""The compiled path: every cached pass of the model through one program compiled ahead of time,
over a cache of static shape, as gpt-fast runs its decode.

A compiler makes a pass fast by fusing its operators and, on a CPU, by packing the weights for GEMM
micro-kernels once, but it compiles a fixed graph. A pass has n new tokens after a committed prefix
of P tokens, and both vary, so:
  - n is the program's one dynamic dimension, 1 <= n <= the context: one program, one copy of the
    weights, serves a decode step, a draft's k + 1 tokens, a tree and a prefill;
  - attention reads the cache's whole capacity under a mask over every slot: the committed prefix,
    then the pass's own n x n mask (causal, or the tree's). P is a tensor in the graph, so the
    program serves every prefix length;
  - the new K/V are written with index_copy_ at the tensor positions P .. P+n-1.
Inside runs the model's own forward with a cache view that writes at tensor positions: there is one
model, compiled or not.

The program is compiled with AOTInductor into one package on disk (weights frozen in, GEMMs
autotuned), built on its first use and loaded in a moment afterwards. In-process torch.compile
builds the same kernels, but its on-disk cache refuses graphs holding the CPU's prepacked weights,
so it would compile again in every run (docs/2026-12-03-epyc-e.md). Without a package folder the
static pass runs eagerly: slower than the plain model, but it checks the masking and writing above.
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

# cache slots beyond the context: every method's candidates fit, so that one capacity, and so one
# package, serves them all
ROOM = 64
# the pass length the compiler tunes for (a dynamic dimension's example must not be 1)
TUNED_FOR = 4
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
    """One pass of n tokens over the whole cache, every input a tensor: what gets compiled."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, pos, prefix, inner, k, v):
        """idx (1, n), pos (n,); prefix: 0-d tensor, the committed length; inner: bool (n, n), who
        sees whom among the new tokens; k, v: the cache's tensors, written in place.
        Returns logits (1, n, vocab) and final hidden states (1, n, C)."""
        mask = kernels.keys_mask(prefix, inner, k.size(3))  # (n, capacity): over every key
        return self.model(idx, _StaticCacheView(k, v, prefix, idx.size(1)), pos=pos, mask=mask, return_hidden=True)


class StaticGPT:
    """A GPT whose cached passes run over a cache of static shape, called like the model, with the same results.

    package_dir: where the compiled program is kept; None runs the static pass eagerly.
    on_compile(seconds) is called as the program's first compile starts (seconds=None) and when it ends."""

    def __init__(self, model, package_dir=None, on_compile=None):
        self.model, self.config, self.lm_head = model, model.config, model.lm_head
        self.package_dir = package_dir
        self.on_compile = on_compile or (lambda seconds: None)
        # A compiled pass allocates buffers above glibc's first mmap threshold (128 KiB) on every call,
        # each a fresh mapping faulted in page by page (2-4x slower at one token: docs/2026-12-06-epyc-w.md).
        # Freeing one large mapped block raises that threshold for the process, as glibc does by design.
        torch.empty(16 << 20, dtype=torch.uint8)
        self.static_pass = StaticPass(model)
        self.programs = {}  # cache capacity -> a callable running StaticPass over a cache of that capacity

    def new_cache(self, scratch, batch_size=1):
        # one capacity for every method, so that one program serves them all
        return self.model.new_cache(max(scratch, ROOM), batch_size)

    @torch.inference_mode()
    def __call__(self, idx, cache=None, pos=None, mask=None, return_hidden=False):
        B, n = idx.size()
        if cache is None or B != 1 or not isinstance(cache, KVCache):  # the program takes a whole one-row cache
            return self.model(idx, cache, pos=pos, mask=mask, return_hidden=return_hidden)
        prefix = cache.length
        if pos is None:
            pos = torch.arange(prefix, prefix + n, device=idx.device)
        self.model.check_positions(pos)
        cache.end_of_pass(n)  # or an overflow error
        if mask is None:
            mask = torch.ones(n, n, dtype=torch.bool, device=idx.device).tril_()
        # contiguous: the program assumes its inputs' strides (a slice of a larger mask would be read wrong)
        args = (idx.contiguous(), pos.contiguous(), torch.tensor(prefix, device=idx.device), mask.contiguous(),
                cache.k, cache.v)
        if cache.capacity not in self.programs:
            self.programs[cache.capacity] = self._load_or_compile(cache)
        logits, hidden = self.programs[cache.capacity](*args)
        cache.wrote(n)
        return (logits, hidden) if return_hidden else logits

    def prepare(self):
        """Load, or compile once, the program now rather than on first use: a timed run must not
        load a package, let alone compile one."""
        cache = self.new_cache(scratch=0)
        self(torch.zeros(1, 1, dtype=torch.long, device=cache.k.device), cache)
        cache.rollback(0)

    def _load_or_compile(self, cache):
        if self.package_dir is None:
            return self.static_pass
        # a hash of the code a pass is compiled from, so that a package built from older code is never loaded
        h = hashlib.sha256()
        for module in (gpt, kernels, reference, sys.modules[__name__]):
            with open(module.__file__, "rb") as f:
                h.update(f.read())
        this_code = f"-code{h.hexdigest()[:12]}.pt2"
        path = os.path.join(self.package_dir, f"passes-capacity{cache.capacity}{this_code}")
        if not os.path.exists(path):
            self.on_compile(None)
            started = time.perf_counter()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tuned, device = min(TUNED_FOR, self.config.block_size), cache.k.device
            example = (torch.zeros(1, tuned, dtype=torch.long, device=device), torch.arange(tuned, device=device),
                       torch.tensor(0, device=device), torch.ones(tuned, tuned, dtype=torch.bool, device=device).tril_(),
                       cache.k, cache.v)
            n = torch.export.Dim("n", min=1, max=self.config.block_size)
            dynamic = ({1: n}, {0: n}, None, {0: n, 1: n}, None, None)  # idx, pos, prefix, inner, k, v
            chatter = io.StringIO()  # the compiler's autotuning tables, kept off the terminal unless it fails
            try:
                with contextlib.redirect_stderr(chatter):
                    program = torch.export.export(self.static_pass, example, dynamic_shapes=dynamic)
                    options = dict(COMPILE_OPTIONS, max_autotune_gemm_backends=GEMM_BACKENDS.get(device.type, "ATEN"))
                    partial = path.removesuffix(".pt2") + ".partial.pt2"  # written atomically
                    built = torch._inductor.aoti_compile_and_package(program, package_path=partial,
                                                                     inductor_configs=options)
            except Exception:
                print(chatter.getvalue()[-4000:], end="", file=sys.stderr)
                raise
            os.replace(built, path)
            for name in os.listdir(self.package_dir):  # packages of older code: never loaded again
                if name.endswith(".pt2") and not name.endswith(this_code):
                    os.remove(os.path.join(self.package_dir, name))
            self.on_compile(time.perf_counter() - started)
        # the runner torch._inductor.aoti_load_package wraps, without importing torch._inductor for it
        # (~2 s on a 2-core CPU, docs/2026-12-06-epyc-w.md); it takes the pass's tensors as one list
        runner = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        return lambda *tensors: runner.boxed_run(list(tensors))
