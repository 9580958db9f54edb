"""Decoding methods. Each is a proposer of candidate tokens for the one shared loop,
decode.speculative.generate; plain decoding is the proposer that proposes nothing."""
from decode.draft import DraftModel
from decode.jacobi import Jacobi
from decode.lookahead import Lookahead
from decode.medusa import Medusa
from decode.ngram import PromptLookup
from decode.plain import Plain
from decode.speculative import generate

SPEC_METHODS = ("none", "draft", "jacobi", "lookahead", "ngram", "medusa")

__all__ = ["DraftModel", "Jacobi", "Lookahead", "Medusa", "Plain", "PromptLookup", "generate", "SPEC_METHODS"]
