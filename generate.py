"""Generate text with a trained SpecGPT model, plainly or speculatively.

    python generate.py --prompt "ROMEO:" --max-new-tokens 300
    python generate.py --prompt "ROMEO:" --temperature 0 --dtype float64 --json
    python generate.py --spec draft --k 4 --compare --show
    python generate.py --spec lookahead --window 5 --ngram 3 --guesses 5 --compare
    python generate.py --spec medusa --tree-size 32 --compare

An empty prompt starts from a newline, the way a play's text starts a new line.
"""
import json
import os
import sys

import torch

import cli
from decode import SPEC_METHODS, DraftModel, Jacobi, Lookahead, Medusa, Plain, PromptLookup, generate
from decode.cost import cost_curve, extended
from decode.medusa import build_tree
from decode.sampling import Sampling
from errors import UserError
from model.checkpoint import load_model
from model.medusa import load_medusa

MAX_NEW_TOKENS = 100_000  # beyond this a typo is likelier than intent
EMPTY_PROMPT = "\n"
SOURCE_COLOURS = {"draft": "\033[32m", "corrected": "\033[31m", "bonus": "\033[34m"}  # ANSI colours
RESET = "\033[0m"
JACOBI_WINDOW = 5
LOOKAHEAD_DEFAULT = (2, 2, 2)  # W, N, G: the bounds a sized pass works within (chosen by measurement, README)


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


def add_method_args(p):
    g = p.add_argument_group("speculative methods")
    g.add_argument("--k", default="4",
                   help="draft: guesses per round: a number, 'auto' (chosen each round from the measured "
                        "costs and acceptance) or 'heuristic' (Hugging Face's schedule) (default 4)")
    g.add_argument("--window", type=int, default=None,
                   help=f"lookahead: window columns W (default {LOOKAHEAD_DEFAULT[0]}); jacobi: guesses per "
                        f"pass (default {JACOBI_WINDOW})")
    g.add_argument("--ngram", type=int, default=LOOKAHEAD_DEFAULT[1],
                   help=f"lookahead: n-gram size N, so N-1 Jacobi levels (default {LOOKAHEAD_DEFAULT[1]})")
    g.add_argument("--guesses", type=int, default=LOOKAHEAD_DEFAULT[2],
                   help=f"lookahead: at most G pool n-grams verified per pass (default {LOOKAHEAD_DEFAULT[2]})")
    g.add_argument("--pool-from-prompt", action="store_true", help="lookahead: seed the n-gram pool from the prompt")
    g.add_argument("--sizing", choices=["auto", "fixed"], default="auto",
                   help="lookahead: auto sizes every pass from this machine's measured cost curve r(n) and the "
                        "acceptance so far, carrying the window and the n-grams only while they pay for "
                        "themselves, down to a plain step; fixed carries all of W, N, G every pass, as in "
                        "the paper (default auto)")
    g.add_argument("--match-len", type=int, default=3,
                   help="ngram: longest suffix to look up in the context (default 3)")
    g.add_argument("--num-proposed", type=int, default=5, help="ngram: tokens proposed per match (default 5)")
    g.add_argument("--num-matches", type=int, default=2,
                   help="ngram: continuations verified together as a tree (default 2)")
    g.add_argument("--tree", choices=["default", "chain"], default="default",
                   help="medusa: the tree saved with the heads, or the top-1 of each head as a chain")
    g.add_argument("--tree-size", type=int, default=None,
                   help="medusa: build a tree of this many candidates from the heads' measured accuracies")
    g.add_argument("--typical", action="store_true",
                   help="medusa: typical acceptance (epsilon 0.09, delta 0.3). LOSSY: faster when sampling, "
                        "but no longer samples the target's distribution exactly")


def parse_k(value, k_max=16):
    """(k, schedule) from a --k value."""
    if value in ("auto", "heuristic"):
        return 4, value
    if not value.isdigit() or not 1 <= int(value) <= k_max:
        raise UserError(f"--k must be a number from 1 to {k_max}, 'auto' or 'heuristic', got {value!r}")
    return int(value), "fixed"


def load_draft(out_dir, tokenizer, device, dtype):
    """The draft model of out_dir, refused unless it speaks the target's tokenizer."""
    path = os.path.join(out_dir, "draft.pt")
    if not os.path.exists(path):
        raise UserError(f"no draft model at {path}: run python train.py --what draft first")
    draft, draft_tokenizer, _ = load_model(path, kind="draft", device=device, dtype=dtype)
    if draft_tokenizer.spec != tokenizer.spec:
        raise UserError(f"{path} uses another tokenizer ({draft_tokenizer.name}) than the target "
                        f"({tokenizer.name}): retrain it with python train.py --what draft")
    return draft


def load_heads(out_dir, model, tokenizer, device, dtype):
    """(Medusa heads, their checkpoint dict) for this target."""
    return load_medusa(os.path.join(out_dir, "medusa.pt"), model, tokenizer, device, dtype)


def medusa_proposer(heads, state, tree="default", tree_size=None, typical=False):
    if tree == "chain":
        paths = "chain"
    elif tree_size is not None:
        if not 1 <= tree_size <= 256:
            raise UserError(f"--tree-size must be between 1 and 256, got {tree_size}")
        paths = build_tree(state["accuracies"], tree_size)
    else:
        paths = state["tree"]
    return Medusa(heads, paths, typical=(0.09, 0.3) if typical else None)


def lookahead_proposer(model, window, ngram, guesses, pool_from_prompt=False, sizing="auto"):
    """Lookahead with fixed sizes, or sized every pass from the cost curve measured here and now."""
    cost = None
    if sizing == "auto":
        largest_pass, half = (window + guesses) * (ngram - 1) + 1, model.config.block_size // 2
        cost = extended(cost_curve(model, min(largest_pass, half), half, repeats=5, tree=True)[0], largest_pass)
    return Lookahead(model, window, ngram, guesses, pool_from_prompt, cost)


def make_proposer(spec, args, model, draft=None, medusa=None):
    """The proposer of `spec`, configured from the method flags of add_method_args; `draft` is the
    draft model, `medusa` the (heads, checkpoint dict) pair, for the methods that need them."""
    for flag in ("window", "ngram", "guesses", "match_len", "num_proposed", "num_matches"):
        value = getattr(args, flag)
        if value is not None and not 1 <= value <= 64:
            raise UserError(f"--{flag.replace('_', '-')} must be between 1 and 64, got {value}")
    if spec == "none":
        return Plain()
    if spec == "draft":
        k, schedule = parse_k(args.k)
        return DraftModel(draft, k, schedule, target=model)
    if spec == "jacobi":
        return Jacobi(model, args.window or JACOBI_WINDOW)
    if spec == "lookahead":
        if args.ngram < 2:
            raise UserError("--ngram must be at least 2 for lookahead (N = 2 is Jacobi decoding with a pool)")
        return lookahead_proposer(model, args.window or LOOKAHEAD_DEFAULT[0], args.ngram, args.guesses,
                               args.pool_from_prompt, args.sizing)
    if spec == "medusa":
        return medusa_proposer(*medusa, args.tree, args.tree_size, args.typical)
    return PromptLookup(args.match_len, args.num_proposed, args.num_matches)


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="out", help="directory holding target.pt (default: out)")
    p.add_argument("--prompt", default=EMPTY_PROMPT, help="text to continue (default: a newline)")
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file instead")
    add_sampling_args(p)
    p.add_argument("--spec", choices=SPEC_METHODS, default="none", help="speculative method (default: none)")
    add_method_args(p)
    p.add_argument("--compare", action="store_true",
                   help="also decode plainly with the same settings and seed; report the speedup and, "
                        "for greedy, whether the texts are identical")
    p.add_argument("--show", action="store_true",
                   help="colour each token by where it came from: green an accepted draft token, red the "
                        "target's correction, blue the target's bonus token (only on a terminal)")
    cli.add_device_args(p, dtype_help="default: float32 on CPU, bfloat16 on CUDA; float64 for exactness checks")
    cli.add_attn_arg(p)
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


def setup(args):
    """What generate.py and bench.py both start from: (Sampling, device, dtype, target model,
    tokenizer, target checkpoint dict), with the attention backend chosen."""
    sampling = sampling_from_args(args)
    device = cli.resolve_device(args.device)
    dtype = cli.resolve_dtype(args.dtype, device)
    cli.use_attn(args.attn, device, dtype)
    model, tokenizer, state = load_model(os.path.join(args.out_dir, "target.pt"), device=device, dtype=dtype)
    return sampling, device, dtype, model, tokenizer, state


def main(argv=None):
    args = parse_args(argv)
    prompt = read_prompt(args)
    sampling, device, dtype, model, tokenizer, _ = setup(args)
    prompt_ids = tokenizer.encode(prompt)
    if len(prompt_ids) > model.config.block_size:
        raise UserError(f"the prompt is {len(prompt_ids)} tokens, longer than the model's context of "
                        f"{model.config.block_size}: shorten it")

    draft = load_draft(args.out_dir, tokenizer, device, dtype) if args.spec == "draft" else None
    medusa = load_heads(args.out_dir, model, tokenizer, device, dtype) if args.spec == "medusa" else None
    proposer = make_proposer(args.spec, args, model, draft, medusa)

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
    result = dict(text=text, prompt=prompt, spec=args.spec, lossy=bool(args.spec == "medusa" and args.typical),
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
