"""What a round did (Round, as the per-round hook sees it) and the figures every method reports."""
from collections import Counter
from dataclasses import dataclass, field, fields

from decode.tree import Candidates
from decode.verify import Verdict

PHASES = ("propose", "pass", "verify", "commit", "update")  # of a round, in order (DecodeStats.phase_seconds)


@dataclass
class Round:
    """One round of one sequence: what was proposed, what the verifier decided, the tokens it added."""
    candidates: Candidates
    verdict: Verdict
    new: list                 # (token, source) for each token added: "draft", "corrected", "bonus" or "target"
    width: int = 0            # in a batch: the checked size its pass was padded to (0: not padded)
    held: bool = False        # a Fallback kept the round plain
    phase_seconds: dict = field(default_factory=dict)  # by PHASES, where the decoder times them
    logits: object = None     # the pass's, at [root, candidates..., side...]: a trace replays the verdict on them


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0  # every pass of the target, prefill and re-prefills included
    pass_sizes: Counter = field(default_factory=Counter)  # passes by tokens checked or carried: root,
    #                                                       candidates, side branch (not the uncached context)
    # in a batch, passes by their width: each row's pass_sizes entry, padded to the longest row's,
    # which is what a batched pass pays for
    pass_widths: Counter = field(default_factory=Counter)
    draft_forwards: int = 0
    held_rounds: int = 0      # rounds a Fallback (decode/fallback.py) kept plain, speculation being measured slower
    judged: int = 0           # candidates the verifier accepted or rejected
    accepted: int = 0         # of those, the ones it kept
    # rounds whose candidates were judged at depth d (the path reached depth d-1 and went on to
    # depth d), and those whose accepted path reached depth d
    depth_judged: Counter = field(default_factory=Counter)
    depth_accepted: Counter = field(default_factory=Counter)
    seconds: float = 0.0      # from the call to the row's last token, less the time its caller took streaming
    # where the time of the rounds went: "propose", "pass" (inputs built and the target's forward),
    # "verify", "commit" (the cache and the token list) and "update" (the method's own)
    phase_seconds: Counter = field(default_factory=Counter)

    @property
    def tau(self):
        """New tokens per target forward: 1 for plain decoding, more when speculation pays."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def alpha(self):
        """Acceptance rate of the candidates judged; None for a method that proposes nothing."""
        return self.accepted / self.judged if self.judged else None

    def record(self, outcome):
        """Count one Round: the per-round hook every decoder calls."""
        self.target_forwards += 1
        checked = outcome.candidates.checked_size()
        self.pass_sizes[checked] += 1
        self.pass_widths[outcome.width or checked] += 1
        self.judged += outcome.verdict.judged
        self.accepted += len(outcome.verdict.path)
        self.held_rounds += outcome.held
        self.phase_seconds.update(outcome.phase_seconds)
        offered, accepted = max(outcome.candidates.depths(), default=0), len(outcome.verdict.path)
        for d in range(1, min(offered, accepted + 1) + 1):
            self.depth_judged[d] += 1
            self.depth_accepted[d] += d <= accepted

    def acceptance_at(self, depth):
        """P(a candidate at `depth` is accepted | the path was accepted up to it and went deeper):
        for a chain, the acceptance of its depth-th guess; None if never judged there."""
        judged = self.depth_judged[depth]
        return self.depth_accepted[depth] / judged if judged else None

    def _mean_over_passes(self, value, sizes=None):
        """The mean of value(n) over the passes, n being a pass's size (or its entry in `sizes`)."""
        sizes = self.pass_sizes if sizes is None else sizes
        return sum(value(n) * count for n, count in sizes.items()) / max(1, sizes.total())

    @property
    def mean_pass(self):
        return self._mean_over_passes(lambda n: n)

    def pass_cost(self, r, padded=False):
        """Mean cost of a pass in single-token steps, for the cost curve r = [r(1), r(2), ...];
        padded: of the batched passes, by their width."""
        return self._mean_over_passes(lambda n: r[min(n, len(r)) - 1], self.pass_widths if padded else None)

    @property
    def rounds(self):
        return self.pass_sizes.total()

    @property
    def held(self):
        """The share of the rounds a Fallback kept plain: 1 for a method that turned itself off."""
        return self.held_rounds / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self):
        return self.new_tokens / self.seconds if self.seconds else 0.0

    def __iadd__(self, other):
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self
