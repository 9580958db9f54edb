"""The contract between the shared loop (decode/speculative.py) and a decoding method.

A proposer guesses; the target decides. Each round the loop asks the proposer for candidates, runs
them through the target in one verify pass, lets the verifier keep the longest acceptable path, and
tells the proposer what happened. A proposer never touches the target's cache and never chooses an
output token, which is why no method can change what the model says.

    start(prompt)                        a new generation begins: reset per-text state
    propose(tokens, max_depth, sampling, generator) -> Candidates | None
                                         candidates after the last accepted token, at most
                                         max_depth deep (the room left in the context window)
    propose_rows(proposers, texts, max_depths, sampling, generator) -> [Candidates | None]
                                         (a class method) propose for the rows of a batch that
                                         use this method, one proposer each; by default each
                                         row's propose (none where max_depth is 0). A method whose
                                         drafter can run the rows together overrides it
    update(tokens, verdict, logits, hidden)
                                         the round's outcome: tokens now ends with the accepted path
                                         and the target's next token; logits holds the pass's
                                         outputs (B=1 removed) at [root, candidates..., side...],
                                         hidden its final hidden states at every row: the tail of
                                         accepted tokens it cached (ending with the root), then
                                         the candidates and the side branch

    max_candidates   the most tokens a proposal adds to a pass besides the root (sizes the cache's
                     scratch space)
    forwards         drafting forwards run since start(): a draft model's, the EAGLE head's, the
                     Medusa heads' (0 for methods that draft with the target itself)
    verify           None: the loop's exact verifier decides. A method may declare a lossy rule
                     instead, verify(logits, candidates, sampling, generator) -> Verdict; it must
                     say so to the user (Medusa's typical acceptance is the one such rule).
"""
from decode.tree import Candidates
from decode.verify import Verdict


class Proposer:
    max_candidates = 0
    forwards = 0
    verify = None

    def start(self, prompt: list) -> None:
        pass

    def propose(self, tokens: list, max_depth: int, sampling, generator) -> Candidates | None:
        raise NotImplementedError

    @classmethod
    def propose_rows(cls, proposers: list, texts: list, max_depths: list, sampling, generator) -> list:
        return [proposer.propose(tokens, max_depth, sampling, generator) if max_depth > 0 else None
                for proposer, tokens, max_depth in zip(proposers, texts, max_depths)]

    def update(self, tokens: list, verdict: Verdict, logits, hidden) -> None:
        pass
