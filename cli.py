"""What the command-line tools share: argument parsing, device and dtype choice, error reporting."""
import argparse
import sys

import torch

import kernels
from errors import UserError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other error of ours."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def run(main):
    """Run main(); a UserError becomes one line on stderr and exit status 2, never a traceback."""
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def add_device_args(parser, dtype_help="default: float32 on CPU, bfloat16 on CUDA"):
    parser.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:N, mps")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help=dtype_help)


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name} asked for, but CUDA is not available here (try --device cpu)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps asked for, but MPS is not available here (try --device cpu)")
    try:
        return str(torch.device(name))
    except RuntimeError:
        raise UserError(f"unknown --device {name!r} (auto, cpu, cuda, cuda:N, mps)") from None


def resolve_dtype(name, device):
    if name is None:
        return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    return DTYPES[name]


def add_attn_arg(parser):
    parser.add_argument("--attn", choices=kernels.BACKENDS, default="auto",
                        help="attention kernel: triton (CUDA, or TRITON_INTERPRET=1 on the CPU), torch "
                             "(the PyTorch reference), auto (triton on CUDA, else torch) (default auto)")


def use_attn(name, device, dtype):
    """Make `name` the attention backend of every later forward, if it can run here."""
    if name == "triton":
        if not kernels.triton_installed():
            raise UserError("--attn triton needs the triton package (Linux only): pip install triton")
        if not kernels.triton_usable(device):
            raise UserError("--attn triton runs on CUDA; set TRITON_INTERPRET=1 to run it (slowly) on the CPU "
                            "under Triton's interpreter")
        if dtype not in kernels.TRITON_DTYPES:
            raise UserError(f"--attn triton supports float32, float16 and bfloat16, not {dtype}")
    kernels.set_backend(name)
