"""bench.py --profile: the verify-pass cost curve r(n), of the target or of given checkpoints, and
with --draft the speedup the cost model predicts for that draft in front of each of them."""
import json
import os

import torch

import cli
from decode.cost import cost_curve, forward_seconds, profile_prefix
from decode.draft import AUTO_K_MAX
from decode.sizing import predicted_speedup
from model.checkpoint import load_model
from plots import machine, plot_cost_curves

ALPHAS = (0.6, 0.7, 0.8)  # acceptance rates at which --profile predicts a draft's speedup (it measures none)


def profile_target(args, model, header, costs):
    """--profile alone: the target's r(n) after three prefix lengths (short, half, nearly full). It
    drops the stored `costs` of this machine: the next sized run measures afresh."""
    costs.forget()
    block_size = model.config.block_size
    max_n = min(64, block_size // 2)  # prefixes that leave room for the new positions inside the context
    prefixes = sorted({1, (block_size - max_n) // 2, block_size - max_n})
    curves = {f"P={p}": cost_curve(model, max_n, p) for p in prefixes}
    print_profile(curves, header, args.json, f"{header['params_millions']}M parameters", "after P cached tokens", {})
    return 0


def profile_checkpoints(args):
    """--profile CHECKPOINT ...: each checkpoint's r(n) after half its context (the prefix the cost
    model uses), and with --draft, the draft's step cost c against each larger checkpoint of its
    tokenizer and the speedup the cost model predicts for it at a few acceptance rates."""
    device, dtype = cli.setup_device(args)
    header = dict(command=args.command, device=device, dtype=cli.dtype_name(dtype),
                  compiled=bool(args.compile), threads=torch.get_num_threads())

    def load(path, kind="target"):
        """(the model at `path`, compiled if asked; its tokenizer; its parameter count)"""
        model, tokenizer, _ = load_model(path, kind=kind, device=device, dtype=dtype)
        return cli.compiled(model, path, args, device, dtype, prepare=True), tokenizer, model.num_params()
    if args.draft:
        draft, draft_tokenizer, draft_params = load(cli.checkpoint_of(args, "draft"), "draft")
        draft_seconds = forward_seconds(draft, 1, profile_prefix(draft))
    curves, predictions = {}, {}
    for path in args.profile:
        if not os.path.isfile(path):
            raise cli.UserError(f"--profile {path}: no such file")
        model, tokenizer, params = load(path)
        label = f"{path} ({params / 1e6:,.0f}M)" if params >= 1e7 else f"{path} ({params / 1e6:.2f}M)"
        curves[label] = r, seconds = cost_curve(model, min(64, model.config.block_size // 2), profile_prefix(model))
        if args.draft and draft_tokenizer.spec == tokenizer.spec and draft_params < params:
            c = draft_seconds / seconds
            predictions[label] = dict(draft=os.path.basename(args.draft), c=c, best=[best_k(a, r, c) for a in ALPHAS])
        del model  # before the next one is loaded
    print_profile(curves, header, args.json, "each after half its context", "per model", predictions)
    if args.plot:
        plot_cost_curves(curves, header, args.plot, "cost_by_size.png")
    return 0


def best_k(alpha, r, c):
    """(k, predicted speedup) of the k up to AUTO_K_MAX that the cost model rates best at acceptance alpha."""
    return max(((k, predicted_speedup(alpha, k, r, c)) for k in range(1, AUTO_K_MAX + 1)), key=lambda kv: kv[1])


def print_profile(curves, header, json_out, about, measured, predictions):
    """curves: {column label: (r, seconds of r(1))}; predictions: {label: dict(c, best=[(k, speedup)])}."""
    if json_out:
        print(json.dumps(dict(header, profile={label: dict(r=r, seconds_1=s, **predictions.get(label, {}))
                                               for label, (r, s) in curves.items()})))
        return
    print(f"# {header['command']}  ({machine(header)}, {about})")
    print(f"verify-pass cost r(n) = time(n new tokens) / time(1), {measured}")
    width = max(9, max(map(len, curves)) + 2)
    print("   n " + "".join(f"{label:>{width}}" for label in curves))
    for n in range(1, max(len(r) for r, _ in curves.values()) + 1):
        print(f"{n:>4} " + "".join(f"{r[n - 1]:>{width}.2f}" if n <= len(r) else " " * width for r, _ in curves.values()))
    print("time(1): " + ", ".join(f"{label} {s * 1e3:.2f} ms" for label, (_, s) in curves.items()))
    for label, p in predictions.items():
        print(f"draft {p['draft']} for {label}: step cost c = {p['c']:.3f}; "
              "predicted speedup (best k) at " + ", ".join(
                  f"alpha {alpha}: {speedup:.2f}x (k={k})" for alpha, (k, speedup) in zip(ALPHAS, p["best"])))
