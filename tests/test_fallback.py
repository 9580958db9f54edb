"""The measured fallback: it keeps the faster of speculating and plain rounds, tries the other again
as often as the time it loses allows, and follows a change in which one is faster."""
import itertools
import json
import random

import pytest
import torch

from decode.fallback import PROBE_GAP, PROBE_SHARE, TRIAL_ROUNDS, Fallback
from decode.methods import make_proposer
from decode.plain import Plain
from decode.sampling import Sampling
from decode.batch import generate_batch
from decode.speculative import generate
from tests.conftest import tiny_model


def run(fallback, rounds, spec_rate, plain_seconds=1.0):
    """Feed `rounds` rounds in which a speculative round gains spec_rate tokens in the time a
    plain round gains one; return the modes chosen."""
    modes = []
    for _ in range(rounds):
        speculated = fallback.speculate()
        modes.append(speculated)
        fallback.record(speculated, spec_rate if speculated else 1.0, plain_seconds)
    return modes


def test_it_tries_both_modes_then_keeps_the_faster():
    modes = run(Fallback(), 2 * TRIAL_ROUNDS + 10, spec_rate=1.5)
    assert modes[:2 * TRIAL_ROUNDS] == [True] * TRIAL_ROUNDS + [False] * TRIAL_ROUNDS
    assert all(modes[2 * TRIAL_ROUNDS:])


def probes(modes):
    """The lengths of the runs of speculative rounds after the trials, and of the plain runs between them."""
    runs = [(m, len(list(r))) for m, r in itertools.groupby(modes[2 * TRIAL_ROUNDS:])]
    return [n for m, n in runs if m], [n for m, n in runs if not m]


def test_where_speculation_is_slower_it_decodes_plainly_and_probing_loses_little_time():
    spec_rate = 0.5
    modes = run(Fallback(), 1000, spec_rate)
    probe_runs, plain_runs = probes(modes)
    assert set(probe_runs) == {TRIAL_ROUNDS} and min(plain_runs[:-1]) > PROBE_GAP
    lost = sum(modes[2 * TRIAL_ROUNDS:]) * (1 - spec_rate)  # seconds a probe round loses against a plain one
    assert lost / len(modes) <= 1.1 * PROBE_SHARE  # the budget, give or take the run's ends


def test_its_probes_lose_no_more_than_their_share_when_rounds_vary():
    """A speculative round gains nothing or one token in a plain round's time, by chance: a probe's
    average is a lucky or an unlucky draw, and probing as often as the last one promised would
    overspend after every lucky one. Charged what they actually lost, the probes keep to the share."""
    draws, fallback, lost, rounds = random.Random(0), Fallback(), 0.0, 20000
    for _ in range(rounds):
        speculated = fallback.speculate()
        gained = draws.choice([0.0, 1.0]) if speculated else 1.0
        lost += fallback.probing * (1.0 - gained)
        fallback.record(speculated, gained, 1.0)
    assert fallback.measured[True] > 2 * TRIAL_ROUNDS and lost / rounds <= PROBE_SHARE


def test_a_probe_is_charged_for_the_held_rounds_it_leaves_apart():
    """A probe that accepts more in one row than another leaves the batch's rows apart, and every
    plain round after it pays for that (10% more here, for the 40 rounds after it): charged for
    those rounds too, probes and what they leave behind keep within the share."""
    fallback, lost, apart_for, rounds = Fallback(), 0.0, 0, 20000
    for _ in range(rounds):
        speculated = fallback.speculate()
        apart_for = 40 if speculated else max(0, apart_for - 1)
        seconds = 1.1 if apart_for and not speculated else 1.0
        lost += 0.5 if speculated else seconds - 1.0  # against plain rounds of rows of one length
        fallback.record(speculated, 0.5 if speculated else 1.0, seconds, apart_for > 0 and not speculated)
    assert fallback.measured[True] > 2 * TRIAL_ROUNDS and lost / rounds <= 1.1 * PROBE_SHARE


def test_a_mode_that_loses_by_little_is_probed_more_often():
    close, far = (len(probes(run(Fallback(), 1000, spec_rate))[0]) for spec_rate in (0.95, 0.3))
    assert close > 2 * far


def test_it_follows_the_faster_mode_when_that_changes():
    fallback = Fallback()
    assert not any(run(fallback, 100, spec_rate=0.5)[-PROBE_GAP:])
    modes = run(fallback, 300, spec_rate=3.0)  # the text turned repetitive: guesses now pay
    switched = modes.index(True) + TRIAL_ROUNDS  # its next probe finds it out, due once the probe's
    assert switched <= TRIAL_ROUNDS * (1 - 0.5) / PROBE_SHARE  # loss is PROBE_SHARE of the rounds since the last
    assert sum(modes[switched:]) / len(modes[switched:]) > 0.9  # plain is probed now


def test_rounds_kept_between_weighings_are_averaged_in_as_if_each_were_at_once():
    """Between weighings a held round is only kept; the averages read afterwards are those of taking
    in each round as it came, and a weighing comes at least every PROBE_GAP rounds."""
    prior = {"speculating": [1.0, 4.0], "plain": [1.0, 1.0], "probe budget": -1e6}  # no probe for long
    fallback, at_once, kept = Fallback(prior), Fallback(prior), []
    for i in range(100):
        seconds = 1.0 + 0.01 * (i % 7)
        assert not fallback.speculate()
        kept.append(len(fallback.standing))
        fallback.record(False, 1.0, seconds)
        at_once.take_in(False, 1.0, seconds)
    assert max(kept) == PROBE_GAP - 1
    assert fallback.averages() == at_once.averages()


def test_a_held_verdict_turns_within_PROBE_GAP_rounds_of_plain_becoming_the_slower():
    """Weighed only now and then, the verdict still follows the averages: plain rounds that slow from
    1 s to 10 s (another process took the cores) fall below speculating's 1 token in 4 s."""
    fallback, modes = Fallback(), []
    for i in range(60):
        speculated = fallback.speculate()
        modes.append(speculated)
        fallback.record(speculated, 1.0, 4.0 if speculated else 1.0 if i < 10 else 10.0)
    assert not any(modes[2 * TRIAL_ROUNDS:10])
    assert modes.index(True, 10) <= 13 + PROBE_GAP  # plain's average passes 4 s in its 4th slow round


def test_a_speculating_verdict_gives_way_in_the_round_its_average_falls_behind():
    """Only a held verdict waits to be weighed: speculating, whose rounds cost more than a line or
    two, is weighed every round, so a run of losing rounds (a lucky probe's verdict) ends as soon as
    its average shows it."""
    fallback = Fallback()
    run(fallback, 40, spec_rate=1.5)
    modes = run(fallback, 20, spec_rate=0.3)
    assert modes.index(False) <= 7  # speculating's average falls below plain's 1 token a second in its 6th round


def test_it_starts_from_the_averages_an_earlier_run_kept_and_pays_no_first_trials():
    """Where speculation lost, plain rounds from the first, and its first probe, like every later
    one, within the budget; where it paid, speculation from the first."""
    earlier = Fallback()
    run(earlier, 200, spec_rate=0.5)
    prior = json.loads(json.dumps(earlier.averages()))  # as generate.py keeps it
    modes = run(Fallback(prior), 1000, spec_rate=0.5)
    assert modes.index(True) > PROBE_GAP
    assert sum(modes) * (1 - 0.5) / len(modes) <= 1.1 * PROBE_SHARE  # the start included
    earlier = Fallback()
    run(earlier, 200, spec_rate=1.5)
    assert all(run(Fallback(earlier.averages()), PROBE_GAP, spec_rate=1.5))


def test_averages_kept_for_a_smaller_batch_keep_their_verdict_here():
    """A larger batch starting from a smaller one's averages (cli.kept_fallback), where speculating
    lost: every round takes 3x as long here, so beside plain rounds timed here the prior's quicker
    speculating rounds would look the faster and be tried. Scaled by as much as plain's, they are
    held, as the smaller batch held them, until a probe is due."""
    prior = {"speculating": [1.2, 1.5], "plain": [1.0, 1.0], "probe budget": 0.0}  # speculating 0.8x as fast
    modes = run(Fallback(prior), 50, spec_rate=1.2, plain_seconds=3.0)
    assert not any(modes)


def test_runs_too_short_for_a_probe_save_up_its_time_from_run_to_run():
    """Kept averages that have plain rounds three times too slow (measured in a bad moment), then runs
    of 30 rounds, too short for the probe's budget: the budget saved up carries over, so plain is
    probed again once it covers a probe (speculation at 0.5 a round, a plain probe expected to lose
    3 - 2 seconds a round), and wins."""
    prior = {"speculating": [1.0, 1.0], "plain": [1.0, 3.0], "probe budget": 0.0}
    modes = []
    for _ in range(4 * round(1 / PROBE_SHARE) // 30):
        fallback = Fallback(prior)
        modes += run(fallback, 30, spec_rate=0.5)
        prior = json.loads(json.dumps(fallback.averages()))
    assert modes[0] and False in modes[:round(1.2 * TRIAL_ROUNDS * (3 - 2) / PROBE_SHARE)]
    assert sum(modes[-5 * 30:]) <= 0.1 * 5 * 30  # plain, but for the probes


def test_a_held_method_still_says_what_plain_decoding_says():
    model = tiny_model(block_size=32)
    fallback = Fallback()
    alone, _ = generate(model, [1, 2, 3], 60, Sampling())
    (out,), (stats,) = generate_batch(model, [[1, 2, 3]], 60, Sampling(), proposers=[make_proposer("jacobi", "4", model)],
                                      fallback=fallback)
    assert out == alone
    assert fallback.measured[True] >= TRIAL_ROUNDS and fallback.measured[False] >= TRIAL_ROUNDS
    assert stats.held_rounds >= TRIAL_ROUNDS


class SpeculatesOnce:
    """A fallback that speculates in its second round only (the first prefills), and keeps what it is told."""

    def __init__(self):
        self.rounds, self.left_apart = 0, []

    def speculate(self):
        self.rounds += 1
        return self.rounds == 2

    def record(self, speculated, gained, seconds, left_apart):
        self.left_apart.append(left_apart)


def test_the_batch_says_which_rounds_rows_were_left_apart_by_speculating():
    """Prompts of one length go apart where a speculative round accepted more in one row than another
    (the first row's draft is the target itself, the others propose nothing), until the row ahead
    finishes; prompts of different lengths were apart from the first, whatever the rounds did."""
    model = tiny_model(block_size=48)
    for prompts, apart in (([[1, 2, 3], [4, 5, 6], [7, 7, 7]], True), ([[1, 2, 3], [4, 5], [7, 7, 7]], False)):
        fallback = SpeculatesOnce()
        proposers = [make_proposer("draft", "3", model, draft_model=model)] + [Plain(), Plain()]
        generate_batch(model, prompts, 20, Sampling(), proposers=proposers, fallback=fallback)
        assert fallback.left_apart[:2] == [False, apart] and (True in fallback.left_apart) == apart


class AlwaysPlain:
    """A fallback that holds every round plain."""

    def speculate(self):
        return False

    def record(self, *measured):
        pass


class TensorOps(torch.overrides.TorchFunctionMode):
    """Records the tensor operations run inside it, reading an attribute (a shape) aside."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func.__name__ != "__get__":
            self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_held_round_runs_nothing_but_the_target():
    """Counted, not timed: with every round held, no method proposes, no module but the target's
    runs a forward (a draft model, EAGLE's head) nor counts one (Medusa's heads), and no update runs
    a tensor operation: it keeps what it is handed and reads shapes, and an index or an argmax waits
    for a round that proposes."""
    from tests.test_batch import METHODS, PROMPTS, TARGET
    target_modules, plain = set(TARGET.modules()), generate_batch(TARGET, PROMPTS, 40, Sampling())[0]
    others = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: others.append(type(module).__name__) if module not in target_modules else None)
    try:
        for method, new_proposer in METHODS.items():
            proposers, ops = [new_proposer() for _ in PROMPTS], []
            method_class = type(proposers[0])
            update = method_class.update

            def recorded(self, *args):
                with TensorOps(ops):
                    return update(self, *args)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(method_class, "propose_rows", None)  # calling it would fail
                patch.setattr(method_class, "update", recorded)
                outputs, stats = generate_batch(TARGET, PROMPTS, 40, Sampling(), proposers=proposers,
                                                fallback=AlwaysPlain())
            assert outputs == plain, method
            assert others == [] and all(s.draft_forwards == 0 and s.held == 1 for s in stats), method
            assert ops == [], method
    finally:
        hook.remove()
