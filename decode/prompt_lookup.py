"""Prompt lookup: speculation with no draft model, only the text itself.

If the last few tokens occurred earlier in the context, guess that what followed them then follows
them now (Hugging Face's prompt_lookup_num_tokens, vLLM's n-gram proposer). The longest match
length with any earlier occurrence wins; its most recent occurrences each give a continuation, and
several continuations go in as a tree. Pays off when the text copies itself (quoting, code edits,
a passage continued verbatim) and costs little when it does not.
"""
from decode.proposer import Proposer
from decode.tree import Candidates

MAX_MATCH = 3      # the longest suffix looked up
NUM_PROPOSED = 5   # tokens proposed per match
NUM_MATCHES = 2    # matches verified together as a tree


class PromptLookup(Proposer):
    def __init__(self, max_match=MAX_MATCH, num_proposed=NUM_PROPOSED, num_matches=NUM_MATCHES):
        self.max_match, self.num_proposed, self.num_matches = max_match, num_proposed, num_matches
        self.max_candidates = num_proposed * num_matches

    def propose(self, tokens, max_depth, sampling, generator):
        length = min(self.num_proposed, max_depth)
        for match in range(min(self.max_match, len(tokens) - 1), 0, -1):
            suffix = tokens[-match:]
            continuations = []
            for start in range(len(tokens) - match - 1, -1, -1):  # most recent occurrence first
                if tokens[start:start + match] == suffix:
                    follow = tokens[start + match:start + match + length]
                    if follow not in continuations:
                        continuations.append(follow)
                    if len(continuations) == self.num_matches:
                        break
            if continuations:
                return Candidates.from_sequences(continuations)
        return None
