"""The Triton kernel against the PyTorch reference, under the interpreter on the CPU
(TRITON_INTERPRET=1 is set in conftest.py before triton is imported; compiled on a GPU)."""
import itertools
import sys

import pytest
import torch

import kernels
from decode.tree import Candidates, verify_mask
from kernels import reference_attention
from tests.conftest import tiny_model

if sys.platform != "linux" and not kernels.triton_installed():
    pytest.skip("triton has wheels for Linux only (requirements.txt installs it there)", allow_module_level=True)
# imported plainly, not skipped on failure: on Linux a kernel that does not import is a failure
from kernels.triton_attention import triton_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernel runs; the reference stays on the CPU
# Fixed small tiles (the interpreter's), so that a GPU compiles a few variants instead of autotuning
# every shape of the grid; the whole-model test below takes the autotuned path.
TILES = dict(block_m=16, block_n=16)


def on_device(*tensors):
    return [t.to(DEVICE) for t in tensors]


def make_mask(kind, n, gen):
    """None (causal) or a bool (n, n) mask of the given kind."""
    if kind == "causal":
        return None
    if kind == "random":
        mask = torch.rand(n, n, generator=gen) < 0.4
        mask.fill_diagonal_(True)
        return mask
    if kind == "self-only":  # every row sees only itself among the new positions
        return torch.eye(n, dtype=torch.bool)
    if kind == "medusa":  # a tree: root, then 2-3 children per node, breadth first
        parents = [(i - 1) // 3 - 1 if i > 3 else -1 for i in range(1, n)]
        return verify_mask(parents, tail=1)
    if kind == "lookahead":  # two causal branches that cannot see each other
        half = n // 2
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[:half, :half] = torch.ones(half, half, dtype=torch.bool).tril()
        mask[half:, half:] = torch.ones(n - half, n - half, dtype=torch.bool).tril()
        return mask
    raise ValueError(kind)


def check(n, prefix, head_dim, batch, kind, dtype, num_splits=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 2, n, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, 2, prefix + n, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, 2, prefix + n, head_dim, generator=gen).to(dtype)
    mask = make_mask(kind, n, gen)
    out = triton_attention(*on_device(q, k, v), mask, num_splits=num_splits, **TILES).cpu()
    expected = reference_attention(q.float(), k.float(), v.float(), mask)
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)


NS, PREFIXES, DIMS, KINDS = [1, 2, 3, 7, 16, 40, 64], [0, 1, 15, 64, 257], [16, 32, 64], ["random", "medusa",
                                                                                        "lookahead", "self-only"]
# every (n, P, mask) triple; head dim, batch and dtype cycle along, so each meets every other value
GRID = [(n, p, DIMS[i % 3], 1 + i % 2, kind, (torch.float32, torch.float16)[(i // 2) % 2])
        for i, (n, p, kind) in enumerate(itertools.product(NS, PREFIXES, ["causal"] + KINDS))]


@pytest.mark.parametrize("n,prefix,head_dim,batch,kind,dtype", GRID)
def test_kernel_matches_reference(n, prefix, head_dim, batch, kind, dtype):
    if n == 1 and kind != "causal":
        kind = "self-only"  # the only mask a single new position can have
    check(n, prefix, head_dim, batch, kind, dtype)


@pytest.mark.parametrize("n,prefix,kind", [(1, 257, "causal"), (2, 257, "causal"), (3, 64, "random"),
                                           (7, 257, "medusa"), (16, 257, "lookahead")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_k_decode_path(n, prefix, kind, dtype):
    check(n, prefix, 32, 2, kind, dtype, num_splits=3)


@pytest.mark.parametrize("head_dim", [8, 24, 96])
def test_head_dims_that_are_not_powers_of_two_are_padded(head_dim):
    check(5, 20, head_dim, 1, "random", torch.float32)


@pytest.mark.parametrize("n,kind", [(1, "causal"), (5, "causal"), (6, "random"), (9, "medusa")])
@pytest.mark.parametrize("num_splits", [None, 2])
def test_rows_with_their_own_prefix_lengths(n, kind, num_splits):
    """Ragged lengths, a row of length 0, a mask per row: the kernel reads each row's length and
    stops at its own last key."""
    gen = torch.Generator().manual_seed(n)
    lengths = torch.tensor([0, 140, 3, 257])
    q = torch.randn(4, 2, n, 32, generator=gen)
    k = torch.randn(4, 2, 257 + n, 32, generator=gen)
    v = torch.randn(4, 2, 257 + n, 32, generator=gen)
    masks = [None] if kind == "causal" else [make_mask(kind, n, gen), torch.stack([make_mask(kind, n, gen) for _ in range(4)])]
    for mask in masks:
        out = triton_attention(*on_device(q, k, v), mask, lengths, num_splits=num_splits, **TILES).cpu()
        torch.testing.assert_close(out, reference_attention(q, k, v, mask, lengths), rtol=1e-5, atol=1e-5)


def test_strided_cache_views():
    cache = torch.randn(2, 1, 2, 80, 16, device=DEVICE)  # (L, B, nh, capacity, hs), as model/kv_cache.py holds it
    q = torch.randn(1, 2, 4, 16, device=DEVICE)
    k, v = cache[0, :, :, :30], cache[1, :, :, :30]
    torch.testing.assert_close(triton_attention(q, k, v, **TILES), reference_attention(q, k, v), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_whole_model_gives_the_same_logits_with_either_backend():
    model = tiny_model(dtype=torch.float32).to(DEVICE)  # head dim 16
    prompt = torch.randint(64, (1, 20), generator=torch.Generator().manual_seed(0))
    tree = torch.randint(64, (1, 6), generator=torch.Generator().manual_seed(1))
    candidates = Candidates(tree[0].tolist(), [-1, 0, 0, 1, -1, 4])  # a tree right after the prompt
    pos = 20 - 1 + torch.tensor(candidates.depths())
    prompt, tree, pos, mask = on_device(prompt, tree, pos, verify_mask(candidates.parents, tail=0))
    logits = {}
    for backend in ("torch", "triton"):
        kernels.set_backend(backend)
        try:
            cache = model.new_cache(scratch=6)
            prefill = model(prompt, cache)
            cache.commit()
            verify = model(tree, cache, pos=pos, mask=mask)
            logits[backend] = (prefill, verify)
        finally:
            kernels.set_backend("auto")
    for a, b in zip(logits["torch"], logits["triton"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_gradients_flow_through_attention_in_training():
    """The kernel has no backward pass: the default backend (the reference) carries gradients, and
    an explicit triton backend refuses rather than silently drop them."""
    q, k, v = (torch.randn(1, 2, 5, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    kernels.attention(q, k, v).sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))
    with pytest.raises(ValueError, match="no backward pass"):
        kernels.attention(q, k, v, backend="triton")
    with torch.no_grad():
        torch.testing.assert_close(kernels.attention(q, k, v, backend="triton"), kernels.attention(q, k, v),
                                   rtol=1e-5, atol=1e-5)
