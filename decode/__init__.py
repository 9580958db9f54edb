"""Decoding methods. Each takes (model, prompt ids, max_new_tokens, Sampling, generator, on_token)
and returns (new token ids, DecodeStats)."""
from decode import plain

METHODS = {"none": plain.generate}
