"""Attention over a committed prefix plus n new positions: the PyTorch reference (and the CPU path).

Every pass of the model goes through `attention`: training and prefill (no prefix), single-token
decode (n = 1) and speculative verification (n candidates under a tree mask). The prefix is always
fully visible; only the n x n block among the new positions is masked.

          keys:  prefix (P)        new (n)
    queries  +-----------------+-----------+
    new (n)  |   all visible   |   mask    |
             +-----------------+-----------+

In a batch whose rows have committed different lengths (batched decoding), row b's prefix is its
first P_b keys and its n new keys follow at once; the keys past P_b + n are another row's business
(`lengths`, below).
"""
import torch
import torch.nn.functional as F


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


def reference_attention(q, k, v, mask=None, lengths=None):
    """Scaled dot-product attention of n new queries over P prefix + n new keys.

    q: (B, H, n, D); k, v: (B, H, P+n, D), the cached prefix followed by the n new positions.
    mask: None for causal among the new positions, or a bool (n, n) tensor, True = may attend (or
        (B, n, n), a mask per row), or a bool (n, P+n) tensor over every key (the static-shape path's,
        model/compiled.py: its cache is read whole, so the mask, not the slice, says where the prefix ends).
    lengths: None, or (B,) integers, each row's own prefix P_b <= P: its new keys are k[b, :, P_b:P_b+n]
        and the keys after them are not its own.
    Each row of the mask must allow at least one key when P == 0 (tree masks always allow the diagonal).
    Returns (B, H, n, D).
    """
    n, total = q.size(-2), k.size(-2)
    prefix = total - n
    if prefix < 0 or v.shape != k.shape or q.shape[:2] != k.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(f"attention: q {tuple(q.shape)} does not fit k {tuple(k.shape)} / v {tuple(v.shape)}")
    if lengths is not None or (mask is not None and mask.dim() == 3):
        if mask is not None and (mask.dtype != torch.bool or mask.shape[-2:] != (n, n)):
            raise ValueError(f"attention: a mask with per-row lengths must be bool (n, n) or (B, n, n), "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_pass_mask(q, lengths, mask, total, prefix))
    if mask is None:
        if n == 1:  # a lone query sees everything: no mask at all
            return F.scaled_dot_product_attention(q, k, v)
        if prefix == 0:  # lets PyTorch take its fused causal path
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # query i sees the prefix and new positions 0..i: keys 0..prefix+i
        full = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(prefix)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    if mask.dtype != torch.bool or mask.shape not in ((n, n), (n, total)):
        raise ValueError(f"attention: mask must be a bool ({n}, {n}) or ({n}, {total}) tensor, "
                         f"got {mask.dtype} {tuple(mask.shape)}")
    if mask.shape == (n, total):
        if n == 1:
            return lone_query_attention(q, k, v, mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    full = torch.ones(n, total, dtype=torch.bool, device=q.device)  # (n, P+n)
    full[:, prefix:] = mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=full)


def lone_query_attention(q, k, v, mask):
    """One query's attention written out: a score per key, a softmax, a weighted sum of the values.
    For the static path's decode step (model/compiled.py): compiled, this is fused into the pass's own
    code, where SDPA's CPU kernel stays an external call that costs more than the arithmetic (a
    step 15-40% faster; docs/2026-12-03-epyc-f.md).
    q: (B, H, 1, D); k, v: (B, H, T, D); mask: bool (1, T). Returns (B, H, 1, D)."""
    scores = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5  # (B, H, 1, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))  # fp32 at least
    return weights.to(q.dtype) @ v


_last_pass = None  # (lengths, mask, the additive mask built from them)


def _pass_mask(q, lengths, mask, total, prefix):
    """The additive float mask (B, 1, n, P+n) of a pass whose rows hold different lengths or masks.
    Every layer of a pass asks for the same one, from the same lengths and mask tensors (which the
    model builds for the pass and never changes): it is built for the first layer and reused by the
    others. In a (16, 1) step of the default model on a 2-core CPU (~10 ms) that saves ~90 us a
    layer, SDPA's turning a bool mask into floats in every call included."""
    global _last_pass
    shape = (q.size(0), 1, q.size(-2), total)
    if _last_pass is not None:
        last_lengths, last_mask, built = _last_pass
        if (last_lengths is lengths and last_mask is mask and built.shape == shape
                and built.dtype == q.dtype and built.device == q.device):
            return built
    rows = lengths if lengths is not None else torch.full((q.size(0),), prefix, device=q.device)
    seen = keys_mask(rows, mask, total, q.size(-2))[:, None]  # (B, 1, n, P+n)
    built = torch.zeros(shape, dtype=q.dtype, device=q.device).masked_fill_(~seen, float("-inf"))
    _last_pass = (lengths, mask, built)
    return built
