"""Decoding methods. Each is a proposer of candidate tokens for the one shared loop,
decode.speculative.generate; plain decoding is the proposer that proposes nothing."""
from decode.draft import DraftModel
from decode.plain import Plain
from decode.speculative import generate

SPEC_METHODS = ("none", "draft")

__all__ = ["DraftModel", "Plain", "generate", "SPEC_METHODS"]
