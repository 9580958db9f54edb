"""Sizing: each round, the proposal of most expected tokens per unit of time, by measured Costs.

AutoK sizes a draft model's k (--k auto), TreeSizing EAGLE's tree, LookaheadSizing lookahead's
pass. A drafter's forwards are timed in the loop as it goes (DrafterCost); what does not pay is
switched off (a plain step) and probed again by a Backoff, ever more rarely: the estimates that
switched it off are of the past, and the text changes.
"""
from itertools import accumulate
from typing import NamedTuple

from decode.cost import cost_curve, profile_prefix

COST_DECAY = 0.2                         # the weight of the newest timing in the running cost of a drafter's forward
ALPHA_PRIOR, PRIOR_WEIGHT = 0.6, 4       # AutoK: the acceptance assumed before any round is judged
PROBE_ROUNDS, MAX_PROBE_ROUNDS = 16, 64  # AutoK: plain rounds before a probe (a whole round of draft steps)
OUTLOOK_DECAY = 0.2                      # TreeSizing: weight of the newest round in the running outlook
FIRST_PROBE, MAX_PROBE_GAP = 4, 64       # rounds to a probe, at first and at most (EAGLE and lookahead)
WINDOW_PRIOR, WINDOW_PRIOR_WEIGHT = 0.5, 2  # tokens a lookahead window pass is assumed to earn, worth 2 passes


class Costs(NamedTuple):
    """What sizing knows of this machine; StoredCosts keeps it (a JSON list)."""
    r: list                       # [r(1), r(2), ...]: a target pass of n tokens against a plain step
    c: float = 0.0                # a drafter's forward in target steps (none: lookahead's)
    seconds: float | None = None  # that forward's seconds, timed alone


def measure(target, largest, batch_size=1, tree=False, repeats=7, drafter=None, drafters_per_step=1):
    """Costs timed now: r of passes of up to `largest` tokens in each of batch_size rows, timed up to
    half the context and extended by its slope; with `drafter` (a function timing a forward), c:
    drafters_per_step forwards (batch_size for a drafter running row by row) per target step."""
    prefix = profile_prefix(target)
    r, step = cost_curve(target, min(largest, prefix), prefix, repeats, tree, batch_size)
    slope = (r[-1] - r[0]) / max(1, len(r) - 1)
    r = list(r) + [r[-1] + slope * i for i in range(1, largest - len(r) + 1)]
    seconds = drafter() if drafter else None
    return Costs(r, drafters_per_step * seconds / step, seconds) if drafter else Costs(r)


class Backoff:
    """When to probe a part switched off for not paying: `first` rounds after it last paid (the
    probe's round counted), `second` (2 * first) later, then each wait twice the last, at most
    `longest`. `left`: the rounds to the first probe before anything has paid (`first`)."""

    def __init__(self, first, longest, second=None, left=None):
        self.first, self.second, self.longest = first, second or min(2 * first, longest), longest
        self.left, self.gap = first if left is None else left, self.second

    def restart(self):
        """The part paid."""
        self.left, self.gap = self.first, self.second

    def count(self):
        """A round passes; True once a probe is due."""
        self.left -= 1
        return self.left <= 0

    def probe(self):
        self.left, self.gap = self.gap, min(2 * self.gap, self.longest)


class DrafterCost:
    """Sizing with a drafter: c as the loop pays it, timed alone, then rescaled by the loop's timing,
    where forwards run slower (the target's pass evicted the drafter's weights from the cache;
    EAGLE's tree bookkeeping). costs: Costs, or any (r, c, seconds)."""

    def __init__(self, costs):
        self.costs = Costs(*costs)
        self.r, self.c = self.costs.r, self.costs.c

    def timed(self, seconds, forwards):
        """`forwards` of the drafter's forwards took `seconds` in the loop."""
        paid = seconds / forwards / self.costs.seconds
        self.c = (1 - COST_DECAY) * self.c + COST_DECAY * self.costs.c * paid


def predicted_speedup(alpha, k, r, c):
    """Tokens per unit of time with k guesses, in plain steps: E(k) / (r(k+1) + k*c), E(k) the expected
    tokens of a round whose guesses are each accepted independently with probability alpha."""
    expected = k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected / (r[k] + k * c)


class AutoK(DrafterCost):
    """The k from 1 to k_max of most predicted_speedup at the running acceptance alpha; 0 (a plain
    step) where none beats 1, but for a Backoff's probes. In a batch r and c are all its rows'."""

    def __init__(self, costs, k_max):
        super().__init__(costs)
        self.k_max = k_max

    def start(self):
        self.accepted = self.judged = 0
        self.backoff = Backoff(PROBE_ROUNDS, MAX_PROBE_ROUNDS)

    def choose(self):
        alpha = (self.accepted + ALPHA_PRIOR * PRIOR_WEIGHT) / (self.judged + PRIOR_WEIGHT)
        k = max(range(1, self.k_max + 1), key=lambda k: predicted_speedup(alpha, k, self.r, self.c))
        if predicted_speedup(alpha, k, self.r, self.c) > 1:
            self.backoff.restart()
        elif self.backoff.count():
            self.backoff.probe()
        else:
            return 0
        return k

    def record(self, accepted, judged):
        self.accepted += accepted
        self.judged += judged


class TreeSizing(DrafterCost):
    """A depth is expanded while its best nodes' values sum to c at least (a head forward repaid);
    the tree keeps the n best nodes of most (1 + sum of their values) / (r(n + 1) + forwards * c),
    n = 0 included. While the outlook (a running mean of those best rates) is below 1, the proposer
    sits rounds out, catching up neither, but for probes, which propose a node at least."""

    def __init__(self, costs):
        super().__init__(costs)
        self.outlook = 1.0  # optimistic at first
        self.probing = False
        self.backoff = Backoff(FIRST_PROBE, MAX_PROBE_GAP, second=FIRST_PROBE, left=0)  # at once before any pays

    def sits_out(self):
        """Whether this round proposes nothing."""
        due = self.backoff.count()
        self.probing = self.outlook < 1 and due
        if self.probing:
            self.backoff.probe()
        return self.outlook < 1 and not due

    def count(self, values, forwards):
        """How many of the nodes of these values (best first) to propose, after `forwards` head forwards."""
        gains = accumulate(values, initial=0.0)
        rates = [(1 + gain) / (self.r[n] + forwards * self.c) for n, gain in enumerate(gains)]
        best = max(range(1 if self.probing else 0, len(rates)), key=rates.__getitem__)
        self.outlook = (1 - OUTLOOK_DECAY) * self.outlook + OUTLOOK_DECAY * rates[best]
        if self.outlook >= 1:
            self.backoff.restart()
        return best


class ReachTally:
    """reach(d): P(at least d candidates accepted | the candidates offered went d deep), counted
    over the passes so far, so that the expected accepted candidates of depth D are reach(1..D)
    summed. Before any pass reach(d) = prior^d, worth `weight` passes: every depth gets tried."""

    def __init__(self, max_depth, prior=0.5, weight=2):
        self.hits, self.tries = [0] * (max_depth + 1), [0] * (max_depth + 1)
        self.prior, self.weight = prior, weight

    def reach(self, depth):
        return (self.hits[depth] + self.prior ** depth * self.weight) / (self.tries[depth] + self.weight)

    def expected(self, depth):
        return sum(self.reach(d) for d in range(1, depth + 1))

    def record(self, offered, accepted):
        for d in range(1, offered + 1):
            self.tries[d] += 1
            self.hits[d] += accepted >= d


class LookaheadSizing:
    """Fu et al. size W, N, G to an accelerator's idle compute; on a CPU fixed sizes lose to plain
    decoding. So a pass takes the verification depth (0..N-1) and the window or not, of most
    (1 + E[accepted candidates] + E[tokens owed to the window]) / r(pass size), by running counts;
    now and then (a Backoff never restarted) the largest pass instead."""

    def __init__(self, costs, levels, window_tokens):
        self.r, self.window_tokens = costs.r, window_tokens
        self.reach = ReachTally(levels)
        self.window_earned = self.window_passes = 0
        self.backoff = Backoff(FIRST_PROBE, MAX_PROBE_GAP)

    def size(self, grams, window_fits):
        """(verification depth, whether the window rides) for the pool's n-grams after the root."""
        window_gain = ((self.window_earned + WINDOW_PRIOR * WINDOW_PRIOR_WEIGHT)
                       / (self.window_passes + WINDOW_PRIOR_WEIGHT))
        rides = (False, True) if window_fits else (False,)
        options = [(depth, ride) for depth in range(max(map(len, grams), default=0) + 1) for ride in rides]

        def tokens_per_cost(option):
            depth, ride = option
            trie = {tuple(seq[:d]) for seq in grams for d in range(1, min(depth, len(seq)) + 1)}  # shared prefixes once
            size = 1 + len(trie) + (self.window_tokens if ride else 0)
            return (1 + self.reach.expected(depth) + (window_gain if ride else 0)) / self.r[size - 1]

        best, largest = max(options, key=tokens_per_cost), options[-1]
        if self.backoff.count() and best != largest:
            self.backoff.probe()
            return largest
        return best

    def record(self, depth, accepted, window_earned, rode):
        """A pass offered candidates `depth` deep; `accepted` were, window_earned by the window's n-grams."""
        self.reach.record(depth, accepted)
        self.window_earned += window_earned
        self.window_passes += rode
