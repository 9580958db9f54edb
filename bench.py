"""Measure decoding methods side by side on held-out prompts.

    python bench.py                           # every method, greedy, 8 prompts from the val split
    python bench.py --temperature 1 --json
    python bench.py --methods draft --k 2 4 auto --plot docs/
    python bench.py --methods lookahead --lookahead 5,3,5 7,4,7 --sized
    python bench.py --methods prompt-lookup --prompt-lookup 3,5,2 1,8,64
    python bench.py --methods draft,medusa,eagle --k 4 --medusa-tree chain --eagle chain:4 tree:auto
    python bench.py --profile                 # the verify-pass cost curve r(n)

Each method's setting flag is generate.py's, taking several settings: one row each. Rows run
interleaved round-robin over the prompts (the order rotating from prompt to prompt), so machine
noise hits every method alike; speedup is each row's tokens/s over plain decoding's in this same
run; a second plain row, last, shows how far apart two identical rows land (the noise). Beside it,
the speedup the cost model predicts from the measured tau:
tau / (mean r(n) + d*c), with r(n) the target's verify-pass cost curve at each pass's size n
(averaged over the passes, whose sizes vary for sized lookahead), d the draft forwards per target
forward and c the cost of one of them, timed alone: a draft model's step, or a forward of the
EAGLE head (of one node for a chain, of a tree's width for a tree) or of the Medusa heads (for k
draft guesses: r(k+1) + k*c). Greedy rows also say on what share of the prompts they wrote
exactly plain decoding's tokens: all of them in float64; in float32 and below a pass over several
tokens rounds differently from single steps, and a near-tie can flip. Each method decodes as
generate.py's does, with the measured fallback (decode/fallback.py) unless --no-fallback, which
starts from what the row's last run measured (kept in OUT_DIR/costs.json; a first run at a batch
size holds where a smaller one held, or tries both modes first): "held" is the share of its rounds
it kept plain, which its prediction counts as plain steps. A second table says where each
row's rounds spent their time, a third how often candidates were accepted at each depth.
"""
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

import cli
from cost_profile import ALPHAS, profile_checkpoints, profile_target
from data import read_text, split_text
from decode import generate_batch
from decode.cost import cost_curve, forward_seconds, profile_prefix
from decode.eagle import TREE_WIDTH, head_seconds
from decode.medusa import heads_seconds
from decode.methods import METHODS, load_draft, make_proposer, parse_setting
from decode.stats import PHASES, DecodeStats
from model.eagle import load_eagle
from model.medusa import load_medusa
from plots import machine, plot, plot_batches

ROWS = {  # the settings benchmarked by default, one row each
    "draft": ["1", "2", "3", "4", "5", "6", "7", "8", "auto", "heuristic"],
    "jacobi": ["2", "5"],
    "lookahead": ["2,2,2", "5,3,5", "7,4,7"],  # fixed sizes, besides the sized default
    "prompt-lookup": ["3,5,2"],
    "medusa": ["chain", "saved", "4", "8", "32"],
    "eagle": ["chain:4", "tree:8", "tree:16", "tree:auto"],
}
# in a batch run: each method's default, and the draft sized to the batch (lookahead's sized default runs anyway)
BATCH_ROWS = {"draft": ["4", "auto"], "lookahead": []}
NOISE_ROW = "none again (noise)"
PLAIN_ROWS = ("none", NOISE_ROW)
MAX_BATCH = 256
DEPTHS = 4  # depths at which each row's acceptance is reported


@dataclass
class Row:
    """One benchmarked setting, and what it drafts with besides the target, each forward of which its
    predicted speedup counts: the draft model, the Medusa heads, the EAGLE head, or nothing."""
    make: Callable  # batch_size -> the proposer of one row of a batch of that size
    drafter: str | None = None  # "draft", "medusa" or "eagle"
    module: torch.nn.Module | None = None  # the drafter itself: the draft GPT, MedusaHeads or EagleHead
    width: int = 1  # nodes per drafter forward: an EAGLE chain's 1, a tree's TREE_WIDTH

    def drafter_seconds(self, target, batch_size):
        """One drafter forward for B rows: the draft model steps all rows at once; the heads go row by row."""
        if self.drafter == "draft":
            return forward_seconds(self.module, 1, profile_prefix(self.module), batch_size=batch_size)
        if self.drafter == "medusa":
            return batch_size * heads_seconds(self.module)
        return batch_size * head_seconds(self.module, target.config.vocab_size, profile_prefix(target), self.width)


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    cli.add_checkpoint_args(p)
    p.add_argument("--data", help="text whose val split gives the prompts (default: the data the model was trained on)")
    p.add_argument("--methods", help=f"comma-separated, from: {', '.join(METHODS)} (default: every method whose "
                                    "checkpoint exists); plain decoding always runs, as the baseline")
    cli.add_method_args(p, rows=ROWS)
    p.add_argument("--sized", action="store_true", help="also a sized (--sizing auto) lookahead row for each "
                                                        "--lookahead W,N,G; the sized default row runs always")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="held-out prompts (default 8; with --batch-sizes, the largest batch size)")
    p.add_argument("--batch-sizes", type=int, nargs="+", metavar="B", help="decode the prompts in batches of each "
                   "size B, one batch per row at a time: total tokens/s and speedup per batch size, predicted from the "
                   "batch's own cost curve (a pass of B rows x n tokens over B x 1); each method runs its default "
                   "setting unless its flag says otherwise")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    cli.add_sampling_args(p, temperature=0.0)
    p.set_defaults(max_new_tokens=128)
    cli.add_device_args(p)
    cli.add_attn_arg(p)
    cli.add_compile_arg(p)
    p.add_argument("--profile", nargs="*", metavar="CHECKPOINT", help="measure r(n) instead of decoding: the "
                   "target's, after three prefix lengths (this drops the costs stored in OUT_DIR/costs.json for this "
                   "machine, so that the next run that sizes itself measures them again); or, given checkpoints, each "
                   "one's after half its context, plotted with --plot into DIR/cost_by_size.png, and with --draft, the "
                   f"draft's step cost c against each larger one and the speedup the cost model predicts at alpha "
                   f"{', '.join(map(str, ALPHAS))}")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="DIR", help="draw the cost curve r(n) and each row's measured and predicted "
                   "speedup into DIR/cost_curve.png and DIR/speedup.png (needs matplotlib)")
    return p.parse_args(argv)


def held_out_prompts(tokenizer, text, n, length, seed):
    """n prompts of `length` tokens at random places in the val split."""
    val = tokenizer.encode(split_text(text)[1])
    if len(val) <= length:
        raise cli.UserError(f"the val split has {len(val)} tokens, too few for prompts of {length}")
    starts = torch.randint(len(val) - length, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [val[s:s + length] for s in starts]


def check_args(args, block_size):
    """The methods --methods names (default: every one whose checkpoint exists); refuses bad settings
    and sizes before anything is loaded or timed, and fills in the default --num-prompts."""
    if args.methods is None:
        methods = [m.name for m in METHODS.values()
                   if m.name != "none" and (m.needs is None or os.path.exists(cli.checkpoint_of(args, m.needs)))]
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip() and m.strip() != "none"]
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not args.methods.strip():
            raise cli.UserError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; methods: {', '.join(METHODS)}")
    for method in methods:
        for setting in cli.setting_of(args, method) or []:
            parse_setting(method, setting)
    if args.batch_sizes and not all(1 <= b <= MAX_BATCH for b in args.batch_sizes):
        raise cli.UserError(f"--batch-sizes must lie between 1 and {MAX_BATCH}")
    if args.num_prompts is None:
        args.num_prompts = max(args.batch_sizes) if args.batch_sizes else 8
    if args.num_prompts < 1:
        raise cli.UserError("--num-prompts must be at least 1")
    if not 1 <= args.prompt_len <= block_size:
        raise cli.UserError(f"--prompt-len must be between 1 and the model's context of {block_size}")
    return methods


def build_rows(args, model, draft, heads, eagle_head, methods, costs):
    """{label: Row}: plain decoding, each method's settings (its flag's; in a batch run, unless given,
    BATCH_ROWS'), plain decoding again. Rows that size themselves read `costs` as generate.py does."""
    def row(method, setting, **options):
        def make(batch_size=1):
            return make_proposer(method, setting, model, draft, heads, costs=costs, eagle_head=eagle_head,
                                 batch_size=batch_size, **options)
        module = dict(draft=draft, medusa=heads and heads[0], eagle=eagle_head and eagle_head[0]).get(method)
        width = TREE_WIDTH if method == "eagle" and parse_setting(method, setting)[0] == "tree" else 1
        return Row(make, None if module is None else method, module, width)

    rows = {"none": row("none", None)}
    for method in methods:
        if method == "lookahead":  # what generate.py --spec lookahead runs
            rows[f"lookahead {METHODS['lookahead'].default} sized (default)"] = row(method, None)
        settings = cli.setting_of(args, method) or []
        if args.batch_sizes and settings is ROWS.get(method):  # argparse hands back the default list itself
            settings = BATCH_ROWS.get(method, [METHODS[method].default])
        for setting in settings:
            if method == "lookahead":
                rows[f"lookahead {setting} fixed"] = row(method, setting, sizing="fixed")
                if args.sized:
                    rows[f"lookahead {setting} sized"] = row(method, setting)
            else:
                label = f"{method} {setting}" + (f" ({len(heads[1]['tree'])})" if setting == "saved" else "")
                rows[label] = row(method, setting)
        if method == "medusa" and not args.batch_sizes:
            rows["medusa saved typical (LOSSY)"] = row(method, "saved", typical=True)
    rows[NOISE_ROW] = rows["none"]  # plain decoding again: how far two identical rows land apart here
    return rows


def run_interleaved(args, model, rows, prompts, sampling, max_pass, batch_size=1):
    """Time the target's cost curve r(n) for batches of batch_size and each drafter's forward c (in
    plain batched steps), then decode the prompts in such batches with every row, interleaved
    round-robin over the batches. Each row keeps batch_size proposers, and unless --no-fallback a
    Fallback, for the whole run, as a user's decoder would (some learn as they go), starting from the
    averages the row's last run kept. Returns (r, a plain step's seconds, {(drafter, width): c},
    {label: (DecodeStats, wall seconds, the share of prompts identical to plain decoding's when
    greedy, predicted speedup)})."""
    r, step = cost_curve(model, max_pass, profile_prefix(model), batch_size=batch_size)
    drafters = {(row.drafter, row.width): row for row in rows.values() if row.drafter}  # one row per drafter
    c = {key: drafters[key].drafter_seconds(model, batch_size) / step for key in sorted(drafters)}
    labels = list(rows)
    proposers = {label: [rows[label].make(batch_size) for _ in range(batch_size)] for label in labels}
    totals = {label: DecodeStats() for label in labels}
    outputs, seconds = {label: [] for label in labels}, dict.fromkeys(labels, 0.0)
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    for label in labels:  # warm-up: first calls pay for allocation
        generate_batch(model, batches[0], 4, sampling, proposers=proposers[label][:len(batches[0])])
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    with contextlib.ExitStack() as kept:  # each row's fallback starts from, and keeps, its last run's averages
        fallbacks = {label: kept.enter_context(cli.kept_fallback(args, label, batch_size, device, dtype))
                     if args.fallback and label not in PLAIN_ROWS else None for label in labels}
        for i, batch in enumerate(batches):
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                generator = torch.Generator(device).manual_seed(args.seed + i)  # the same draws for every row
                started = time.perf_counter()
                new, stats = generate_batch(model, batch, args.max_new_tokens, sampling, generator,
                                            proposers=proposers[label][:len(batch)], fallback=fallbacks[label])
                seconds[label] += time.perf_counter() - started
                outputs[label] += new
                for row_stats in stats:
                    totals[label] += row_stats
    measured = {}
    for label, s in totals.items():
        same = sum(a == b for a, b in zip(outputs[label], outputs["none"])) / len(prompts) if sampling.greedy else None
        draft_cost = c.get((rows[label].drafter, rows[label].width), 0.0) * s.draft_forwards / s.target_forwards
        measured[label] = s, seconds[label], same, s.tau / (s.pass_cost(r, padded=bool(args.batch_sizes)) + draft_cost)
    return r, step, c, measured


def report_start(args, header, rows, how="", **settings):
    """With --json, print the run as one JSON object and return True; otherwise the tables' header lines."""
    settings = dict(num_prompts=args.num_prompts, prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, **settings)
    if args.json:
        print(json.dumps(dict(header, **settings, rows=rows)))
        return True
    print(f"# {header['command']}  ({machine(header)}, {header['params_millions']}M parameters)\n# {args.num_prompts} "
          f"held-out prompts x {args.prompt_len} tokens, {args.max_new_tokens} new tokens each, {header['sampling']}{how}")
    return False


def print_table(results, width):
    """A line per result; its forwards where counted (one prompt at a time), its share same as plain if greedy."""
    forwards, greedy = "target_forwards" in results[0], results[0]["identical_to_plain"] is not None
    print(f"{'method':<{width}}{'tau':>6}{'alpha':>7}" + (f"{'target fw':>11}{'draft fw':>10}{'pass':>6}" if forwards else "")
          + f"{'held':>6}{'tokens/s':>10}{'speedup':>9}{'predicted':>11}" + ("  same as plain" if greedy else ""))
    for r in results:
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
        print(f"{r['method']:<{width}}{r['tau']:>6.2f}{alpha:>7}"
              + (f"{r['target_forwards']:>11}{r['draft_forwards']:>10}{r['mean_pass']:>6.1f}" if forwards else "")
              + f"{r['held']:>6.0%}{r['tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x{r['predicted_speedup']:>10.2f}x"
              + (f"  {r['identical_to_plain']:>12.0%}" if greedy else ""))


def bench_batches(args, model, rows, prompts, sampling, header, max_pass):
    """--batch-sizes: every row decodes the prompts in batches of each size. A batch's speculation
    costs a pass of B rows x n tokens, r_B(n) times a plain batched step, n being the longest row's
    pass (the others are padded to it), plus its drafter's forwards for B rows."""
    results = []
    for batch_size in args.batch_sizes:
        r, step, _, measured = run_interleaved(args, model, rows, prompts, sampling, max_pass, batch_size)
        base = measured["none"][0].new_tokens / measured["none"][1]
        for label, (s, seconds, same, predicted) in measured.items():
            results.append(dict(method=label, batch_size=batch_size, tau=s.tau, alpha=s.alpha,
                                tokens_per_s=s.new_tokens / seconds, speedup=s.new_tokens / seconds / base,
                                predicted_speedup=predicted, identical_to_plain=same, held=s.held, r=r, step_ms=1e3 * step))
    if args.plot:
        plot_batches(results, header, args.plot, PLAIN_ROWS)
    if report_start(args, header, results, ", decoded in batches of each size", batch_sizes=args.batch_sizes):
        return 0
    width = max(28, max(map(len, rows)) + 2)
    for batch_size in args.batch_sizes:
        batch = [r for r in results if r["batch_size"] == batch_size]
        print(f"\nbatch size {batch_size}: a plain batched step {batch[0]['step_ms']:.2f} ms; r(2..{len(batch[0]['r'])}) = "
              + " ".join(f"{x:.2f}" for x in batch[0]["r"][1:]))
        print_table(batch, width)
    print("\nthe smallest batch size at which a method no longer pays (speedup below 1, or held plain in most rounds)")
    for label in [label for label in rows if label not in PLAIN_ROWS]:
        losing = [r for r in results if r["method"] == label and (r["speedup"] < 1.0 or r["held"] > 0.5)]
        first = min(losing, key=lambda r: r["batch_size"], default=None)
        print(f"{label:<{width}}" + (f"{first['batch_size']} ({first['speedup']:.2f}x, held {first['held']:.0%})"
                                     if first else "pays at every size measured"))
    return 0


def bench_rows(args, model, rows, prompts, sampling, header, max_pass):
    """Every row decodes the prompts one at a time: the table, where rounds' time went, acceptance by depth."""
    r, _, c, measured = run_interleaved(args, model, rows, prompts, sampling, max_pass)  # c: in target steps
    eagle = {width: value for (drafter, width), value in c.items() if drafter == "eagle"}
    cost = dict(r=r, **{name: c[drafter, 1] for name, drafter in (("c", "draft"), ("c_medusa", "medusa"))
                        if (drafter, 1) in c}, **({"c_eagle": eagle} if eagle else {}))  # as --json names them
    base = measured["none"][0].tokens_per_s
    results = []
    for label, (s, _, same, predicted) in measured.items():
        ms_per_round = {phase: 1e3 * s.phase_seconds[phase] / s.rounds for phase in PHASES}
        ms_per_round["other"] = 1e3 * s.seconds / s.rounds - sum(ms_per_round.values())  # slides, set-up
        results.append(dict(method=label, identical_to_plain=same, ms_per_round=ms_per_round, tau=s.tau, alpha=s.alpha,
                            acceptance_by_depth=[s.acceptance_at(d) for d in range(1, DEPTHS + 1)],
                            target_forwards=s.target_forwards, draft_forwards=s.draft_forwards, mean_pass=s.mean_pass,
                            held=s.held, tokens_per_s=s.tokens_per_s, speedup=s.tokens_per_s / base,
                            predicted_speedup=predicted, new_tokens=s.new_tokens))
    if args.plot:
        plot(results, r, header, args.plot)
    if report_start(args, header, results, **cost):
        return 0
    print("# cost model: " + (f"draft step c = {cost['c']:.3f} target steps; " if "c" in cost else "")
          + "".join(f"EAGLE head forward of {n} node{'s' * (n > 1)} c = {value:.3f}; " for n, value in eagle.items())
          + (f"Medusa heads forward c = {cost['c_medusa']:.3f}; " if "c_medusa" in cost else "")
          + f"r(2..{len(r)}) = " + " ".join(f"{x:.2f}" for x in r[1:]))
    width = max(28, max(map(len, rows)) + 2)
    print_table(results, width)
    phases = list(results[0]["ms_per_round"])  # where the rounds' time went
    print(f"\nmilliseconds per round\n{'method':<{width}}" + "".join(f"{p:>9}" for p in phases) + f"{'round':>9}")
    for row in results:
        ms = row["ms_per_round"]
        print(f"{row['method']:<{width}}" + "".join(f"{ms[p]:>9.3f}" for p in phases) + f"{sum(ms.values()):>9.3f}")
    deep = [row for row in results if any(a is not None for a in row["acceptance_by_depth"][1:])]
    if deep:  # a chain's row is its guesses' acceptance at each depth, given the ones before it held
        print(f"\nacceptance at depth d, given the path held to d-1\n{'method':<{width}}"
              + "".join(f"{d:>7}" for d in range(1, DEPTHS + 1)))
        for row in deep:
            print(f"{row['method']:<{width}}" + "".join("      -" if a is None else f"{a:>7.2f}"
                                                         for a in row["acceptance_by_depth"]))
    return 0


def main(argv=None):
    args = parse_args(argv)
    args.command = "python " + " ".join(sys.argv if argv is None else ["bench.py", *argv])  # for the report
    if args.profile:  # checkpoints of their own, instead of the target
        return profile_checkpoints(args)
    sampling, device, dtype, target, tokenizer, state = cli.setup(args)
    model = cli.compiled(target, cli.checkpoint_of(args, "target"), args, device, dtype, prepare=True)  # no compile inside a timed run
    header = dict(command=args.command, device=device, dtype=cli.dtype_name(dtype), compiled=bool(args.compile),
                  params_millions=round(target.num_params() / 1e6, 2), threads=torch.get_num_threads(),
                  sampling="greedy" if sampling.greedy else f"temperature {args.temperature}")
    if args.profile is not None:
        return profile_target(args, model, header, cli.stored_costs(args, device, dtype))
    methods = check_args(args, model.config.block_size)
    draft = load_draft(cli.checkpoint_of(args, "draft"), tokenizer, device, dtype) if "draft" in methods else None
    draft = cli.compiled(draft, cli.checkpoint_of(args, "draft"), args, device, dtype, prepare=True)
    heads = load_medusa(cli.checkpoint_of(args, "medusa"), target, tokenizer, device, dtype) if "medusa" in methods else None
    eagle_head = load_eagle(cli.checkpoint_of(args, "eagle"), target, tokenizer, device, dtype) if "eagle" in methods else None
    rows = build_rows(args, model, draft, heads, eagle_head, methods, cli.stored_costs(args, device, dtype))
    longest = max(row.make().max_candidates for row in rows.values())
    max_pass = min(64, model.config.block_size - profile_prefix(model), longest + 1)
    prompts = held_out_prompts(tokenizer, read_text(args.data or state.get("data")), args.num_prompts, args.prompt_len, args.seed)
    bench = bench_batches if args.batch_sizes else bench_rows
    return bench(args, model, rows, prompts, sampling, header, max_pass)


if __name__ == "__main__":
    cli.run(main)
