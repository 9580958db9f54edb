"""The figures every decoding method reports."""
from dataclasses import dataclass, fields


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0  # every pass of the target, prefill and re-prefills included
    pass_tokens: int = 0      # tokens checked or carried per pass: root, candidates, side branch
    draft_forwards: int = 0
    drafted: int = 0          # draft tokens the verifier judged
    accepted: int = 0         # of those, the ones it kept
    seconds: float = 0.0

    @property
    def tau(self):
        """New tokens per target forward: 1 for plain decoding, more when speculation pays."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def alpha(self):
        """Acceptance rate of drafted tokens; None for a method that drafts nothing."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_s(self):
        return self.new_tokens / self.seconds if self.seconds else 0.0

    def __iadd__(self, other):
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self
