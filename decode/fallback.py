"""Falling back to plain decoding where speculation does not pay, by measuring both.

Whether checking guesses beats plain steps depends on more than a cost model sees (a batch's rows
padded to the longest pass, drafters run row by row, the text), so the loop times its own rounds:
the tokens gained per second, speculating and plain, as running averages, and lets the rows propose
only while speculating is the faster. A batch is done when its last row is, so a round gains what
its row furthest behind gains: over a run these add up to the tokens each row wrote, where the
rows' mean gain would overrate speculation, which runs some rows ahead of the rest
(docs/2026-12-06-epyc-x.md). Since the text and the acceptance change, the losing mode is tried
again (a probe) as time allows: probes may lose 1/128 of the decoding time, charged what each of
their rounds actually lost, and one starts once the time saved up covers what it is expected to
lose. A mode that loses by little is probed often, one that loses by much (a large batch's
speculation) rarely; a probe that loses more than expected (its last average was a lucky one)
delays the next, and so does one that leaves a batch's rows apart, for what their plain rounds
then take beyond plain's average. Speculating's verdict is weighed every round; plain's, once a
probe could start and at least every PROBE_GAP rounds, a held round in between being only kept, to
be averaged in then: at a compiled pass's speed every line a held round runs shows
(docs/2026-12-07-epyc-ad.md). A new decoder tries both modes first, unless it starts from the
averages an earlier one kept. A plain round and a speculative one say the same thing (greedy) or
sample from the same distribution, so falling back never changes an output.
"""
import math

TRIAL_ROUNDS = 2          # measured rounds of a mode before it is judged, at the start and in each probe
PROBE_GAP = 16            # the fewest rounds between probes, the most between plain's weighings; a mode resting
                          # longer restarts its average
PROBE_SHARE = 1 / 128     # the most of the time that probing the losing mode may lose (docs/2026-12-06-epyc-y.md)
DECAY = 0.1               # the weight of the latest round in a mode's running average
MODES = {True: "speculating", False: "plain"}


class Fallback:
    """One per decoder, kept across its generations (what it learns carries over). The loop asks
    speculate() before each round and reports the round with record()."""

    def __init__(self, prior=None):
        """prior: the averages() an earlier Fallback of the same decoder kept (generate.py and bench.py
        keep them with the costs): it starts from that verdict instead of trying both modes first,
        the one loss its probe budget cannot bound, and with the budget saved up (or owed), so
        that short runs still probe in turn. A mode's prior gives way to its first new round, and
        scales the other's prior by as much: a prior from a smaller batch, where every round is
        quicker and speculating gains more, keeps the verdict it came with until both modes are
        measured here."""
        self.gained = {True: 0.0, False: 0.0}     # mode (True: speculated) -> running mean of the tokens a round gains
        self.seconds = {True: 0.0, False: 0.0}    # mode -> running mean of a round's seconds
        self.measured = {True: 0, False: 0}       # rounds recorded in all
        self.streak = {True: 0, False: 0}         # rounds recorded since the mode was taken up again
        self.last_recorded = {True: 0, False: 0}  # the round (of self.recorded) the mode was last recorded in
        self.recorded = 0
        self.best = True
        self.rounds = 0                     # speculate() calls
        self.first_probe = PROBE_GAP + 1    # the earliest round (of self.rounds) a probe may start in
        self.next_weighing = 0              # till this round, the verdict stands and no probe starts
        self.standing = []                  # (gained, seconds) of the rounds recorded since: averaged in then
        self.probe_budget, self.probe_left, self.probing = 0.0, 0, False  # the seconds probes may still lose
        self.from_prior = set()  # the modes whose averages are still the prior's
        if prior and all(prior[name][1] > 0 for name in MODES.values()):
            for mode, name in MODES.items():
                (self.gained[mode], self.seconds[mode]), self.measured[mode] = prior[name], TRIAL_ROUNDS
            self.best, self.probe_budget = self.rate(True) >= self.rate(False), prior.get("probe budget", 0.0)
            self.from_prior = set(MODES)

    def averages(self):
        """What a later Fallback(prior=...) starts from: JSON, each mode's average tokens and seconds
        per round, and the probes' budget."""
        self.take_in_standing()
        return dict({name: [self.gained[mode], self.seconds[mode]] for mode, name in MODES.items()},
                    **{"probe budget": self.probe_budget})

    def rate(self, speculated):
        """Tokens gained per second in the rounds that did (or did not) speculate."""
        return self.gained[speculated] / self.seconds[speculated]

    def speculate(self):
        self.rounds += 1
        self.probing = False  # whether this round is a probe's, to be charged what it loses
        if self.rounds < self.next_weighing:  # with record()'s two lines, a held round's whole cost here
            return self.best
        self.take_in_standing()
        for mode in (True, False):
            if self.measured[mode] < TRIAL_ROUNDS:
                return mode
        if self.probe_left:
            self.probe_left, self.probing = self.probe_left - 1, True
            return not self.best
        best = self.rate(True) >= self.rate(False)
        if best != self.best:  # a new verdict saves up anew, and still owes what probes overspent
            self.best, self.probe_budget = best, min(self.probe_budget, 0.0)
            self.first_probe = self.rounds + PROBE_GAP
        # the rounds till a probe may start: the budget grows by PROBE_SHARE of every round
        wait = max(self.first_probe - self.rounds,
                   math.ceil((self.probe_loss() - self.probe_budget) / (PROBE_SHARE * self.seconds[best])))
        if wait > 0:
            if not best:  # held: weighed again then, or sooner, as plain's average moves
                self.next_weighing = self.rounds + min(wait, PROBE_GAP)
            return best
        self.first_probe = self.rounds + TRIAL_ROUNDS + PROBE_GAP
        self.probe_left, self.probing = TRIAL_ROUNDS - 1, True
        return not best

    def probe_loss(self):
        """The seconds a probe of the losing mode is expected to lose."""
        return TRIAL_ROUNDS * max(0.0, self.loss(self.seconds[not self.best], self.gained[not self.best]))

    def loss(self, seconds, gained):
        """The seconds a round that gained `gained` tokens in `seconds` took beyond what the best mode takes for them."""
        return seconds - gained / self.rate(self.best)

    def record(self, speculated, gained, seconds, left_apart=False):
        """A round of the batch: whether its pass checked guesses (any row's candidates or side
        tokens), the tokens it gained (its row furthest behind's), its seconds; left_apart: whether
        its rows held different lengths only because earlier rounds speculated (their prompts had one
        length). Rounds that (re-)prefill a window are not reported: they cost the same in either mode."""
        if self.rounds < self.next_weighing and speculated == self.best and not left_apart:
            self.standing.append((gained, seconds))
            return
        self.take_in_standing()
        self.take_in(speculated, gained, seconds, left_apart)

    def take_in_standing(self):
        """Average in, in order, the rounds kept while the verdict stood, as record() would have at
        each: nothing reads the averages before the next weighing."""
        for gained, seconds in self.standing:
            self.take_in(self.best, gained, seconds)
        self.standing = []

    def take_in(self, speculated, gained, seconds, left_apart=False):
        """One round into the averages and the probes' budget (record()'s arguments)."""
        self.recorded += 1
        self.probe_budget += PROBE_SHARE * seconds
        if left_apart and not (speculated or self.best or self.probing):  # plain's verdict implies its average
            # a held round over rows a probe left apart pays for a mask and a scattered write
            # (docs/2026-12-06-epyc-aa.md): the probe's cost, not plain decoding's
            self.probe_budget -= seconds - self.seconds[False]
            self.last_recorded[False] = self.recorded
            return
        if self.probing:
            self.probe_budget -= self.loss(seconds, gained)  # what it lost, or won
        if speculated in self.from_prior:
            self.from_prior.discard(speculated)
            for other in self.from_prior:
                self.seconds[other] *= seconds / self.seconds[speculated]
        rested = self.recorded - self.last_recorded[speculated] > PROBE_GAP  # its old average is stale
        self.streak[speculated] = 1 if rested else self.streak[speculated] + 1
        self.last_recorded[speculated] = self.recorded
        self.measured[speculated] += 1
        weight = max(DECAY, 1 / self.streak[speculated])  # a plain mean until the average has enough rounds
        for average, value in ((self.gained, gained), (self.seconds, seconds)):
            average[speculated] += weight * (value - average[speculated])
