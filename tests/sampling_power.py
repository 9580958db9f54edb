"""The power of the sampling-exactness tests (tests/test_sampling_exactness.py), measured over seeds.

    python -m tests.sampling_power [--seeds 40] [--first-seed 0] [--tokens 4800] [--batch-size 1]
                                   [--flaws all|none|only] [--jobs 2] [SETTING ...]

For every setting of tests/exactness.py and every flaw that applies to it, runs the test with seeds
first..first+S-1 and prints, as a Markdown table, the share of seeds in which the real verifier passes and
each flawed one is caught. Beside each share: the effect size, lambda per token (the mean G's
excess over its degrees of freedom, per token: about 0 for the real verifier), and the share that
effect predicts at the test's sample size from the noncentral chi-square distribution (for the
real verifier, 1 - SIGNIFICANCE by construction).
"""
import argparse
import math
import multiprocessing
from collections import defaultdict

import torch

import decode.verify
from decode.verify import verify_sampling
from tests.exactness import SETTINGS, SIGNIFICANCE, TOKENS, flawed_verifier, sampled_fit


def chi_square_quantile(df, p_value):
    """The x with P(chi-square_df > x) = p_value, by bisection."""
    low, high = 0.0, df + 100.0 * math.sqrt(df) + 100.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if noncentral_sf(mid, df, 0.0) > p_value else (low, mid)
    return (low + high) / 2


def noncentral_sf(x, df, noncentrality):
    """P(X > x) for X noncentral chi-square: a Poisson(noncentrality / 2) mixture of central ones."""
    half = noncentrality / 2
    total, k = 0.0, 0
    while k < 50 + 4 * half:
        weight = math.exp(-half + k * math.log(half) - math.lgamma(k + 1)) if half > 0 else float(k == 0)
        total += weight * float(torch.special.gammaincc(torch.tensor((df + 2 * k) / 2, dtype=torch.float64),
                                                        torch.tensor(x / 2, dtype=torch.float64)))
        k += 1
    return total


def one_run(task):
    name, flaw, seed, tokens, batch_size = task
    torch.set_num_threads(1)
    decode.verify.verify_sampling = flawed_verifier(flaw) if flaw else verify_sampling
    return task, sampled_fit(SETTINGS[name], tokens, seed, batch_size)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="*", default=list(SETTINGS))
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--flaws", choices=["all", "none", "only"], default="all",
                        help="none: the real verifier only; only: the flawed ones only")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    verifiers = {"all": lambda name: [None, *SETTINGS[name].flaws()], "none": lambda name: [None],
                 "only": lambda name: SETTINGS[name].flaws()}[args.flaws]
    tasks = [(name, flaw, seed, args.tokens, args.batch_size) for name in args.settings for flaw in verifiers(name)
             for seed in range(args.first_seed, args.first_seed + args.seeds)]
    fits = defaultdict(list)
    with multiprocessing.Pool(args.jobs) as pool:
        for (name, flaw, *_), fit in pool.imap_unordered(one_run, tasks):
            fits[name, flaw].append(fit)
    print(f"seeds {args.first_seed} to {args.first_seed + args.seeds - 1}, {args.tokens} tokens a test, batch size {args.batch_size}, "
          f"significance {SIGNIFICANCE}\n")
    print("| setting | verifier | share of seeds passed (real) or caught (flawed) | lambda per token | predicted |")
    print("|---|---|---|---|---|")
    for (name, flaw), group in fits.items():
        df = max(fit[1] for fit in group)
        rejected = sum(fit[2] < SIGNIFICANCE for fit in group)
        share = (len(group) - rejected if flaw is None else rejected) / len(group)
        finite = [fit[0] for fit in group if math.isfinite(fit[0])]
        effect = max(0.0, (sum(finite) / len(finite) - df) / args.tokens) if finite else math.inf
        caught = (noncentral_sf(chi_square_quantile(df, SIGNIFICANCE), df, effect * args.tokens)
                  if math.isfinite(effect) else 1.0)
        predicted = 1 - SIGNIFICANCE if flaw is None else caught  # the real verifier's: by construction
        print(f"| {name} | {flaw or 'real'} | {share:.1%} | {effect:.5f} | {predicted:.1%} |", flush=True)


if __name__ == "__main__":
    main()
