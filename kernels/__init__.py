"""Attention kernels. The model calls only `attention`, so a faster kernel plugs in here."""
from kernels.attention import attention

__all__ = ["attention"]
