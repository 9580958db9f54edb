"""Attention kernels. The model calls only `attention`, so a faster kernel plugs in here.

kernels/reference.py states what every backend computes, written from the definition. Backends:
"torch" (below: PyTorch's scaled_dot_product_attention, SDPA) and "triton"
(kernels/triton_attention.py, one FlashAttention-2-style kernel). "auto" takes torch everywhere
(docs/2026-12-04-h200.md). Triton is imported only when first used, so the project runs where it is
not installed (Linux wheels only).
"""
import importlib.util
import os

import torch
import torch.nn.functional as F

from kernels.reference import check_shapes, keys_mask, masked_attention, reference_attention

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
    """reference_attention (kernels/reference.py: shapes, masks, lengths) by the chosen backend.
    A bool (n, T) mask over every key is the static path's (model/compiled.py reads its cache whole):
    served here whatever the backend, as the Triton kernel reads (n, n) masks only. A lone query (the
    decode step) is written out: compiled, it fuses into the pass's own code, where SDPA stays an
    external call (docs/2026-12-03-epyc-f.md)."""
    if mask is not None and mask.size(-1) == k.size(-2) != q.size(-2):
        if q.size(-2) == 1:
            return masked_attention(q, k, v, mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    backend = backend or _backend
    if backend in ("auto", "torch"):
        return sdpa_attention(q, k, v, mask, lengths)
    if backend != "triton":
        raise ValueError(f"unknown attention backend {backend!r}; backends: {', '.join(BACKENDS)}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("the triton attention backend has no backward pass: train with the torch backend")
    from kernels.triton_attention import triton_attention
    return triton_attention(q, k, v, mask, lengths)


def sdpa_attention(q, k, v, mask=None, lengths=None):
    """The "torch" backend: reference_attention by SDPA. Training and prefill take its fused causal
    path, a decode step needs no mask at all, and rows of different lengths share one mask a pass."""
    check_shapes(q, k, v, mask)
    n, total = q.size(-2), k.size(-2)
    prefix = total - n
    if lengths is not None or (mask is not None and mask.dim() == 3):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_pass_mask(q, lengths, mask, total, prefix))
    if mask is None and n == 1:  # a lone query sees every key
        return F.scaled_dot_product_attention(q, k, v)
    if mask is None and prefix == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    seen = torch.ones(n, total, dtype=torch.bool, device=q.device)  # (n, P+n): the prefix, then the mask
    if mask is None:
        seen = seen.tril(prefix)  # query i sees keys 0..P+i
    else:
        seen[:, prefix:] = mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen)


_last_pass = (None, None, None)  # the lengths and mask tensors of the last pass, its additive mask


def _pass_mask(q, lengths, mask, total, prefix):
    """The additive float mask (B, 1, n, P+n) of a pass whose rows hold different lengths or masks.
    Every layer of a pass asks for the same one, from the same lengths and mask tensors (built for the
    pass, never changed): the first layer builds it, the others reuse it (docs/2026-12-05-epyc-l.md)."""
    global _last_pass
    last_lengths, last_mask, built = _last_pass
    shape = (q.size(0), 1, q.size(-2), total)
    if (last_lengths is not lengths or last_mask is not mask or built is None or built.shape != shape
            or built.dtype != q.dtype or built.device != q.device):
        if mask is None:
            built = _causal_rows_mask(lengths, q.size(-2), total, q.dtype)
        else:
            rows = lengths if lengths is not None else torch.full((q.size(0),), prefix, device=q.device)
            built = _additive(keys_mask(rows, mask, total, q.size(-2))[:, None], q.dtype)  # (B, 1, n, P+n)
        _last_pass = (lengths, mask, built)
    return built


def _additive(seen, dtype):
    """A bool mask as SDPA's additive one: 0 where seen, -inf elsewhere."""
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))


_last_causal = (None, None)  # the key of the last causal mask of rows of different lengths, that mask


def _causal_rows_mask(lengths, n, total, dtype):
    """The additive mask (B, 1, n, P+n) of a causal pass over rows of different lengths. Counted back
    from the last key it depends only on how far each row is behind the longest, so a mask built wider
    serves every later pass of the same rows going on by the same steps (plain decoding), sliced to its
    keys: building it anew was a sixth of what such a step paid over one of rows of one length
    (docs/2026-12-06-epyc-ab.md)."""
    global _last_causal
    rows = lengths.tolist()
    key = (tuple(max(rows) - length for length in rows), n, dtype, lengths.device)
    last_key, wide = _last_causal
    if last_key != key or wide.size(-1) < total:
        width = 2 * total
        aligned = lengths - max(rows) + width - n  # each row's prefix, were the pass to end at key `width`
        wide = _additive(keys_mask(aligned, None, width, n)[:, None], dtype)  # (B, 1, n, width)
        _last_causal = (key, wide)
    return wide[..., -total:]


__all__ = ["attention", "keys_mask", "reference_attention", "sdpa_attention", "set_backend", "triton_installed",
           "triton_usable", "BACKENDS"]
