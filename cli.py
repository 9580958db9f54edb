"""What the command-line tools share: argument parsing, device and dtype choice, loading the
target, the sampling and method flags, and turning bad input into one line of advice."""
import argparse
import contextlib
import copy
import gc
import os
import sys

import torch

import kernels
from data import DataError
from decode import Fallback
from decode.cost import StoredCosts, forward_seconds, profile_prefix
from decode.lookahead import SIZING
from decode.methods import METHODS, SettingError
from decode.sampling import Sampling
from model.checkpoint import CheckpointError, checkpoint_path, load_model
from model.compiled import StaticGPT
from model.tokenizer import TokenizerError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_NEW_TOKENS = 100_000  # beyond this a typo is likelier than intent
TRAIN_COMMAND = {"target": "python train.py", "draft": "python train.py --what draft",
                 "medusa": "python train.py --what medusa", "eagle": "python train.py --what eagle"}


class UserError(Exception):
    """Bad input from the user (a missing file, a wrong flag value); never a bug in SpecGPT."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other error of ours."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def run(main):
    """Run main(); bad input becomes one line on stderr and exit status 2, never a traceback."""
    try:
        sys.exit(main())
    except (UserError, CheckpointError, DataError, SettingError, TokenizerError) as e:
        retrain = getattr(e, "retrain", None)  # a CheckpointError may name the training that makes a good one
        print(f"error: {e}" + (f": train it with {TRAIN_COMMAND[retrain]}" if retrain else ""), file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def add_checkpoint_args(parser, draft=True):
    parser.add_argument("--out-dir", default="out",
                        help="directory of train.py's checkpoints: target.pt, draft.pt, medusa.pt, eagle.pt (default: out)")
    parser.add_argument("--target", metavar="PATH", help="target checkpoint (default: OUT_DIR/target.pt), e.g. a "
                                                         "GPT-2 imported with python -m model.convert")
    if draft:
        parser.add_argument("--draft", metavar="PATH",
                            help="draft checkpoint (default: OUT_DIR/draft.pt): one trained by train.py --what "
                                 "draft, or a smaller target of the same family and tokenizer")


def checkpoint_of(args, kind):
    """The checkpoint file of `kind` the flags name: --target or --draft if given, else OUT_DIR's."""
    path = getattr(args, kind, None) if kind in ("target", "draft") else None  # --eagle is a setting
    if path is None:
        return checkpoint_path(args.out_dir, kind)
    if not os.path.isfile(path):
        raise UserError(f"--{kind} {path}: no such file")
    return path


def add_device_args(parser, dtype_help="default: float32 on CPU, bfloat16 on CUDA"):
    parser.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:N, mps")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default=None,
                        help=dtype_help + "; auto: bfloat16 on CUDA; decoding on a CPU, float32 or bfloat16, "
                                          "whichever measured faster here")


def resolve_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name} asked for, but CUDA is not available here (try --device cpu)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps asked for, but MPS is not available here (try --device cpu)")
    try:
        return str(torch.device(name))
    except RuntimeError:
        raise UserError(f"unknown --device {name!r} (auto, cpu, cuda, cuda:N, mps)") from None


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def resolve_dtype(name, device):
    """The dtype --dtype names; unnamed or auto: bfloat16 on CUDA that has it, else float32 (see cast_to_auto_dtype)."""
    if name not in (None, "auto"):
        return DTYPES[name]
    return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32


def cast_to_auto_dtype(args, model, device):
    """--dtype auto: `model`, as resolve_dtype loaded it, cast to the dtype returned and said in one line.
    On a CPU, the faster of float32 and a bfloat16 copy (casting back would lose float32's bits) for a
    decode step, measured once and kept with the costs, whether or not the CPU has bfloat16 natively
    (docs/2026-12-06-epyc-z.md); bfloat16 changes greedy texts, so only where a step takes 0.9x
    float32's or less."""
    dtype = resolve_dtype("auto", device)
    why = "on CUDA: not measured" if dtype == torch.bfloat16 else f"no bfloat16 on this {device}"
    if device == "cpu":
        costs = stored_costs(args, device, dtype)
        seconds = costs.get("a decode step by dtype", lambda: quickest_steps(
            {"float32": model, "bfloat16": copy.deepcopy(model).to(torch.bfloat16)}))
        dtype = torch.bfloat16 if seconds["bfloat16"] <= 0.9 * seconds["float32"] else torch.float32
        why = (f"a decode step here: {', '.join(f'{name} {s * 1e3:.2f} ms' for name, s in seconds.items())}; "
               f"measured once, kept in {costs.path}")
    print(f"dtype auto: {dtype_name(dtype)} ({why})", file=sys.stderr)
    model.to(dtype)
    return dtype


def quickest_steps(models):
    """{name: the quickest of seven decode steps} of each model, timed in turns: other work on the
    machine only ever adds time, and alike to each."""
    prefix = profile_prefix(next(iter(models.values())))
    turns = [{name: forward_seconds(m, 1, prefix) for name, m in models.items()} for _ in range(7)]
    return {name: min(turn[name] for turn in turns) for name in models}


def add_compile_arg(parser):
    parser.add_argument("--compile", nargs="?", const="auto", choices=["auto", "always"],
                        help="run the target's and the draft's passes compiled (model/compiled.py): "
                        "the same outputs, faster on some machines and slower on others. auto (--compile alone): "
                        "generate.py times a decode step both ways, once, and runs eagerly where compiling does not "
                        "pay; bench.py always compiles. A model's passes are one program, compiled once, on first "
                        "use (about a minute on a 2-core CPU), and kept in OUT_DIR/compiled; it runs one row at a "
                        "time, so batches of several rows run eagerly")


def compiled(model, path, args, device, dtype, prepare=False):
    """`model`, loaded from the checkpoint at `path`, on the compiled path if args.compile asks;
    prepare: load or compile its passes now rather than on first use."""
    if not args.compile or model is None:
        return model
    st = os.stat(path)
    name = f"{os.path.basename(path)}-{st.st_size}-{st.st_mtime_ns}-{device}-{dtype_name(dtype)}-torch{torch.__version__}"
    folder = os.path.join(args.out_dir, "compiled", name.replace(":", "_"))

    def say(seconds):
        if seconds is None:
            print(f"compiling {os.path.basename(path)}'s passes for {device} {dtype_name(dtype)} "
                  f"(once: kept in {os.path.join(args.out_dir, 'compiled')}) ...", end="", file=sys.stderr, flush=True)
        else:
            print(f" {seconds:.0f} s", file=sys.stderr)
    static = StaticGPT(model, folder, on_compile=say)
    if prepare:
        static.prepare()
    return static


def compiled_where_it_pays(model, path, args, device, dtype):
    """generate.py --compile [auto]: `model` on the compiled path if a compiled decode step measured at most
    0.9x an eager one here (a compiled run also loads its packages), else `model` as it is; measured
    once per checkpoint, kept with the costs, and said in one line either way."""
    static = compiled(model, path, args, device, dtype)
    if static is model or args.compile == "always":
        return static
    costs, name = stored_costs(args, device, dtype), os.path.basename(path)

    def measure():
        static.prepare()
        return quickest_steps({"eager": model, "compiled": static})
    seconds = costs.get(f"a decode step of {name}, eager and compiled", measure)
    pays = seconds["compiled"] <= 0.9 * seconds["eager"]
    print(f"compile {name}: {'yes' if pays else 'no: eager passes are as fast here'} (a decode step here: "
          f"eager {seconds['eager'] * 1e3:.2f} ms, compiled {seconds['compiled'] * 1e3:.2f} ms; measured once, "
          f"kept in {costs.path})", file=sys.stderr)
    return static if pays else model


def add_attn_arg(parser):
    parser.add_argument("--attn", choices=kernels.BACKENDS, default="auto", help="attention kernel: triton (CUDA, or "
                        "TRITON_INTERPRET=1 on the CPU), torch (PyTorch's scaled_dot_product_attention), auto (torch: "
                        "on a GPU it measured faster than the kernel) (default auto)")


def add_sampling_args(parser, temperature=0.8):
    parser.add_argument("--max-new-tokens", type=int, default=300, help="how many tokens to generate (default 300)")
    parser.add_argument("--temperature", type=float, default=temperature,
                        help=f"softmax temperature; 0 = greedy (default {temperature})")
    parser.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1] (default 1)")
    parser.add_argument("--seed", type=int, default=1337)


def add_method_args(parser, rows=None):
    """Each method's setting flag (decode.methods). rows=None: one setting each, with the options of
    lookahead and Medusa (generate.py); rows={method: [settings]}: several settings per flag, one
    benchmark row each, defaulting to rows[method] (bench.py)."""
    g = parser.add_argument_group("method settings" + (" (several values: one row each)" if rows else ""))
    for method in METHODS.values():
        if method.flag:
            default = rows[method.name] if rows else method.default
            g.add_argument(method.flag, nargs="+" if rows else None, default=default, metavar=method.metavar,
                           help=f"{method.help} (default {' '.join(default) if rows else default})")
    g.add_argument("--no-fallback", dest="fallback", action="store_false",
                   help="speculate every round, even while plain rounds are measured faster (by default the "
                        "loop times both and holds the method while it does not pay, trying it again now "
                        "and then: decode/fallback.py)")
    if rows:
        return
    g.add_argument("--sizing", choices=["auto", "fixed"], default=SIZING,
                   help="lookahead: auto sizes every pass from this machine's measured cost curve r(n) and the "
                        "acceptance so far, carrying the window and the n-grams only while they pay for "
                        f"themselves, down to a plain step; fixed carries all of W, N, G every pass, as in "
                        f"the paper (default {SIZING})")
    g.add_argument("--pool-from-prompt", action="store_true", help="lookahead: seed the n-gram pool from the prompt")
    g.add_argument("--typical", action="store_true",
                   help="medusa: typical acceptance. LOSSY: faster when sampling, but no longer samples the "
                        "target's distribution exactly")


def setting_of(args, method):
    """The value of `method`'s setting flag in args (None for plain decoding)."""
    flag = METHODS[method].flag
    return getattr(args, flag.lstrip("-").replace("-", "_")) if flag else None


@contextlib.contextmanager
def kept_fallback(args, label, batch_size, device, dtype):
    """The measured fallback (decode/fallback.py) of `label` decoding in batches of batch_size,
    starting from the averages its last run kept with the costs, which it keeps again after. With
    none kept for this batch size, it takes the largest smaller one's where they held speculating
    (less their probe budget): a larger batch gains less by it, so it holds here too, where trying
    both modes first costs a large batch the most (docs/2026-12-06-epyc-aa.md). A speculative
    round's seconds beyond a plain one's are taken as many times over as the batch has rows more,
    on the high side (docs/2026-12-07-epyc-ac.md): the first probe here waits until the budget
    covers what it will lose, not what it lost in a smaller batch. Where they speculated, both
    modes are tried."""
    costs = stored_costs(args, device, dtype)
    name, kept = "the fallback's averages for {} in batches of {}".format, costs.kept()
    prior = kept.get(name(label, batch_size))
    if prior is None:
        size = next((b for b in range(batch_size - 1, 0, -1) if kept.get(name(label, b))), None)
        smaller = size and kept[name(label, size)]
        if smaller and not Fallback(smaller).best:
            (gained, speculating), (_, plain) = smaller["speculating"], smaller["plain"]
            prior = dict(smaller, speculating=[gained, plain + (speculating - plain) * batch_size / size],
                         **{"probe budget": 0.0})
    fallback = Fallback(prior)
    yield fallback
    costs.put(name(label, batch_size), fallback.averages())


def stored_costs(args, device, dtype):
    """The pass costs measured on this machine for the checkpoints the flags name, kept in
    OUT_DIR/costs.json: a run that sizes itself to the machine measures them once, later runs read
    them (bench.py --profile drops them). A retrained checkpoint is another file, so new costs."""
    files = [checkpoint_of(args, kind) for kind in ("target", "draft")]
    stats = {os.path.basename(f): os.stat(f) for f in files if os.path.exists(f)}
    signature = " ".join(f"{name} {st.st_size} {st.st_mtime_ns}" for name, st in stats.items())
    machine = (f"{signature} | {device} {dtype_name(dtype)} attn={args.attn} "
               f"compiled={bool(args.compile)} threads={torch.get_num_threads()}")

    def say(name):
        print(f"measuring this machine's pass costs for {name} (once: kept in {args.out_dir}/costs.json)",
              file=sys.stderr)
    return StoredCosts(os.path.join(args.out_dir, "costs.json"), machine, on_measure=say)


def setup_device(args):
    """(device, dtype) from the flags, with --attn made the backend of every later forward if it can run there."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.attn == "triton":
        if not kernels.triton_installed():
            raise UserError("--attn triton needs the triton package (Linux only): pip install triton")
        if not kernels.triton_usable(device):
            raise UserError("--attn triton runs on CUDA; set TRITON_INTERPRET=1 to run it (slowly) on the CPU "
                            "under Triton's interpreter")
        if dtype not in kernels.TRITON_DTYPES:
            raise UserError(f"--attn triton supports float32, float16 and bfloat16, not {dtype}")
    kernels.set_backend(args.attn)
    return device, dtype


def setup(args):
    """What generate.py and bench.py both start from: (Sampling, device, dtype, target model,
    tokenizer, target checkpoint dict), the flags of add_sampling_args checked, the attention backend chosen."""
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS:,}, got {args.max_new_tokens}")
    if not args.temperature >= 0:  # also refuses NaN
        raise UserError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    device, dtype = setup_device(args)
    model, tokenizer, state = load_model(checkpoint_of(args, "target"), device=device, dtype=dtype)
    dtype = cast_to_auto_dtype(args, model, device) if args.dtype == "auto" else dtype  # cast, not loaded again
    # what is loaded by now lives as long as the process: frozen, no collection scans it again (one that
    # did, in a decoding round, took 80 ms: docs/2026-12-06-epyc-x.md)
    gc.freeze()
    return Sampling(args.temperature, args.top_k, args.top_p), device, dtype, model, tokenizer, state
