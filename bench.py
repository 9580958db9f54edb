"""Measure decoding methods side by side on held-out prompts.

    python bench.py                           # every method, greedy, 8 prompts from the val split
    python bench.py --temperature 0.8 --json
    python bench.py --profile                 # the verify-pass cost curve r(n)

Methods run interleaved round-robin over the prompts (the order rotating from prompt to prompt), so
machine noise hits every method alike; speedup is each method's tokens/s over plain decoding's in
this same run.
"""
import json
import os
import statistics
import sys
import time

import torch

import cli
from data import TokenData, read_text, split_text
from decode import METHODS
from decode.context import prefill
from decode.stats import DecodeStats
from errors import UserError
from generate import add_sampling_args, sampling_from_args
from model.checkpoint import load_model


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="out", help="directory holding target.pt (default: out)")
    p.add_argument("--data", default=None,
                   help="text whose val split gives the prompts (default: the data the model was trained on)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from: {', '.join(METHODS)}")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens (default 64)")
    add_sampling_args(p, temperature=0.0)
    p.set_defaults(max_new_tokens=128)
    cli.add_device_args(p)
    p.add_argument("--profile", action="store_true", help="measure r(n) instead of decoding")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p.parse_args(argv)


def held_out_prompts(tokenizer, text, n, length, seed):
    """n prompts of `length` tokens at random places in the val split."""
    val = TokenData(tokenizer.encode(split_text(text)[1]), 0, "val")
    val.check_fits(length)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(val.tokens) - length, (n,), generator=gen).tolist()
    return [val.tokens[s:s + length].tolist() for s in starts]


def run_methods(model, methods, prompts, sampling, max_new_tokens, seed, device):
    """Total DecodeStats per method, the methods interleaved round-robin."""
    totals = {m: DecodeStats() for m in methods}
    METHODS["none"](model, prompts[0], 4, sampling)  # warm-up: first calls pay for allocation
    for i, prompt in enumerate(prompts):
        for m in methods[i % len(methods):] + methods[:i % len(methods)]:
            generator = torch.Generator(device).manual_seed(seed + i)  # the same draws for every method
            _, stats = METHODS[m](model, prompt, max_new_tokens, sampling, generator)
            totals[m] += stats
    return totals


@torch.inference_mode()
def profile_verify_cost(model, prefixes, max_n=64, repeats=7):
    """r(n) = time of one forward with n new tokens / time with 1, after each prefix length."""
    device = model.lm_head.weight.device
    cache = model.new_cache(scratch=max_n)
    gen = torch.Generator().manual_seed(0)
    curves = {}
    for prefix in prefixes:
        prefill(model, cache, torch.randint(model.config.vocab_size, (prefix,), generator=gen).tolist())
        times = []
        for n in range(1, max_n + 1):
            idx = torch.randint(model.config.vocab_size, (1, n), generator=gen).to(device)
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(idx, cache)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                samples.append(time.perf_counter() - t0)
                cache.rollback(prefix)  # a verify pass that keeps nothing
            times.append(statistics.median(samples))
        curves[prefix] = dict(seconds_1=times[0], r=[t / times[0] for t in times])
    return curves


def main(argv=None):
    args = parse_args(argv)
    sampling = sampling_from_args(args)
    device = cli.resolve_device(args.device)
    dtype = cli.resolve_dtype(args.dtype, device)
    model, tokenizer, state = load_model(os.path.join(args.out_dir, "target.pt"), device=device, dtype=dtype)
    block_size = model.config.block_size
    header = dict(command="python " + " ".join(sys.argv), device=device, dtype=str(dtype).removeprefix("torch."),
                  params_millions=round(model.num_params() / 1e6, 2), threads=torch.get_num_threads())

    if args.profile:
        # prefixes that leave room for 64 new positions inside the context
        prefixes = sorted({1, (block_size - 64) // 2, block_size - 64}) if block_size > 64 else [1]
        max_n = min(64, block_size - max(prefixes))
        curves = profile_verify_cost(model, prefixes, max_n)
        if args.json:
            print(json.dumps(dict(header, profile={str(p): c for p, c in curves.items()})))
            return 0
        print(f"# {header['command']}  ({device}, {header['dtype']}, {header['params_millions']}M parameters, "
              f"{header['threads']} threads)")
        print("verify-pass cost r(n) = time(n new tokens) / time(1), after P cached tokens")
        print("   n " + "".join(f"{'P=' + str(p):>9}" for p in prefixes))
        for n in range(1, max_n + 1):
            print(f"{n:>4} " + "".join(f"{curves[p]['r'][n - 1]:>9.2f}" for p in prefixes))
        print("time(1): " + ", ".join(f"P={p} {curves[p]['seconds_1'] * 1e3:.2f} ms" for p in prefixes))
        return 0

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UserError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; methods: {', '.join(METHODS)}")
    if "none" not in methods:
        methods.insert(0, "none")  # the baseline every speedup is measured against
    if args.num_prompts < 1:
        raise UserError("--num-prompts must be at least 1")
    if not 1 <= args.prompt_len <= block_size:
        raise UserError(f"--prompt-len must be between 1 and the model's context of {block_size}")
    text = read_text(args.data or state.get("data"))
    prompts = held_out_prompts(tokenizer, text, args.num_prompts, args.prompt_len, args.seed)
    totals = run_methods(model, methods, prompts, sampling, args.max_new_tokens, args.seed, device)

    base = totals["none"].tokens_per_s
    rows = [dict(method=m, tau=s.tau, alpha=s.alpha, tokens_per_s=s.tokens_per_s,
                 speedup=s.tokens_per_s / base, new_tokens=s.new_tokens, target_forwards=s.target_forwards)
            for m, s in totals.items()]
    settings = dict(num_prompts=args.num_prompts, prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if args.json:
        print(json.dumps(dict(header, **settings, rows=rows)))
        return 0
    print(f"# {header['command']}  ({device}, {header['dtype']}, {header['params_millions']}M parameters, "
          f"{header['threads']} threads)")
    print(f"# {args.num_prompts} held-out prompts x {args.prompt_len} tokens, {args.max_new_tokens} new tokens each, "
          f"{'greedy' if sampling.greedy else f'temperature {args.temperature}'}")
    print(f"{'method':<10}{'tau':>7}{'alpha':>8}{'tokens/s':>11}{'speedup':>9}")
    for r in rows:
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
        print(f"{r['method']:<10}{r['tau']:>7.2f}{alpha:>8}{r['tokens_per_s']:>11.1f}{r['speedup']:>8.2f}x")
    return 0


if __name__ == "__main__":
    cli.run(main)
