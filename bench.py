"""Measure decoding methods side by side on held-out prompts.

    python bench.py                           # every method, greedy, 8 prompts from the val split
    python bench.py --temperature 1 --json
    python bench.py --methods draft --k 2,4,auto --plot speedup.png
    python bench.py --methods lookahead --lookahead 5,3,5 7,4,7
    python bench.py --methods ngram --prompt-lookup 3,5,2 1,8,64
    python bench.py --profile                 # the verify-pass cost curve r(n)

Rows run interleaved round-robin over the prompts (the order rotating from prompt to prompt), so
machine noise hits every method alike; speedup is each row's tokens/s over plain decoding's in this
same run; a second plain row, last, shows how far apart two identical rows land (the noise). Beside
it, the speedup the cost model predicts from the measured tau:
tau / (mean r(n) + d*c), with r(n) the target's verify-pass cost curve at each pass's size n
(averaged over the passes, whose sizes vary for sized lookahead), d the draft forwards per target
forward and c the draft's step cost (for k draft guesses: r(k+1) + k*c).
"""
import json
import os
import sys

import torch

import cli
from data import read_text, split_text
from decode import SPEC_METHODS, DraftModel, Jacobi, Lookahead, Plain, PromptLookup, generate
from decode.cost import cost_curve, forward_seconds
from decode.stats import DecodeStats
from errors import UserError
from generate import (LOOKAHEAD_DEFAULT, add_sampling_args, load_draft, load_heads, lookahead_proposer,
                      medusa_proposer, parse_k, setup)

DEFAULT_KS = "1,2,3,4,5,6,7,8,auto,heuristic"
DEFAULT_LOOKAHEAD = ["2,2,2", "5,3,5", "7,4,7"]  # W,N,G, fixed sizes
DEFAULT_PROMPT_LOOKUP = ["3,5,2"]  # --match-len, --num-proposed, --num-matches
DEFAULT_JACOBI = [2, 5]
DEFAULT_TREES = [4, 8, 32]
NOISE_ROW = "none again (noise)"


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="out", help="directory holding target.pt (and draft.pt) (default: out)")
    p.add_argument("--data", default=None,
                   help="text whose val split gives the prompts (default: the data the model was trained on)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from: {', '.join(SPEC_METHODS)} (default: every method whose "
                        "checkpoint exists); plain decoding always runs, as the baseline")
    p.add_argument("--k", default=DEFAULT_KS, help=f"draft rows: values of --k (default {DEFAULT_KS})")
    p.add_argument("--lookahead", nargs="+", default=DEFAULT_LOOKAHEAD, metavar="W,N,G",
                   help=f"lookahead rows with fixed sizes, besides the sized default (default "
                        f"{' '.join(DEFAULT_LOOKAHEAD)})")
    p.add_argument("--sized", action="store_true",
                   help="also a sized (--sizing auto) lookahead row within each --lookahead W,N,G")
    p.add_argument("--prompt-lookup", nargs="+", default=DEFAULT_PROMPT_LOOKUP, metavar="L,P,M",
                   help=f"ngram rows: longest suffix looked up L, tokens proposed P, matches M (default "
                        f"{' '.join(DEFAULT_PROMPT_LOOKUP)}, generate.py's defaults); 1,8,64 offers every "
                        "earlier continuation of the last token: the most that copying from the text can get")
    p.add_argument("--trees", nargs="+", type=int, default=DEFAULT_TREES, metavar="N",
                   help=f"medusa rows: tree sizes besides chain and the saved tree (default "
                        f"{' '.join(map(str, DEFAULT_TREES))})")
    p.add_argument("--jacobi", nargs="+", type=int, default=DEFAULT_JACOBI, metavar="W",
                   help=f"jacobi rows: windows (default {' '.join(map(str, DEFAULT_JACOBI))})")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    add_sampling_args(p, temperature=0.0)
    p.set_defaults(max_new_tokens=128)
    cli.add_device_args(p)
    cli.add_attn_arg(p)
    p.add_argument("--profile", action="store_true", help="measure r(n) instead of decoding")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", help="draw measured and predicted draft speedup against k into this PNG "
                                  "(needs matplotlib)")
    return p.parse_args(argv)


def parse_triple(flag, config):
    """Three integers from 1 to 64 out of a row flag's value such as 5,3,5."""
    try:
        values = tuple(int(x) for x in config.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(1 <= v <= 64 for v in values):
        raise UserError(f"{flag} takes three comma-separated numbers from 1 to 64, like 5,3,5; got {config!r}")
    return values


def held_out_prompts(tokenizer, text, n, length, seed):
    """n prompts of `length` tokens at random places in the val split."""
    val = tokenizer.encode(split_text(text)[1])
    if len(val) <= length:
        raise UserError(f"the val split has {len(val)} tokens, too few for prompts of {length}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(val) - length, (n,), generator=gen).tolist()
    return [val[s:s + length] for s in starts]


def run_interleaved(model, proposers, prompts, sampling, max_new_tokens, seed):
    """Total DecodeStats per row {label: proposer}, rows interleaved round-robin over the prompts."""
    labels = list(proposers)
    totals = {label: DecodeStats() for label in labels}
    for label in labels:  # warm-up: first calls pay for allocation
        generate(model, prompts[0], 4, sampling, proposer=proposers[label])
    for i, prompt in enumerate(prompts):
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            generator = torch.Generator(model.lm_head.weight.device).manual_seed(seed + i)  # same draws for all
            _, stats = generate(model, prompt, max_new_tokens, sampling, generator, proposer=proposers[label])
            totals[label] += stats
    return totals


def print_profile(model, header, json_out):
    block_size = model.config.block_size
    # prefixes that leave room for the new positions inside the context
    max_n = min(64, block_size // 2)
    prefixes = sorted({1, (block_size - max_n) // 2, block_size - max_n})
    curves = {p: cost_curve(model, max_n, p) for p in prefixes}
    if json_out:
        print(json.dumps(dict(header, profile={str(p): dict(r=r, seconds_1=s) for p, (r, s) in curves.items()})))
        return
    print(f"# {header['command']}  ({header['device']}, {header['dtype']}, {header['params_millions']}M "
          f"parameters, {header['threads']} threads)")
    print("verify-pass cost r(n) = time(n new tokens) / time(1), after P cached tokens")
    print("   n " + "".join(f"{'P=' + str(p):>9}" for p in prefixes))
    for n in range(1, max_n + 1):
        print(f"{n:>4} " + "".join(f"{curves[p][0][n - 1]:>9.2f}" for p in prefixes))
    print("time(1): " + ", ".join(f"P={p} {curves[p][1] * 1e3:.2f} ms" for p in prefixes))


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install matplotlib") from None
    fixed = [r for r in rows if r["k"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["k"] for r in fixed], [r["speedup"] for r in fixed], "o-", label="measured")
    ax.plot([r["k"] for r in fixed], [r["predicted_speedup"] for r in fixed], "s--", label="predicted")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("draft tokens per round k")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    sampling, device, dtype, model, tokenizer, state = setup(args)
    block_size = model.config.block_size
    header = dict(command="python " + " ".join(sys.argv), device=device, dtype=str(dtype).removeprefix("torch."),
                  params_millions=round(model.num_params() / 1e6, 2), threads=torch.get_num_threads())
    if args.profile:
        print_profile(model, header, args.json)
        return 0

    if args.methods is None:
        needs = {"draft": "draft.pt", "medusa": "medusa.pt"}  # methods with a checkpoint of their own
        methods = [m for m in SPEC_METHODS if m not in needs or os.path.exists(os.path.join(args.out_dir, needs[m]))]
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in SPEC_METHODS]
    if unknown or not methods:
        raise UserError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; methods: {', '.join(SPEC_METHODS)}")
    if args.num_prompts < 1:
        raise UserError("--num-prompts must be at least 1")
    if not 1 <= args.prompt_len <= block_size:
        raise UserError(f"--prompt-len must be between 1 and the model's context of {block_size}")

    proposers = {"none": Plain()}
    draft = load_draft(args.out_dir, tokenizer, device, dtype) if "draft" in methods else None
    if draft is not None:
        for value in [v.strip() for v in args.k.split(",") if v.strip()]:
            proposers[f"draft k={value}"] = DraftModel(draft, *parse_k(value), target=model)
    if "jacobi" in methods:
        for window in args.jacobi:
            proposers[f"jacobi W={window}"] = Jacobi(model, window)
    if "lookahead" in methods:
        proposers[f"lookahead auto {','.join(map(str, LOOKAHEAD_DEFAULT))} (default)"] = lookahead_proposer(
            model, *LOOKAHEAD_DEFAULT)
        for config in args.lookahead:
            window, ngram, guesses = parse_triple("--lookahead", config)
            if ngram < 2:
                raise UserError(f"--lookahead {config}: N must be at least 2")
            proposers[f"lookahead {config}"] = Lookahead(model, window, ngram, guesses)
            if args.sized:
                proposers[f"lookahead auto {config}"] = lookahead_proposer(model, window, ngram, guesses)
    if "ngram" in methods:
        for config in args.prompt_lookup:
            proposers[f"ngram {config}"] = PromptLookup(*parse_triple("--prompt-lookup", config))
    if "medusa" in methods:
        heads, medusa_state = load_heads(args.out_dir, model, tokenizer, device, dtype)
        proposers["medusa chain"] = medusa_proposer(heads, medusa_state, "chain")
        proposers[f"medusa tree={len(medusa_state['tree'])} (saved)"] = medusa_proposer(heads, medusa_state)
        for size in args.trees:
            proposers[f"medusa tree={size}"] = medusa_proposer(heads, medusa_state, tree_size=size)
        proposers["medusa typical (LOSSY)"] = medusa_proposer(heads, medusa_state, typical=True)
    proposers[NOISE_ROW] = Plain()  # plain decoding again: how far two identical rows land apart here
    max_pass = min(64, max(p.max_candidates for p in proposers.values()) + 1)
    cost = dict(r=cost_curve(model, max_pass, block_size - 64 if block_size > 64 else 0)[0])
    if draft is not None:
        cost["c"] = forward_seconds(draft, 1, draft.config.block_size // 2) / forward_seconds(model, 1, block_size // 2)

    text = read_text(args.data or state.get("data"))
    prompts = held_out_prompts(tokenizer, text, args.num_prompts, args.prompt_len, args.seed)
    totals = run_interleaved(model, proposers, prompts, sampling, args.max_new_tokens, args.seed)

    base = totals["none"].tokens_per_s
    rows = []
    for label, s in totals.items():
        predicted = s.tau / (s.pass_cost(cost["r"]) + cost.get("c", 0.0) * s.draft_forwards / s.target_forwards)
        k = getattr(proposers[label], "k_start", None) if getattr(proposers[label], "schedule", "") == "fixed" else None
        rows.append(dict(method=label, k=k, tau=s.tau, alpha=s.alpha, target_forwards=s.target_forwards,
                         draft_forwards=s.draft_forwards, mean_pass=s.mean_pass, tokens_per_s=s.tokens_per_s,
                         speedup=s.tokens_per_s / base, predicted_speedup=predicted, new_tokens=s.new_tokens))
    if args.plot:
        plot(rows, args.plot)
    settings = dict(num_prompts=args.num_prompts, prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, **cost)
    if args.json:
        print(json.dumps(dict(header, **settings, rows=rows)))
        return 0
    print(f"# {header['command']}  ({device}, {header['dtype']}, {header['params_millions']}M parameters, "
          f"{header['threads']} threads)")
    print(f"# {args.num_prompts} held-out prompts x {args.prompt_len} tokens, {args.max_new_tokens} new tokens each, "
          f"{'greedy' if sampling.greedy else f'temperature {args.temperature}'}")
    print("# cost model: " + (f"draft step c = {cost['c']:.3f} target steps; " if "c" in cost else "")
          + f"r(2..{len(cost['r'])}) = " + " ".join(f"{r:.2f}" for r in cost["r"][1:]))
    print(f"{'method':<28}{'tau':>6}{'alpha':>7}{'target fw':>11}{'draft fw':>10}{'pass':>6}{'tokens/s':>10}"
          f"{'speedup':>9}{'predicted':>11}")
    for r in rows:
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
        print(f"{r['method']:<28}{r['tau']:>6.2f}{alpha:>7}{r['target_forwards']:>11}{r['draft_forwards']:>10}"
              f"{r['mean_pass']:>6.1f}{r['tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x{r['predicted_speedup']:>10.2f}x")
    return 0


if __name__ == "__main__":
    cli.run(main)
