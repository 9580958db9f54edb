"""Attention over a committed prefix plus n new positions, written from its definition: the
reference the backends (kernels/__init__.py's torch, kernels/triton_attention.py) are tested against.

Every pass of the model is this: training and prefill (no prefix), single-token decode (n = 1) and
speculative verification (n candidates under a tree mask). The prefix is always fully visible; only
the n x n block among the new positions is masked.

          keys:  prefix (P)        new (n)
    queries  +-----------------+-----------+
    new (n)  |   all visible   |   mask    |
             +-----------------+-----------+
"""
import torch


def reference_attention(q, k, v, mask=None, lengths=None):
    """Scaled dot-product attention of n new queries over P prefix + n new keys.

    q: (B, H, n, D); k, v: (B, H, P+n, D), the cached prefix followed by the n new positions.
    mask: None for causal among the new positions, or a bool (n, n) tensor, True = may attend (or
        (B, n, n), a mask per row).
    lengths: None, or (B,) integers, each row's own prefix P_b <= P: its new keys are k[b, :, P_b:P_b+n]
        and the keys after them are not its own.
    Each row of the mask must allow at least one key when P == 0 (tree masks always allow the diagonal).
    Returns (B, H, n, D).
    """
    check_shapes(q, k, v, mask)
    n, total = q.size(-2), k.size(-2)
    if lengths is None:  # every row's prefix is P
        lengths = torch.full((q.size(0),), total - n, device=q.device)
    return masked_attention(q, k, v, keys_mask(lengths, mask, total, n)[:, None])  # mask (B, 1, n, P+n)


def masked_attention(q, k, v, seen):
    """softmax(q k^T / sqrt(D)) v over the keys `seen` (bool, broadcast to (B, H, n, T)) allows."""
    scores = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5  # (B, H, n, T)
    scores = scores.masked_fill(~seen, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))  # fp32 at least
    return weights.to(q.dtype) @ v


def keys_mask(lengths, inner, total, n=None):
    """Which of `total` keys each new position sees, when the new keys follow a committed prefix of
    `lengths` keys: the prefix, then what `inner` (bool (n, n) or (B, n, n)) allows among the new,
    or with inner=None, each of the n new positions itself and those before it (causal).
    lengths: a 0-d tensor (one prefix for every row) or (B,). Returns bool (n, total) or (B, n, total)."""
    key = torch.arange(total, device=lengths.device)
    if inner is None:  # a comparison, cheaper than the gather below: key <= prefix + i
        return key <= lengths[..., None, None] + torch.arange(n, device=lengths.device)[:, None]
    n = inner.size(-1)
    offset = key - lengths[..., None]  # a key's place among the new positions: (total,) or (B, total)
    new = (offset >= 0) & (offset < n)
    inner = inner.expand(*offset.shape[:-1], n, n)
    seen = torch.gather(inner, -1, offset.clamp(0, n - 1)[..., None, :].expand(*offset.shape[:-1], n, total))
    return (offset < 0)[..., None, :] | (new[..., None, :] & seen)


def check_shapes(q, k, v, mask):
    """Refuse inputs that do not fit reference_attention's contract."""
    n = q.size(-2)
    if k.size(-2) < n or v.shape != k.shape or q.shape[:2] != k.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(f"attention: q {tuple(q.shape)} does not fit k {tuple(k.shape)} / v {tuple(v.shape)}")
    if mask is not None and (mask.dtype != torch.bool or mask.dim() > 3 or mask.shape[-2:] != (n, n)):
        raise ValueError(f"attention: mask {mask.dtype} {tuple(mask.shape)} is not a bool ({n}, {n}) or (B, {n}, {n})")
