"""Generate text with a trained SpecGPT model, plainly or speculatively.

    python generate.py --prompt "ROMEO:" --max-new-tokens 300
    python generate.py --prompt "ROMEO:" --temperature 0 --dtype float64 --json

An empty prompt starts from a newline, the way a play's text starts a new line.
"""
import json
import os
import sys

import torch

import cli
from decode import METHODS
from decode.sampling import Sampling
from errors import UserError
from model.checkpoint import load_model

MAX_NEW_TOKENS = 100_000  # beyond this a typo is likelier than intent
EMPTY_PROMPT = "\n"


def add_sampling_args(p, temperature=0.8):
    p.add_argument("--max-new-tokens", type=int, default=300, help="how many tokens to generate (default 300)")
    p.add_argument("--temperature", type=float, default=temperature,
                   help=f"softmax temperature; 0 = greedy (default {temperature})")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1] (default 1)")
    p.add_argument("--seed", type=int, default=1337)


def sampling_from_args(args):
    """Validated Sampling settings from the flags of add_sampling_args."""
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS:,}, got {args.max_new_tokens}")
    if not args.temperature >= 0:  # also refuses NaN
        raise UserError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    return Sampling(args.temperature, args.top_k, args.top_p)


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="out", help="directory holding target.pt (default: out)")
    p.add_argument("--prompt", default=EMPTY_PROMPT, help="text to continue (default: a newline)")
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file instead")
    add_sampling_args(p)
    p.add_argument("--spec", choices=list(METHODS), default="none", help="speculative method (default: none)")
    cli.add_device_args(p, dtype_help="default: float32 on CPU, bfloat16 on CUDA; float64 for exactness checks")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of streaming")
    return p.parse_args(argv)


def read_prompt(args):
    if args.prompt_file is None:
        return args.prompt or EMPTY_PROMPT
    try:
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read() or EMPTY_PROMPT
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"prompt file {args.prompt_file} does not exist") from None
    except UnicodeDecodeError:
        raise UserError(f"prompt file {args.prompt_file} is not UTF-8 text") from None


def main(argv=None):
    args = parse_args(argv)
    sampling = sampling_from_args(args)
    device = cli.resolve_device(args.device)
    dtype = cli.resolve_dtype(args.dtype, device)
    prompt = read_prompt(args)
    model, tokenizer, _ = load_model(os.path.join(args.out_dir, "target.pt"), device=device, dtype=dtype)
    prompt_ids = tokenizer.encode(prompt)
    if len(prompt_ids) > model.config.block_size:
        raise UserError(f"the prompt is {len(prompt_ids)} tokens, longer than the model's context of "
                        f"{model.config.block_size}: shorten it")

    torch.manual_seed(args.seed)
    generator = torch.Generator(device).manual_seed(args.seed)
    on_token = None
    if not args.json:
        decoder = tokenizer.stream_decoder()
        sys.stdout.write(prompt)

        def on_token(token):
            sys.stdout.write(decoder.push(token))
            sys.stdout.flush()

    new_ids, stats = METHODS[args.spec](model, prompt_ids, args.max_new_tokens, sampling, generator, on_token)
    text = tokenizer.decode(new_ids)
    chars_per_s = len(text) / stats.seconds if stats.seconds else 0.0
    if args.json:
        print(json.dumps(dict(text=text, prompt=prompt, spec=args.spec, new_tokens=stats.new_tokens,
                              target_forwards=stats.target_forwards, tokens_per_s=stats.tokens_per_s,
                              chars_per_s=chars_per_s, seconds=stats.seconds, tau=stats.tau, alpha=stats.alpha)))
    else:
        print(decoder.flush())
        alpha = "" if stats.alpha is None else f" | alpha {stats.alpha:.2f}"
        print(f"[{args.spec}] {stats.new_tokens} new tokens | {stats.target_forwards} target forwards | "
              f"tau {stats.tau:.2f}{alpha} | {stats.tokens_per_s:.1f} tokens/s | {chars_per_s:.1f} chars/s",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(main)
