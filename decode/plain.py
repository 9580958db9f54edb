"""Plain autoregressive decoding, one target forward per new token: in the shared loop
(decode/speculative.py), the method that never proposes anything. It is the baseline: every
speculative method must say exactly what this says (greedy), or draw from exactly the distribution
this draws from (sampling), only with fewer target forwards.
"""
from decode.proposer import Proposer


class Plain(Proposer):
    def propose(self, tokens, max_depth, sampling, generator):
        return None
