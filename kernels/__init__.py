"""Attention kernels. The model calls only `attention`, so a faster kernel plugs in here.

Backends: "torch" (kernels/reference.py, PyTorch's scaled_dot_product_attention with an explicit
mask) and "triton" (kernels/triton_attention.py, one FlashAttention-2-style kernel). "auto" takes
the reference everywhere: on an H200, SDPA ran every decode and verify shape measured 2-9x faster
than the kernel, which spends ~0.3 ms per call whatever its size (docs/2026-12-04-h200.md). Triton
is imported only when first used, so the project runs where it is not installed (Linux wheels only).
"""
import importlib.util
import os

import torch

from kernels.reference import keys_mask, reference_attention

BACKENDS = ("auto", "triton", "torch")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_backend = "auto"


def triton_installed():
    return importlib.util.find_spec("triton") is not None


def triton_usable(device):
    """Whether the Triton kernel can run for tensors on `device`: on CUDA, or anywhere under the
    interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    return triton_installed() and (torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def set_backend(name):
    """Choose the backend every later `attention` call uses by default."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; backends: {', '.join(BACKENDS)}")
    _backend = name


def attention(q, k, v, mask=None, lengths=None, backend=None):
    """Attention of n new queries over P cached + n new keys; see kernels/reference.py for the contract.
    q: (B, H, n, D); k, v: (B, H, P+n, D); mask: None (causal), bool (n, n) or (B, n, n) among the new
    positions, or bool (n, P+n) over every key; lengths: None or (B,), each row's own prefix length.
    Returns (B, H, n, D)."""
    backend = backend or _backend
    if mask is not None and mask.size(-1) != q.size(-2):
        backend = "torch"  # a mask over every key is the static-shape path's, which the reference serves
    if backend in ("auto", "torch"):
        return reference_attention(q, k, v, mask, lengths)
    if backend != "triton":
        raise ValueError(f"unknown attention backend {backend!r}; backends: {', '.join(BACKENDS)}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("the triton attention backend has no backward pass: train with the torch backend")
    from kernels.triton_attention import triton_attention
    return triton_attention(q, k, v, mask, lengths)


__all__ = ["attention", "keys_mask", "reference_attention", "set_backend", "triton_installed", "triton_usable", "BACKENDS"]
