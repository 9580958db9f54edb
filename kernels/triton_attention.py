"""FlashAttention-2-style Triton kernel for kernels.attention: prefix + n new positions, any mask.

One kernel serves every pass. A program owns BLOCK_M new positions (queries) of one (batch, head)
and walks the keys in blocks of BLOCK_N, keeping a running max and sum (online softmax) and an fp32
accumulator, so the scores are never written to memory. The walk has two phases:

              keys:  0 ........... P ........... P+n
    query block  +-----------------------+-----------+
    rows m..m+M  |  phase 1: no masking  |  phase 2  |   phase 2 applies the mask: causal, or
                 +-----------------------+-----------+   the bool (n, n) tree mask read from memory

Phase 1 covers the whole prefix (every query sees it) and, when causal, the new positions every row
of the block sees (keys below P + m); it needs no mask and no bounds checks. Phase 2 covers the
causal band (blocks past the band are never visited) or, with a tree mask, every new position.

Batched decoding gives each row its own committed length P_b (read from `Lengths`): the row's new
keys start at P_b, and its walk ends at P_b + n, never reaching keys that are another row's business.

Split-K ("flash decoding"): with few queries and a long prefix, one (batch, head) would leave
most of the GPU idle, so the keys are cut into SPLITS ranges, one program each; each writes its
normalized partial output and log-sum-exp, and `merge_splits` combines them.
"""
import math

import torch
import triton
import triton.language as tl
import triton.testing

KEY_CHUNK = 128  # split boundaries are multiples of this, so they align with every BLOCK_N


@triton.jit
def _scores(q, k, scale_log2, IEEE: tl.constexpr):
    """q k^T in log2 units; fp32 inputs get IEEE products, not TF32, to match the reference."""
    if IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    return (s * scale_log2).to(tl.float32)  # inductor may hand the scale over as a float64 scalar


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, IEEE: tl.constexpr):
    """Fold one block of scores s (BLOCK_M, BLOCK_N) and values into the running max m_i, sum l_i
    and output accumulator acc, rescaling what came before to the new max."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + pv


@triton.jit
def _attention_kernel(
    Q, K, V, Out, Lse, Mask, Lengths,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_os, stride_on, stride_od,
    stride_mb, stride_mq, stride_mk,
    H, N_NEW, KEYS_PER_SPLIT, scale_log2,
    TUNE_N, TUNE_KEYS,  # autotuning keys only
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr,
):
    pid_m, pid_bh, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = pid_bh // H, pid_bh % H
    PREFIX = tl.load(Lengths + b)  # this row's committed length
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # new positions owned by this program
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < N_NEW
    dim_ok = dims < HEAD_DIM  # head dims are padded up to a power of two
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    total = PREFIX + N_NEW
    start = pid_s * KEYS_PER_SPLIT
    end = tl.minimum(start + KEYS_PER_SPLIT, total)
    if CAUSAL:  # no row of this block sees past its last row's own position
        end = tl.minimum(end, PREFIX + tl.minimum((pid_m + 1) * BLOCK_M, N_NEW))
        free_end = PREFIX + pid_m * BLOCK_M  # keys every row of the block sees
    else:
        free_end = PREFIX
    free_blocks = tl.maximum(tl.minimum(free_end, end) - start, 0) // BLOCK_N
    masked_start = start + free_blocks * BLOCK_N

    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scores, in log2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)                # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # phase 1: full key blocks every row sees; nothing to mask
    for key0 in range(start, masked_start, BLOCK_N):
        keys = key0 + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + keys[None, :] * stride_kn + dims[:, None] * stride_kd, mask=dim_ok[:, None], other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=dim_ok[None, :], other=0.0)
        m_i, l_i, acc = _online_softmax_step(_scores(q, k, scale_log2, IEEE), v, m_i, l_i, acc, IEEE)

    # phase 2: the band of new positions, masked; also the ragged last block
    for key0 in range(masked_start, end, BLOCK_N):
        keys = key0 + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        k = tl.load(k_base + keys[None, :] * stride_kn + dims[:, None] * stride_kd,
                    mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        s = _scores(q, k, scale_log2, IEEE)
        new = keys - PREFIX  # index among the new positions; negative for prefix keys
        if CAUSAL:
            visible = new[None, :] <= rows[:, None]
        else:
            is_new = (new >= 0) & key_ok
            tree = tl.load(Mask + b * stride_mb + rows[:, None] * stride_mq + new[None, :] * stride_mk,
                           mask=row_ok[:, None] & is_new[None, :], other=0)
            visible = (new[None, :] < 0) | (tree != 0)
        s = tl.where(visible & key_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, IEEE)

    seen = l_i > 0  # False for padding rows, and for rows with no visible key in this split
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptr = Out + b * stride_ob + h * stride_oh + pid_s * stride_os + rows[:, None] * stride_on + dims[None, :] * stride_od
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(Lse + (pid_bh * tl.num_programs(2) + pid_s) * N_NEW + rows, lse, mask=row_ok)


def _fitting_configs(configs, named_args, **kwargs):
    """Tiles no larger than the pass needs: a decode step (n = 1) tries only 16-row query tiles, so
    tuning a new shape compiles and times a handful of variants instead of all of them."""
    rows, keys = max(16, named_args["TUNE_N"]), max(32, named_args["TUNE_KEYS"])
    return [c for c in configs if c.kwargs["BLOCK_M"] <= rows and c.kwargs["BLOCK_N"] <= keys]


def _quick_bench(kernel_call, quantiles):
    """Each candidate tile is timed for ~20 ms, not triton's default ~125 ms: a decode run meets
    dozens of shape buckets, and its start-up would otherwise take minutes."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=15, quantiles=quantiles)


# Tuned per power-of-two bucket of queries and keys, not per exact length: decoding meets a new
# prefix length at every step, and re-tuning each time would cost far more than it gains. The
# timings are kept on disk (triton's cache), so a later process does not tune the same bucket again.
_CONFIGS = [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=s) for bm in (16, 64, 128)
            for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3) if not (bm == 16 and w == 8)]
_tuned_kernel = triton.autotune(configs=_CONFIGS, key=["TUNE_N", "TUNE_KEYS", "HEAD_DIM", "CAUSAL"],
                                prune_configs_by=dict(early_config_prune=_fitting_configs),
                                do_bench=_quick_bench, cache_results=True)(_attention_kernel)


def choose_splits(n_programs, total_keys, device):
    """How many key ranges to give each (batch, head, query block): enough programs to fill the GPU,
    but never ranges shorter than 512 keys, whose merge would cost more than it saves."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = math.ceil(2 * sms / n_programs)
    return max(1, min(wanted, total_keys // 512, 64))


def merge_splits(partial, lse):
    """Combine per-split outputs (B, H, S, n, D) with their log2-sum-exps (B, H, S, n)."""
    top = lse.max(dim=2, keepdim=True).values
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weight = torch.exp2(lse - top)  # (B, H, S, n); 0 for empty splits
    return (partial * weight[..., None]).sum(2) / weight.sum(2)[..., None]


def triton_attention(q, k, v, mask=None, lengths=None, num_splits=None, block_m=None, block_n=None):
    """kernels.attention on the Triton kernel; same contract. num_splits forces split-K (tests);
    block_m / block_n fix the tile sizes (the interpreter; the GPU autotunes)."""
    B, H, n, D = q.shape
    total = k.size(2)
    lengths = (torch.full((B,), total - n) if lengths is None else lengths).to(device=q.device, dtype=torch.int32)
    autotune = q.device.type == "cuda" and block_m is None
    if block_m is None and not autotune:  # the interpreter: small tiles, many of them
        block_m, block_n = 16, 16
    splits = num_splits or choose_splits(B * H * triton.cdiv(n, block_m or 64), total, q.device)
    keys_per_split = triton.cdiv(triton.cdiv(total, splits), KEY_CHUNK) * KEY_CHUNK
    splits = triton.cdiv(total, keys_per_split)
    lse = torch.empty(B, H, splits, n, dtype=torch.float32, device=q.device)
    if splits == 1:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        o_strides = (out.stride(0), out.stride(1), 0, out.stride(2), out.stride(3))
    else:
        out = torch.empty(B, H, splits, n, D, dtype=torch.float32, device=q.device)
        o_strides = out.stride()
    if mask is None:
        mask_arg, mask_strides = q, (0, 0, 0)  # never read
    else:
        mask_arg = mask.to(device=q.device, dtype=torch.int8)
        mask_strides = (mask_arg.stride(0) if mask.dim() == 3 else 0, *mask_arg.stride()[-2:])
    args = (q, k, v, out, lse, mask_arg, lengths, *q.stride(), *k.stride(), *v.stride(), *o_strides, *mask_strides,
            H, n, keys_per_split, math.log2(math.e) / math.sqrt(D),
            triton.next_power_of_2(n), triton.next_power_of_2(total))
    constants = dict(HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), CAUSAL=mask is None,
                     IEEE=q.dtype == torch.float32)
    if autotune:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), B * H, splits)  # noqa: E731
        _tuned_kernel[grid](*args, **constants)
    else:
        _attention_kernel[(triton.cdiv(n, block_m), B * H, splits)](*args, BLOCK_M=block_m, BLOCK_N=block_n,
                                                                    **constants)
    return out if splits == 1 else merge_splits(out, lse).to(q.dtype)
