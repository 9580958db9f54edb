"""Generate text with a trained SpecGPT model, plainly or speculatively.

    python generate.py --prompt "ROMEO:" --max-new-tokens 300
    python generate.py --prompt "ROMEO:" --temperature 0 --dtype float64 --json
    python generate.py --spec lookahead --compare
    python generate.py --spec draft --k auto --compare --show
    python generate.py --spec medusa --medusa-tree 16 --compare
    python generate.py --spec eagle --eagle chain:4 --compare --show
    python generate.py --target gpt2-medium.pt --spec draft --draft gpt2.pt --prompt "Hello"

An empty prompt starts from a newline, the way a play's text starts a new line.
"""
import json
import sys

import torch

import cli
from decode import Plain, generate
from decode.methods import METHODS, load_draft, make_proposer, parse_setting
from model.eagle import load_eagle
from model.medusa import load_medusa

EMPTY_PROMPT = "\n"
SOURCE_COLOURS = {"draft": "\033[32m", "corrected": "\033[31m", "bonus": "\033[34m"}  # ANSI colours
RESET = "\033[0m"


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    cli.add_checkpoint_args(p)
    p.add_argument("--prompt", default=EMPTY_PROMPT, help="text to continue (default: a newline)")
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file instead")
    cli.add_sampling_args(p)
    p.add_argument("--spec", choices=list(METHODS), default="none", help="speculative method (default: none)")
    cli.add_method_args(p)
    p.add_argument("--compare", action="store_true",
                   help="also decode plainly with the same settings and seed; report the speedup and, "
                        "for greedy, whether the texts are identical")
    p.add_argument("--show", action="store_true",
                   help="colour each token by where it came from: green an accepted draft token, red the "
                        "target's correction, blue the target's bonus token (only on a terminal)")
    cli.add_device_args(p, dtype_help="default: float32 on CPU, bfloat16 on CUDA; float64 for exactness checks")
    cli.add_attn_arg(p)
    cli.add_compile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of streaming")
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


def main(argv=None):
    args = parse_args(argv)
    setting = cli.setting_of(args, args.spec)
    parse_setting(args.spec, setting)  # bad settings are refused before anything is loaded
    prompt = read_prompt(args)
    sampling, device, dtype, model, tokenizer, _ = cli.setup(args)
    costs = cli.stored_costs(args, device, dtype)
    prompt_ids = tokenizer.encode(prompt)
    if len(prompt_ids) > model.config.block_size:
        raise cli.UserError(f"the prompt is {len(prompt_ids)} tokens, longer than the model's context of "
                            f"{model.config.block_size}: shorten it")

    draft = load_draft(cli.checkpoint_of(args, "draft"), tokenizer, device, dtype) if args.spec == "draft" else None
    heads = load_medusa(cli.checkpoint_of(args, "medusa"), model, tokenizer, device, dtype) if args.spec == "medusa" else None
    eagle_head = load_eagle(cli.checkpoint_of(args, "eagle"), model, tokenizer, device, dtype) if args.spec == "eagle" else None
    model = cli.compiled(model, cli.checkpoint_of(args, "target"), args, device, dtype)
    draft = cli.compiled(draft, cli.checkpoint_of(args, "draft"), args, device, dtype)
    proposer = make_proposer(args.spec, setting, model, draft, heads,
                             sizing=args.sizing, pool_from_prompt=args.pool_from_prompt, typical=args.typical,
                             costs=costs, eagle_head=eagle_head)

    if args.compare:  # a first call pays for allocation and cold caches: neither timed run should
        for warm_up in (proposer, Plain()):
            generate(model, prompt_ids, 4, sampling, proposer=warm_up)

    def decode(proposer, on_token=None):
        torch.manual_seed(args.seed)
        generator = torch.Generator(device).manual_seed(args.seed)
        return generate(model, prompt_ids, args.max_new_tokens, sampling, generator, on_token, proposer)

    on_token = None
    if not args.json:
        decoder = tokenizer.stream_decoder()
        colours = SOURCE_COLOURS if args.show and sys.stdout.isatty() else {}
        sys.stdout.write(prompt)

        def print_token(token, source):
            text = decoder.push(token)
            if text and source in colours:
                text = f"{colours[source]}{text}{RESET}"
            sys.stdout.write(text)
            sys.stdout.flush()
        on_token = print_token

    new_ids, stats = decode(proposer, on_token)
    text = tokenizer.decode(new_ids)
    chars_per_s = len(text) / stats.seconds if stats.seconds else 0.0
    result = dict(text=text, prompt=prompt, spec=args.spec, setting=setting,
                  lossy=bool(args.spec == "medusa" and args.typical),
                  new_tokens=stats.new_tokens,
                  target_forwards=stats.target_forwards, draft_forwards=stats.draft_forwards,
                  tokens_per_s=stats.tokens_per_s, chars_per_s=chars_per_s, seconds=stats.seconds,
                  tau=stats.tau, alpha=stats.alpha)
    if args.compare:
        plain_ids, plain_stats = decode(Plain())
        result.update(plain_tokens_per_s=plain_stats.tokens_per_s,
                      speedup=stats.tokens_per_s / plain_stats.tokens_per_s,
                      identical_to_plain=(plain_ids == new_ids) if sampling.greedy else None)
    if args.json:
        print(json.dumps(result))
        return 0
    print(decoder.flush())
    lossy = " (typical acceptance: LOSSY)" if result["lossy"] else ""
    line = (f"[{args.spec}{lossy}] {stats.new_tokens} new tokens | {stats.target_forwards} target forwards | "
            f"tau {stats.tau:.2f}")
    if stats.alpha is not None:
        line += f" | alpha {stats.alpha:.2f}"
    if stats.draft_forwards:
        line += f" | {stats.draft_forwards} draft forwards"
    line += f" | {stats.tokens_per_s:.1f} tokens/s | {chars_per_s:.1f} chars/s"
    if args.compare:
        line += f"\n[none] {result['plain_tokens_per_s']:.1f} tokens/s | speedup {result['speedup']:.2f}x"
        if sampling.greedy:
            line += f" | identical to plain: {'yes' if result['identical_to_plain'] else 'NO'}"
    if args.show and sys.stdout.isatty():
        line += "\n(green: accepted draft token, red: the target's correction, blue: the target's bonus token)"
    print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(main)
