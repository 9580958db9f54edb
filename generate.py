"""Generate text with a trained SpecGPT model, plainly or speculatively.

    python generate.py --prompt "ROMEO:" --max-new-tokens 300
    python generate.py --prompt "ROMEO:" --temperature 0 --dtype float64 --json
    python generate.py --spec lookahead --compare
    python generate.py --spec draft --k auto --compare --show
    python generate.py --spec medusa --medusa-tree 16 --compare
    python generate.py --spec eagle --eagle chain:4 --compare --show
    python generate.py --target gpt2-medium.pt --spec draft --draft gpt2.pt --prompt "Hello"
    python generate.py --prompt-file prompts.txt --batch-size 8 --spec prompt-lookup --json
    python generate.py --spec eagle --temperature 0.8 --trace eagle   # eagle.html: every round drawn

An empty prompt starts from a newline, the way a play's text starts a new line.
"""
import contextlib
import json
import os
import sys
import time

import torch

import cli
import trace_page
from decode import Plain, generate_batch
from decode.methods import METHODS, load_draft, make_proposer, parse_setting
from decode.trace import Trace
from model.compiled import StaticGPT
from model.eagle import load_eagle
from model.medusa import load_medusa

EMPTY_PROMPT = "\n"
SOURCE_COLOURS = {"draft": "\033[32m", "corrected": "\033[31m", "bonus": "\033[34m"}  # ANSI colours
RESET = "\033[0m"


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    cli.add_checkpoint_args(p)
    p.add_argument("--prompt", default=EMPTY_PROMPT, help="text to continue (default: a newline)")
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file instead; with --batch-size, one "
                   "prompt per line (a .jsonl file: a JSON string or an object with a \"prompt\" field per line)")
    p.add_argument("--batch-size", type=int, metavar="B", help="decode the prompts of --prompt-file B at a time, in "
                   "one batch: one target pass per round for all rows, each row speculating on its own; prints "
                   "each text when its batch is done")
    cli.add_sampling_args(p)
    p.add_argument("--spec", choices=list(METHODS), default="none", help="speculative method (default: none)")
    cli.add_method_args(p)
    p.add_argument("--compare", action="store_true", help="also decode plainly with the same settings and seed; "
                   "report the speedup and, for greedy, whether the texts are identical (--json also carries the "
                   "plain text)")
    p.add_argument("--show", action="store_true", help="colour each token by where it came from: green an accepted "
                   "draft token, red the target's correction, blue the target's bonus token (only on a terminal)")
    cli.add_device_args(p, dtype_help="default: float32 on CPU, bfloat16 on CUDA; float64 for exactness checks")
    cli.add_attn_arg(p)
    cli.add_compile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of streaming")
    p.add_argument("--trace", metavar="FILE", help="write every round (the candidates, what the verifier judged, "
                   "p(x) and q(x), the tokens added) as a page, FILE.html, and as data, FILE.json; one prompt")
    return p.parse_args(argv)


def read_prompt(args):
    if args.prompt_file is None:
        return args.prompt or EMPTY_PROMPT
    try:
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read() or EMPTY_PROMPT
    except (FileNotFoundError, IsADirectoryError):
        raise cli.UserError(f"prompt file {args.prompt_file} does not exist") from None
    except UnicodeDecodeError:
        raise cli.UserError(f"prompt file {args.prompt_file} is not UTF-8 text") from None


def read_prompts(args):
    """The prompts of --prompt-file, one per line (JSON Lines for a .jsonl file), for --batch-size."""
    if args.prompt_file is None:
        raise cli.UserError("--batch-size needs --prompt-file, with one prompt per line")
    if args.batch_size < 1:
        raise cli.UserError("--batch-size must be at least 1")
    lines = [line for line in read_prompt(args).splitlines() if line.strip()]
    if not args.prompt_file.endswith(".jsonl"):
        return lines or [EMPTY_PROMPT]
    prompts = []
    for number, line in enumerate(lines, 1):
        try:
            value = json.loads(line)
        except ValueError:
            raise cli.UserError(f"{args.prompt_file}, line {number}: not JSON") from None
        value = value.get("prompt") if isinstance(value, dict) else value
        if not isinstance(value, str):
            raise cli.UserError(f"{args.prompt_file}, line {number}: expected a string or an object with a "
                                f"\"prompt\" string")
        prompts.append(value or EMPTY_PROMPT)
    if not prompts:
        raise cli.UserError(f"{args.prompt_file} holds no prompts")
    return prompts


def main(argv=None):
    args = parse_args(argv)
    setting = cli.setting_of(args, args.spec)
    parse_setting(args.spec, setting)  # bad settings are refused before anything is loaded
    prompts = read_prompts(args) if args.batch_size is not None else [read_prompt(args)]
    check_trace(args)
    sampling, device, dtype, model, tokenizer, _ = cli.setup(args)
    all_ids = encode_prompts(args, tokenizer, prompts, model.config.block_size)
    model, new_proposer = load_method(args, setting, model, tokenizer, device, dtype)
    if args.batch_size is not None:
        return decode_batches(args, model, tokenizer, prompts, all_ids, sampling, device, new_proposer)
    return decode_prompt(args, model, tokenizer, prompts[0], all_ids[0], sampling, device, new_proposer())


def encode_prompts(args, tokenizer, prompts, block_size):
    all_ids = [tokenizer.encode(p) for p in prompts]
    for number, ids in enumerate(all_ids, 1):
        if len(ids) > block_size:
            where = f"prompt {number}" if args.batch_size is not None else "the prompt"
            raise cli.UserError(f"{where} is {len(ids)} tokens, longer than the model's context of "
                                f"{block_size}: shorten it")
    return all_ids


def load_method(args, setting, model, tokenizer, device, dtype):
    """(the target, compiled if asked, and new_proposer(batch_size) for --spec), loading what it needs
    (compiled passes included) before anything is timed."""
    costs = cli.stored_costs(args, device, dtype)
    draft = load_draft(cli.checkpoint_of(args, "draft"), tokenizer, device, dtype) if args.spec == "draft" else None
    heads = load_medusa(cli.checkpoint_of(args, "medusa"), model, tokenizer, device, dtype) if args.spec == "medusa" else None
    eagle_head = load_eagle(cli.checkpoint_of(args, "eagle"), model, tokenizer, device, dtype) if args.spec == "eagle" else None
    model, draft = (cli.compiled_where_it_pays(m, cli.checkpoint_of(args, kind), args, device, dtype)
                    for m, kind in ((model, "target"), (draft, "draft")))

    def new_proposer(batch_size=1):
        return make_proposer(args.spec, setting, model, draft, heads, sizing=args.sizing,
                             pool_from_prompt=args.pool_from_prompt, typical=args.typical, costs=costs,
                             eagle_head=eagle_head, batch_size=batch_size)
    for static in (m for m in (model, draft) if isinstance(m, StaticGPT)):
        static.prepare()  # loaded before it is timed
    return model, new_proposer


def decode_prompt(args, model, tokenizer, prompt, prompt_ids, sampling, device, proposer):
    """One prompt: the text streamed as it is accepted (or one JSON object), then a summary line."""
    if args.compare:
        warm_up(model, [prompt_ids], sampling, [proposer], [Plain()])
    decoder = tokenizer.stream_decoder()
    if not args.json:
        sys.stdout.write(prompt)
    lossy = bool(args.spec == "medusa" and args.typical)
    trace = Trace(sampling, lossy) if args.trace else None
    with new_fallback(args, model, device, batch_size=1) as fallback:
        (new_ids,), (stats,), _ = decode_all(args, model, [prompt_ids], sampling, device, [proposer], fallback,
                                             None if args.json else token_printer(args, decoder),
                                             trace and (lambda row, outcome: trace.record(outcome)))
    text = tokenizer.decode(new_ids)
    result = dict(text=text, prompt=prompt, spec=args.spec, setting=cli.setting_of(args, args.spec),
                  lossy=lossy, dtype=cli.dtype_name(model.lm_head.weight.dtype),
                  compiled=isinstance(model, StaticGPT),
                  new_tokens=stats.new_tokens,
                  target_forwards=stats.target_forwards, draft_forwards=stats.draft_forwards,
                  tokens_per_s=stats.tokens_per_s, chars_per_s=len(text) / stats.seconds if stats.seconds else 0.0,
                  seconds=stats.seconds, tau=stats.tau, alpha=stats.alpha, held=stats.held)
    if args.compare:
        (plain_ids,), (plain_stats,), _ = decode_all(args, model, [prompt_ids], sampling, device, [Plain()])
        result.update(plain_text=tokenizer.decode(plain_ids), plain_tokens_per_s=plain_stats.tokens_per_s,
                      speedup=stats.tokens_per_s / plain_stats.tokens_per_s,
                      identical_to_plain=(plain_ids == new_ids) if sampling.greedy else None)
    if trace:
        write_trace(args, trace.as_dict(stats, lambda t: tokenizer.token_bytes(t).decode("utf-8", "replace"),
                                        method=args.spec, setting=result["setting"], dtype=result["dtype"],
                                        prompt=prompt, text=text, prompt_tokens=prompt_ids, tokens=new_ids))
    if args.json:
        print(json.dumps(result))
        return 0
    print(decoder.flush())
    print(summary_line(args, stats, result, sampling), file=sys.stderr)
    return 0


def token_printer(args, decoder):
    """on_token for streaming: each token's text as soon as it decodes, coloured by source with --show."""
    colours = SOURCE_COLOURS if args.show and sys.stdout.isatty() else {}

    def print_token(row, token, source):
        text = decoder.push(token)
        if text and source in colours:
            text = f"{colours[source]}{text}{RESET}"
        sys.stdout.write(text)
        sys.stdout.flush()
    return print_token


def summary_line(args, stats, result, sampling):
    lossy = " (typical acceptance: LOSSY)" if result["lossy"] else ""
    line = (f"[{args.spec}{lossy}] {stats.new_tokens} new tokens | {stats.target_forwards} target forwards | "
            f"tau {stats.tau:.2f}")
    if stats.alpha is not None:
        line += f" | alpha {stats.alpha:.2f}"
    if stats.draft_forwards:
        line += f" | {stats.draft_forwards} draft forwards"
    line += held_note(stats.held)
    line += f" | {stats.tokens_per_s:.1f} tokens/s | {result['chars_per_s']:.1f} chars/s"
    if args.compare:
        line += f"\n[none] {result['plain_tokens_per_s']:.1f} tokens/s | speedup {result['speedup']:.2f}x"
        if sampling.greedy:
            line += f" | identical to plain: {'yes' if result['identical_to_plain'] else 'NO'}"
    if args.show and sys.stdout.isatty():
        line += "\n(green: accepted draft token, red: the target's correction, blue: the target's bonus token)"
    return line


def decode_all(args, model, all_ids, sampling, device, proposers, fallback=None, on_token=None, on_round=None):
    """The prompts in batches of len(proposers), from the seed: (each prompt's new token ids, its
    DecodeStats, the seconds it all took)."""
    torch.manual_seed(args.seed)
    generator = torch.Generator(device).manual_seed(args.seed)
    outputs, stats, started = [], [], time.perf_counter()
    for i in range(0, len(all_ids), len(proposers)):
        batch = all_ids[i:i + len(proposers)]
        new, batch_stats = generate_batch(model, batch, args.max_new_tokens, sampling, generator, on_token,
                                          proposers[:len(batch)], fallback, on_round)
        outputs += new
        stats += batch_stats
    return outputs, stats, time.perf_counter() - started


def warm_up(model, batch, sampling, *proposer_lists):
    """A first call pays for allocation and cold caches: none of the timed runs should."""
    for proposers in proposer_lists:
        generate_batch(model, batch, 4, sampling, proposers=proposers[:len(batch)])


def new_fallback(args, model, device, batch_size):
    """The measured fallback to plain rounds, kept from run to run (cli.kept_fallback), unless
    --no-fallback (plain decoding needs none)."""
    if not args.fallback or args.spec == "none":
        return contextlib.nullcontext()
    return cli.kept_fallback(args, f"{args.spec} {cli.setting_of(args, args.spec)}", batch_size, device,
                             model.lm_head.weight.dtype)


def check_trace(args):
    """--trace: refused before anything runs where it cannot be written, or would follow many prompts."""
    if args.trace is None:
        return
    if args.batch_size is not None:
        raise cli.UserError("--trace follows one prompt: leave out --batch-size")
    folder = os.path.dirname(trace_page.stem(args.trace)) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise cli.UserError(f"--trace {args.trace}: cannot write in {folder}")


def write_trace(args, data):
    try:
        paths = trace_page.write(args.trace, data)
    except OSError as e:
        raise cli.UserError(f"--trace {args.trace}: {e.strerror or e}") from None
    print(f"trace: {' and '.join(paths)}", file=sys.stderr)


def held_note(held):
    return f" | held plain in {held:.0%} of rounds (measured slower)" if held else ""


def decode_batches(args, model, tokenizer, prompts, all_ids, sampling, device, new_proposer):
    """--batch-size: the prompts in batches, each row with its own proposer; each text is printed
    (or written as a JSON line) when its batch is done, then one summary line."""
    size = min(args.batch_size, len(prompts))
    proposers = [new_proposer(size) for _ in range(size)]
    plain = [Plain() for _ in range(size)]
    if args.compare:
        warm_up(model, all_ids[:size], sampling, proposers, plain)
    with new_fallback(args, model, device, size) as fallback:  # one for all the batches: what it measures carries over
        outputs, stats, seconds = decode_all(args, model, all_ids, sampling, device, proposers, fallback)
    total = sum(s.new_tokens for s in stats)
    if args.compare:
        plain_outputs, _, plain_seconds = decode_all(args, model, all_ids, sampling, device, plain)
    for number, (prompt, new_ids, s) in enumerate(zip(prompts, outputs, stats)):
        text = tokenizer.decode(new_ids)
        if args.json:
            row = dict(prompt=prompt, text=text, spec=args.spec, dtype=cli.dtype_name(model.lm_head.weight.dtype),
                       compiled=isinstance(model, StaticGPT) and size == 1,  # the program takes one-row passes
                       new_tokens=s.new_tokens, target_forwards=s.target_forwards, tau=s.tau, alpha=s.alpha, held=s.held)
            if args.compare:
                row["plain_text"] = tokenizer.decode(plain_outputs[number])
                if sampling.greedy:
                    row["identical_to_plain"] = plain_outputs[number] == new_ids
            print(json.dumps(row))
        else:
            print(f"--- prompt {number + 1} ---\n{prompt}{text}")
    line = (f"[{args.spec}] {len(prompts)} prompts in batches of {size} | {total} new tokens | "
            f"{total / seconds:.1f} tokens/s in all")
    line += held_note(sum(s.held_rounds for s in stats) / max(1, sum(s.rounds for s in stats)))
    if args.compare:
        line += f"\n[none] {total / plain_seconds:.1f} tokens/s | speedup {plain_seconds / seconds:.2f}x"
        if sampling.greedy:
            same = sum(a == b for a, b in zip(outputs, plain_outputs))
            line += f" | identical to plain: {same} of {len(prompts)}"
    print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(main)
