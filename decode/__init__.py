"""Decoding methods. Each is a proposer of candidate tokens (decode/proposer.py) for the one shared
loop, decode.speculative.generate (decode.batch.generate_batch, the engine, for a batch of prompts
and the fallback); plain decoding is the proposer that proposes nothing.
decode.methods builds any of them by name from its setting."""
from decode.batch import generate_batch
from decode.draft import DraftModel
from decode.eagle import Eagle
from decode.fallback import Fallback
from decode.jacobi import Jacobi
from decode.lookahead import Lookahead
from decode.medusa import Medusa
from decode.plain import Plain
from decode.prompt_lookup import PromptLookup
from decode.proposer import Proposer
from decode.speculative import generate

__all__ = ["DraftModel", "Eagle", "Fallback", "Jacobi", "Lookahead", "Medusa", "Plain", "PromptLookup", "Proposer", "generate", "generate_batch"]
