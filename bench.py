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
generate.py's does, with the measured fallback (decode/fallback.py) unless --no-fallback: "held"
is the share of its rounds it kept plain, which its prediction counts as plain steps. A second
table says where each row's rounds spent their time, a third how often candidates were accepted at
each depth.
"""
import json
import os
import sys
import time

import torch

import cli
from data import read_text, split_text
from decode import Fallback, Plain, generate_batch
from decode.cost import cost_curve, forward_seconds, profile_prefix
from decode.draft import AUTO_K_MAX
from decode.eagle import head_seconds
from decode.medusa import heads_seconds
from decode.methods import METHODS, load_draft, make_proposer, parse_setting
from decode.sizing import predicted_speedup
from decode.stats import PHASES, DecodeStats
from model.checkpoint import load_model
from model.eagle import load_eagle
from model.medusa import load_medusa

ROWS = {  # the settings benchmarked by default, one row each
    "draft": ["1", "2", "3", "4", "5", "6", "7", "8", "auto", "heuristic"],
    "jacobi": ["2", "5"],
    "lookahead": ["2,2,2", "5,3,5", "7,4,7"],  # fixed sizes, besides the sized default
    "prompt-lookup": ["3,5,2"],
    "medusa": ["chain", "saved", "4", "8", "32"],
    "eagle": ["chain:4", "tree:8", "tree:16", "tree:auto"],
}
# in a batch run: each method's default, and the draft sized to the batch; lookahead's sized
# default row runs anyway
BATCH_ROWS = {"draft": ["4", "auto"], "lookahead": []}
NOISE_ROW = "none again (noise)"
PLAIN_ROWS = ("none", NOISE_ROW)
MAX_BATCH = 256
ALPHAS = (0.6, 0.7, 0.8)  # acceptance rates at which --profile predicts a draft's speedup (it measures none)
DEPTHS = 4  # depths at which each row's acceptance is reported


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    cli.add_checkpoint_args(p)
    p.add_argument("--data", default=None,
                   help="text whose val split gives the prompts (default: the data the model was trained on)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from: {', '.join(METHODS)} (default: every method whose "
                        "checkpoint exists); plain decoding always runs, as the baseline")
    cli.add_method_args(p, rows=ROWS)
    p.add_argument("--sized", action="store_true",
                   help="also a sized (--sizing auto) lookahead row for each --lookahead W,N,G; the sized "
                        "default row runs always")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="held-out prompts (default 8; with --batch-sizes, the largest batch size)")
    p.add_argument("--batch-sizes", type=int, nargs="+", metavar="B",
                   help="decode the prompts in batches of each size B, one batch per row at a time: total "
                        "tokens/s and speedup per batch size, predicted from the batch's own cost curve (a "
                        "pass of B rows x n tokens over B x 1); each method runs its default setting unless "
                        "its flag says otherwise")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    cli.add_sampling_args(p, temperature=0.0)
    p.set_defaults(max_new_tokens=128)
    cli.add_device_args(p)
    cli.add_attn_arg(p)
    cli.add_compile_arg(p)
    p.add_argument("--profile", nargs="*", metavar="CHECKPOINT",
                   help="measure r(n) instead of decoding: the target's, after three prefix lengths (this drops "
                        "the costs stored in OUT_DIR/costs.json for this machine, so that the next run that "
                        "sizes itself measures them again); or, given checkpoints, each one's after half its "
                        "context, plotted with --plot into DIR/cost_by_size.png, and with --draft, the "
                        "draft's step cost c against each larger one and the speedup the cost model predicts "
                        f"at alpha {', '.join(map(str, ALPHAS))}")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="DIR", help="draw the cost curve r(n) and each row's measured and predicted "
                                                 "speedup into DIR/cost_curve.png and DIR/speedup.png "
                                                 "(needs matplotlib)")
    return p.parse_args(argv)


def held_out_prompts(tokenizer, text, n, length, seed):
    """n prompts of `length` tokens at random places in the val split."""
    val = tokenizer.encode(split_text(text)[1])
    if len(val) <= length:
        raise cli.UserError(f"the val split has {len(val)} tokens, too few for prompts of {length}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(val) - length, (n,), generator=gen).tolist()
    return [val[s:s + length] for s in starts]


def run_interleaved(model, rows, prompts, sampling, max_new_tokens, seed, batch_size=1, fallback=True):
    """For rows {label: a function making its proposer}, decode the prompts in batches of
    batch_size, the rows interleaved round-robin over the batches. Returns (total DecodeStats per
    row, each row's outputs in prompt order, each row's wall seconds). Each row keeps batch_size
    proposers, and with `fallback` a Fallback, for the whole run, as a user's decoder would (some
    learn as they go)."""
    labels = list(rows)
    proposers = {label: [rows[label](batch_size) for _ in range(batch_size)] for label in labels}
    fallbacks = {label: Fallback() if fallback and label not in PLAIN_ROWS else None for label in labels}
    totals = {label: DecodeStats() for label in labels}
    outputs = {label: [] for label in labels}
    seconds = dict.fromkeys(labels, 0.0)
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    for label in labels:  # warm-up: first calls pay for allocation
        generate_batch(model, batches[0], 4, sampling, proposers=proposers[label][:len(batches[0])])
    for i, batch in enumerate(batches):
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            generator = torch.Generator(model.lm_head.weight.device).manual_seed(seed + i)  # same draws for all
            started = time.perf_counter()
            new, stats = generate_batch(model, batch, max_new_tokens, sampling, generator,
                                        proposers=proposers[label][:len(batch)], fallback=fallbacks[label])
            seconds[label] += time.perf_counter() - started
            outputs[label] += new
            for row_stats in stats:
                totals[label] += row_stats
    return totals, outputs, seconds


def machine(header):
    return (f"{header['device']}, {header['dtype']}{', compiled' if header['compiled'] else ''}, "
            f"{header['threads']} threads")


def profile_target(args, model, header):
    """--profile alone: the target's r(n) after three prefix lengths (short, half, nearly full)."""
    block_size = model.config.block_size
    max_n = min(64, block_size // 2)  # prefixes that leave room for the new positions inside the context
    prefixes = sorted({1, (block_size - max_n) // 2, block_size - max_n})
    curves = {f"P={p}": cost_curve(model, max_n, p) for p in prefixes}
    print_profile(curves, header, args.json, f"{header['params_millions']}M parameters",
                  "verify-pass cost r(n) = time(n new tokens) / time(1), after P cached tokens")


def profile_checkpoints(args):
    """--profile CHECKPOINT ...: each checkpoint's r(n) after half its context (the prefix the cost
    model uses), and with --draft, the draft's step cost c against each larger checkpoint of its
    tokenizer and the speedup the cost model predicts for it at a few acceptance rates."""
    device, dtype = cli.setup_device(args)
    header = dict(command=args.command, device=device, dtype=cli.dtype_name(dtype),
                  compiled=args.compile, threads=torch.get_num_threads())
    draft = None
    if args.draft:
        draft_path = cli.checkpoint_of(args, "draft")
        draft, draft_tokenizer, _ = load_model(draft_path, kind="draft", device=device, dtype=dtype)
        draft_params = draft.num_params()
        draft = cli.compiled(draft, draft_path, args, device, dtype, prepare=True)
        draft_seconds = forward_seconds(draft, 1, profile_prefix(draft))
    curves, predictions = {}, {}
    for path in args.profile:
        if not os.path.isfile(path):
            raise cli.UserError(f"--profile {path}: no such file")
        target, tokenizer, _ = load_model(path, device=device, dtype=dtype)
        params = target.num_params()
        label = f"{path} ({params / 1e6:,.0f}M)" if params >= 1e7 else f"{path} ({params / 1e6:.2f}M)"
        model = cli.compiled(target, path, args, device, dtype, prepare=True)
        block_size = model.config.block_size
        curves[label] = r, seconds = cost_curve(model, min(64, block_size // 2), profile_prefix(model))
        if draft is not None and draft_tokenizer.spec == tokenizer.spec and draft_params < params:
            c = draft_seconds / seconds
            predictions[label] = dict(draft=os.path.basename(args.draft), c=c, best=[best_k(a, r, c) for a in ALPHAS])
        del target, model  # before the next one is loaded
    print_profile(curves, header, args.json, "each after half its context",
                  "verify-pass cost r(n) = time(n new tokens) / time(1), per model", predictions=predictions)
    if args.plot:
        plot_cost_curves(curves, header, args.plot, "cost_by_size.png")
    return 0


def best_k(alpha, r, c):
    """(k, predicted speedup) of the k up to AUTO_K_MAX that the cost model rates best at acceptance alpha."""
    return max(((k, predicted_speedup(alpha, k, r, c)) for k in range(1, AUTO_K_MAX + 1)), key=lambda kv: kv[1])


def print_profile(curves, header, json_out, about, title, predictions=None):
    """curves: {column label: (r, seconds of r(1))}; predictions: {label: dict(c, best=[(k, speedup)])}."""
    if json_out:
        print(json.dumps(dict(header, profile={label: dict(r=r, seconds_1=s, **(predictions or {}).get(label, {}))
                                               for label, (r, s) in curves.items()})))
        return
    print(f"# {header['command']}  ({machine(header)}, {about})")
    print(title)
    width = max(9, max(map(len, curves)) + 2)
    print("   n " + "".join(f"{label:>{width}}" for label in curves))
    for n in range(1, max(len(r) for r, _ in curves.values()) + 1):
        print(f"{n:>4} " + "".join(f"{r[n - 1]:>{width}.2f}" if n <= len(r) else " " * width for r, _ in curves.values()))
    print("time(1): " + ", ".join(f"{label} {s * 1e3:.2f} ms" for label, (_, s) in curves.items()))
    for label, p in (predictions or {}).items():
        print(f"draft {p['draft']} for {label}: step cost c = {p['c']:.3f}; "
              "predicted speedup (best k) at " + ", ".join(
                  f"alpha {alpha}: {speedup:.2f}x (k={k})" for alpha, (k, speedup) in zip(ALPHAS, p["best"])))


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise cli.UserError("--plot needs matplotlib: pip install matplotlib") from None
    return plt


def plot_cost_curves(curves, header, directory, name):
    """DIR/name: r(n), one curve per {label: (r, seconds)}, beside the flat line of an ideal accelerator."""
    plt = pyplot()
    os.makedirs(directory, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    longest = max(len(r) for r, _ in curves.values())
    for label, (r, _) in curves.items():
        ax.plot(range(1, len(r) + 1), r, "o-", ms=3, label=label)
    ax.plot(range(1, longest + 1), [1.0] * longest, color="grey", lw=0.8, label="free extra tokens (the ideal accelerator)")
    ax.set_xlabel("tokens in one pass n")
    ax.set_ylabel("time / time of a 1-token step")
    ax.set_title(f"Verify-pass cost ({machine(header)})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=120)
    plt.close(fig)


def plot(rows, r, header, directory):
    """DIR/cost_curve.png: r(n) as measured in this run; DIR/speedup.png: each row's measured
    speedup beside the cost model's prediction."""
    plot_cost_curves({"measured r(n)": (r, None)}, header, directory, "cost_curve.png")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(rows) + 1.2))
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [row["speedup"] for row in rows], height=0.4, label="measured")
    ax.barh([i + 0.2 for i in y], [row["predicted_speedup"] for row in rows], height=0.4, label="predicted")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(list(y), [row["method"] for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over plain decoding")
    ax.set_title(f"{header['sampling']} ({machine(header)})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "speedup.png"), dpi=120)
    plt.close(fig)


def row_settings(args, method):
    """The settings benchmarked for `method`: the flag's values; in a batch run, unless the flag
    was given, only BATCH_ROWS (each row runs once per batch size)."""
    settings = cli.setting_of(args, method) or []
    if args.batch_sizes and settings is ROWS.get(method):  # argparse hands back the default list itself
        return BATCH_ROWS.get(method, [METHODS[method].default])
    return settings


def build_rows(args, model, draft, heads, eagle_head, methods, costs):
    """{row label: a function making its proposer for a row of a batch of a given size}: plain decoding, each method's settings, plain
    decoding again. The rows that size themselves read the machine's costs as generate.py does
    (`costs`)."""
    def row(method, setting, **options):
        return lambda batch_size=1: make_proposer(method, setting, model, draft, heads, costs=costs,
                                                  eagle_head=eagle_head, batch_size=batch_size, **options)

    rows = {"none": lambda batch_size=1: Plain()}
    for method in methods:
        if method == "lookahead":  # what generate.py --spec lookahead runs
            rows[f"lookahead {METHODS['lookahead'].default} sized (default)"] = row(method, None)
        for setting in row_settings(args, method):
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


def report_start(args, header, rows, how="", **settings):
    """With --json, print the run (header, settings, rows) as one JSON object and return True: nothing
    more to print. Otherwise print the tables' two header lines."""
    settings = dict(num_prompts=args.num_prompts, prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, **settings)
    if args.json:
        print(json.dumps(dict(header, **settings, rows=rows)))
        return True
    print(f"# {header['command']}  ({machine(header)}, {header['params_millions']}M parameters)")
    print(f"# {args.num_prompts} held-out prompts x {args.prompt_len} tokens, {args.max_new_tokens} new tokens each, "
          f"{header['sampling']}{how}")
    return False


def bench_batches(args, model, rows, prompts, sampling, header, max_pass, drafting_seconds, drafters):
    """--batch-sizes: every row decodes the prompts in batches of each size. A batch's speculation
    costs a pass of B rows x n tokens, r_B(n) times a plain batched step, n being the longest row's
    pass (the others are padded to it), plus d drafting forwards: d x drafting_seconds(B)[drafter]
    / (the batched step's seconds), drafters[row] naming the drafter whose forwards a row pays."""
    prefix = profile_prefix(model)
    results = []
    for batch_size in args.batch_sizes:
        r, step = cost_curve(model, max_pass, prefix, batch_size=batch_size)
        step_seconds = drafting_seconds(batch_size)
        totals, outputs, seconds = run_interleaved(model, rows, prompts, sampling, args.max_new_tokens, args.seed,
                                                   batch_size, args.fallback)
        base = totals["none"].new_tokens / seconds["none"]
        for label, s in totals.items():
            draft_cost = step_seconds.get(drafters[label], 0.0) / step * s.draft_forwards / s.target_forwards
            same = sum(a == b for a, b in zip(outputs[label], outputs["none"])) / len(prompts) if sampling.greedy else None
            results.append(dict(method=label, batch_size=batch_size, tau=s.tau, alpha=s.alpha,
                                tokens_per_s=s.new_tokens / seconds[label], speedup=s.new_tokens / seconds[label] / base,
                                predicted_speedup=s.tau / (s.pass_cost(r, padded=True) + draft_cost),
                                identical_to_plain=same, held=s.held,
                                r=r, step_ms=1e3 * step))
    if args.plot:
        plot_batches(results, header, args.plot)
    if report_start(args, header, results, ", decoded in batches of each size", batch_sizes=args.batch_sizes):
        return 0
    width = max(28, max(len(r["method"]) for r in results) + 2)
    for batch_size in args.batch_sizes:
        batch = [r for r in results if r["batch_size"] == batch_size]
        print(f"\nbatch size {batch_size}: a plain batched step {batch[0]['step_ms']:.2f} ms; r(2..{len(batch[0]['r'])}) = "
              + " ".join(f"{x:.2f}" for x in batch[0]["r"][1:]))
        print(f"{'method':<{width}}{'tau':>6}{'alpha':>7}{'held':>6}{'tokens/s':>10}{'speedup':>9}{'predicted':>11}"
              + ("  same as plain" if sampling.greedy else ""))
        for r in batch:
            alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
            print(f"{r['method']:<{width}}{r['tau']:>6.2f}{alpha:>7}{r['held']:>6.0%}{r['tokens_per_s']:>10.1f}"
                  f"{r['speedup']:>8.2f}x{r['predicted_speedup']:>10.2f}x"
                  + (f"  {r['identical_to_plain']:>12.0%}" if sampling.greedy else ""))
    print("\nthe smallest batch size at which a method no longer pays (speedup below 1, or held plain in most rounds)")
    for label in rows:
        if label in PLAIN_ROWS:
            continue
        losing = [r for r in results if r["method"] == label and (r["speedup"] < 1.0 or r["held"] > 0.5)]
        first = min(losing, key=lambda r: r["batch_size"], default=None)
        print(f"{label:<{width}}" + (f"{first['batch_size']} ({first['speedup']:.2f}x, held {first['held']:.0%})"
                                     if first else "pays at every size measured"))
    return 0


def plot_batches(results, header, directory):
    """DIR/batch.png: total tokens/s against batch size for each row, and each row's measured and
    predicted speedup."""
    plt = pyplot()
    os.makedirs(directory, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label in dict.fromkeys(r["method"] for r in results):
        mine = [r for r in results if r["method"] == label]
        sizes = [r["batch_size"] for r in mine]
        line, = left.plot(sizes, [r["tokens_per_s"] for r in mine], "o-", ms=3, label=label)
        if label not in PLAIN_ROWS:
            right.plot(sizes, [r["speedup"] for r in mine], "o-", ms=3, color=line.get_color(), label=label)
            right.plot(sizes, [r["predicted_speedup"] for r in mine], "--", color=line.get_color(), lw=0.8)
    for ax, ylabel in ((left, "tokens/s, all rows together"), (right, "speedup over plain batched decoding")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
    right.axhline(1.0, color="grey", lw=0.8)
    right.set_title("measured (solid) and predicted (dashed)", fontsize=9)
    left.set_title(f"{header['sampling']} ({machine(header)})", fontsize=9)
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "batch.png"), dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    args.command = "python " + " ".join(sys.argv if argv is None else ["bench.py", *argv])  # for the report
    if args.profile:  # checkpoints of their own, instead of the target
        return profile_checkpoints(args)
    sampling, device, dtype, target, tokenizer, state = cli.setup(args)
    model = cli.compiled(target, cli.checkpoint_of(args, "target"), args, device, dtype, prepare=True)  # no compile inside a timed run
    block_size = model.config.block_size
    header = dict(command=args.command, device=device, dtype=cli.dtype_name(dtype),
                  compiled=args.compile, params_millions=round(target.num_params() / 1e6, 2),
                  threads=torch.get_num_threads(),
                  sampling="greedy" if sampling.greedy else f"temperature {args.temperature}")
    if args.profile is not None:
        cli.stored_costs(args, device, dtype).forget()  # the next sized run measures afresh
        profile_target(args, model, header)
        return 0

    if args.methods is None:  # every method whose checkpoint exists
        methods = [m.name for m in METHODS.values()
                   if m.name != "none" and (m.needs is None or os.path.exists(cli.checkpoint_of(args, m.needs)))]
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip() and m.strip() != "none"]
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not args.methods.strip():
            raise cli.UserError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                                f"methods: {', '.join(METHODS)}")
    for method in methods:  # bad settings are refused before anything is loaded or timed
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

    draft_path = cli.checkpoint_of(args, "draft")
    draft = load_draft(draft_path, tokenizer, device, dtype) if "draft" in methods else None
    draft = cli.compiled(draft, draft_path, args, device, dtype, prepare=True)
    heads = load_medusa(cli.checkpoint_of(args, "medusa"), target, tokenizer, device, dtype) if "medusa" in methods else None
    eagle_head = load_eagle(cli.checkpoint_of(args, "eagle"), target, tokenizer, device, dtype) if "eagle" in methods else None
    rows = build_rows(args, model, draft, heads, eagle_head, methods, cli.stored_costs(args, device, dtype))
    proposers = {label: make() for label, make in rows.items()}
    prefix = profile_prefix(model)
    max_pass = min(64, block_size - prefix, max(p.max_candidates for p in proposers.values()) + 1)
    cost = dict(r=cost_curve(model, max_pass, prefix)[0])
    # the drafter whose forwards each row pays for: "draft", "medusa", or "eagle W", the EAGLE head
    # at the width W its row expands (a chain's one node, a tree's TREE_WIDTH)
    drafters = {label: f"eagle {p.width}" if label.startswith("eagle") else label.split()[0]
                for label, p in proposers.items()}

    def drafting_seconds(batch_size=1):
        """Seconds of one forward of each drafter for a batch of B rows: the draft model steps all
        the rows at once; the EAGLE head and the Medusa heads draft row by row, B forwards."""
        def seconds(drafter):
            method, _, width = drafter.partition(" ")
            if method == "draft":
                return forward_seconds(draft, 1, profile_prefix(draft), batch_size=batch_size)
            if method == "medusa":
                return batch_size * heads_seconds(heads[0])
            if method == "eagle":
                return batch_size * head_seconds(eagle_head[0], model.config.vocab_size, prefix, int(width))
            return 0.0  # a method that drafts with the target itself
        return {drafter: seconds(drafter) for drafter in sorted(set(drafters.values()))}
    step_seconds = drafting_seconds()
    step = forward_seconds(model, 1, prefix) if any(step_seconds.values()) else None
    step_cost = {name: seconds / step for name, seconds in step_seconds.items() if seconds}  # per draft forward
    if "draft" in step_cost:
        cost["c"] = step_cost["draft"]
    if "medusa" in step_cost:
        cost["c_medusa"] = step_cost["medusa"]
    eagle = {int(name.split()[1]): c for name, c in step_cost.items() if name.startswith("eagle")}
    if eagle:
        cost["c_eagle"] = eagle

    text = read_text(args.data or state.get("data"))
    prompts = held_out_prompts(tokenizer, text, args.num_prompts, args.prompt_len, args.seed)
    if args.batch_sizes:
        return bench_batches(args, model, rows, prompts, sampling, header, max_pass, drafting_seconds, drafters)
    totals, outputs, _ = run_interleaved(model, rows, prompts, sampling, args.max_new_tokens, args.seed,
                                         fallback=args.fallback)

    base = totals["none"].tokens_per_s
    rows = []
    for label, s in totals.items():
        c = step_cost.get(drafters[label], 0.0)
        predicted = s.tau / (s.pass_cost(cost["r"]) + c * s.draft_forwards / s.target_forwards)
        # greedy: the share of prompts whose text is plain decoding's, token for token. Exact in
        # float64; in lower precision a pass of several tokens rounds differently from single steps
        same = sum(a == b for a, b in zip(outputs[label], outputs["none"])) / len(prompts) if sampling.greedy else None
        ms_per_round = {phase: 1e3 * s.phase_seconds[phase] / s.rounds for phase in PHASES}
        ms_per_round["other"] = 1e3 * s.seconds / s.rounds - sum(ms_per_round.values())  # slides, set-up
        by_depth = [s.acceptance_at(d) for d in range(1, DEPTHS + 1)]
        rows.append(dict(method=label, identical_to_plain=same, ms_per_round=ms_per_round, tau=s.tau, alpha=s.alpha,
                         acceptance_by_depth=by_depth, target_forwards=s.target_forwards,
                         draft_forwards=s.draft_forwards, mean_pass=s.mean_pass, held=s.held, tokens_per_s=s.tokens_per_s,
                         speedup=s.tokens_per_s / base, predicted_speedup=predicted, new_tokens=s.new_tokens))
    if args.plot:
        plot(rows, cost["r"], header, args.plot)
    if report_start(args, header, rows, **cost):
        return 0
    print("# cost model: " + (f"draft step c = {cost['c']:.3f} target steps; " if "c" in cost else "")
          + "".join(f"EAGLE head forward of {width} node{'s' * (width > 1)} c = {c:.3f}; "
                    for width, c in cost.get("c_eagle", {}).items())
          + (f"Medusa heads forward c = {cost['c_medusa']:.3f}; " if "c_medusa" in cost else "")
          + f"r(2..{len(cost['r'])}) = " + " ".join(f"{r:.2f}" for r in cost["r"][1:]))
    width = max(28, max(map(len, totals)) + 2)
    print(f"{'method':<{width}}{'tau':>6}{'alpha':>7}{'target fw':>11}{'draft fw':>10}{'pass':>6}{'held':>6}{'tokens/s':>10}"
          f"{'speedup':>9}{'predicted':>11}" + ("  same as plain" if sampling.greedy else ""))
    for r in rows:
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
        print(f"{r['method']:<{width}}{r['tau']:>6.2f}{alpha:>7}{r['target_forwards']:>11}{r['draft_forwards']:>10}"
              f"{r['mean_pass']:>6.1f}{r['held']:>6.0%}{r['tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x{r['predicted_speedup']:>10.2f}x"
              + (f"  {r['identical_to_plain']:>12.0%}" if sampling.greedy else ""))
    phases = list(rows[0]["ms_per_round"])  # where the rounds' time went
    print(f"\nmilliseconds per round\n{'method':<{width}}" + "".join(f"{p:>9}" for p in phases) + f"{'round':>9}")
    for r in rows:
        ms = r["ms_per_round"]
        print(f"{r['method']:<{width}}" + "".join(f"{ms[p]:>9.3f}" for p in phases) + f"{sum(ms.values()):>9.3f}")
    deep = [r for r in rows if any(a is not None for a in r["acceptance_by_depth"][1:])]
    if deep:  # a chain's row is its guesses' acceptance at each depth, given the ones before it held
        print(f"\nacceptance at depth d, given the path held to d-1\n{'method':<{width}}"
              + "".join(f"{d:>7}" for d in range(1, DEPTHS + 1)))
        for r in deep:
            print(f"{r['method']:<{width}}" + "".join("      -" if a is None else f"{a:>7.2f}"
                                                       for a in r["acceptance_by_depth"]))
    return 0


if __name__ == "__main__":
    cli.run(main)
