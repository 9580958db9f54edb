"""Benchmark the Triton attention kernel beside PyTorch's scaled_dot_product_attention (GPU only).

    python kernels/bench.py                  # every case, fp16 and bf16
    python kernels/bench.py --dtype bfloat16 --cases decode

Cases: causal prefill (P = 0, n = 1K..16K; SDPA takes its flash path), single-token decode
(n = 1, P = 1K..32K; split-K on our side) and tree verification (n = 4..256, P = 1K..8K, a Medusa-
style tree mask; SDPA needs an explicit (n, P+n) mask). Each case is first checked against the
torch backend (the reference's scores would not fit), then timed with triton.testing.do_bench.
FLOPs = 4 B H n L D (halved for causal prefill); bytes = Q, K, V and the output, crossing HBM once.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import keys_mask, sdpa_attention  # noqa: E402

CASES = {
    "prefill": [(n, 0) for n in (1024, 2048, 4096, 8192, 16384)],
    "decode": [(1, p) for p in (1024, 2048, 4096, 8192, 16384, 32768)],
    "verify": [(n, p) for p in (1024, 4096, 8192) for n in (4, 16, 64, 256)],
}


def medusa_mask(n):
    """A tree mask: the root, then three children per node, breadth first; each sees its ancestors."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[(i - 1) // 3]
    return mask


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["float16", "bfloat16"], nargs="+", default=["float16", "bfloat16"])
    p.add_argument("--cases", choices=list(CASES), nargs="+", default=list(CASES))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: kernels/bench.py times the kernel on a CUDA GPU, and there is none here", file=sys.stderr)
        return 2
    import triton.testing

    from kernels.triton_attention import triton_attention
    B, H, D = args.batch, args.heads, args.head_dim
    print(f"# {torch.cuda.get_device_name()}, B={B} H={H} D={D}")
    print(f"{'case':<8}{'dtype':<10}{'n':>7}{'P':>7}{'ours ms':>10}{'TFLOP/s':>9}{'GB/s':>8}"
          f"{'sdpa ms':>10}{'TFLOP/s':>9}{'GB/s':>8}{'vs sdpa':>11}")
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for case in args.cases:
            for n, prefix in CASES[case]:
                total = prefix + n
                q, k, v = (torch.randn(B, H, m, D, device="cuda", dtype=dtype) for m in (n, total, total))
                mask = medusa_mask(n).cuda() if case == "verify" else None
                expected = sdpa_attention(q.float(), k.float(), v.float(), mask)
                torch.testing.assert_close(triton_attention(q, k, v, mask).float(), expected, atol=2e-2, rtol=2e-2)
                if case == "prefill":
                    sdpa_args = dict(is_causal=True)
                else:  # (n, P+n): the prefix, then the mask
                    sdpa_args = dict(attn_mask=keys_mask(torch.tensor(prefix, device="cuda"), mask, total, n))
                ours_ms = triton.testing.do_bench(lambda: triton_attention(q, k, v, mask))
                sdpa_ms = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(q, k, v, **sdpa_args))
                flops = 4 * B * H * n * total * D * (0.5 if case == "prefill" else 1.0)
                nbytes = (2 * q.numel() + k.numel() + v.numel()) * q.element_size()
                rates = "".join(f"{ms:>10.3f}{flops / ms / 1e9:>9.1f}{nbytes / ms / 1e6:>8.0f}"
                                for ms in (ours_ms, sdpa_ms))
                print(f"{case:<8}{dtype_name:<10}{n:>7}{prefix:>7}{rates}{sdpa_ms / ours_ms:>10.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
