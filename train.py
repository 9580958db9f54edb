"""Train the SpecGPT target model, then its draft model, on a text file (tiny Shakespeare by default).

    python train.py                      # target (preset picked by device: cpu or gpu), then draft
    python train.py --what draft         # only the draft, with the tokenizer of out/target.pt
    python train.py --preset tiny --max-iters 50 --out-dir out-tiny
    python train.py --resume             # continue an interrupted run where it stopped

--preset and the model-shape flags (--n-layer, ...) shape the target, or the draft with --what draft
(whose preset is `draft` otherwise); the optimisation flags (--max-iters, ...) apply to every model
trained.
"""
import math
import os
import time

import torch
import torch.nn.functional as F

import cli
from data import TokenData, read_text, split_text
from errors import UserError
from medusa_train import train_medusa
from model.checkpoint import load_checkpoint, load_model, save_checkpoint
from model.gpt import GPT, GPTConfig, PRESETS
from model.tokenizer import Tokenizer

# Optimisation settings per model preset; every one can be overridden by the flag of the same name.
TRAIN_PRESETS = {
    "tiny": dict(batch_size=8, max_iters=200, learning_rate=1e-3, warmup_iters=20,
                 eval_interval=100, eval_iters=4),
    "cpu": dict(batch_size=32, max_iters=1200, learning_rate=2e-3, warmup_iters=100,
                eval_interval=100, eval_iters=20),
    "gpu": dict(batch_size=64, max_iters=5000, learning_rate=1e-3, warmup_iters=100,
                eval_interval=250, eval_iters=200),
    "draft": dict(batch_size=32, max_iters=1200, learning_rate=2e-3, warmup_iters=100,
                  eval_interval=200, eval_iters=20),
}
DEFAULT_VOCAB_SIZE = 512
MEDUSA_ITERS = 1000
MEDUSA_TREE_SIZE = 4  # the fastest measured tree here (README)


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", choices=["all", "target", "draft", "medusa"], default="all",
                   help="which model to train (default all: the target, then the draft, then Medusa heads)")
    p.add_argument("--data", default=None, help="UTF-8 text file (default: tiny Shakespeare, downloaded to data/)")
    p.add_argument("--out-dir", default="out", help="where checkpoints go (default: out)")
    p.add_argument("--preset", default=None, help=f"model and optimiser preset: {', '.join(PRESETS)} "
                                                  "(default: cpu on CPU, gpu on CUDA)")
    p.add_argument("--resume", action="store_true",
                   help="continue each model from its checkpoint in OUT_DIR, with its settings (a model "
                        "without a checkpoint starts afresh)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--tokenizer", choices=["bpe", "gpt2"], default="bpe",
                   help="bpe: byte-level BPE trained on the training split; gpt2: tiktoken's GPT-2 encoding")
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                   help=f"BPE vocabulary size; 256 = plain bytes (default {DEFAULT_VOCAB_SIZE})")
    cli.add_device_args(p, dtype_help="parameter dtype (default float32; CUDA trains under bf16 autocast)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--distill", action=cli.argparse.BooleanOptionalAction, default=True,
                   help="train the draft on the target's predicted distributions instead of the data's next "
                        "tokens, so that it learns to agree with the target (default: on)")
    g = p.add_argument_group("Medusa heads")
    g.add_argument("--medusa-heads", type=int, default=4, help="how many heads (default 4)")
    g.add_argument("--medusa-tied", action="store_true",
                   help="share the target's output projection instead of giving each head its own copy")
    g.add_argument("--medusa-joint", action="store_true",
                   help="Medusa-2: train the target with the heads (saved as medusa-target.pt)")
    g.add_argument("--medusa-iters", type=int, default=MEDUSA_ITERS,
                   help=f"training iterations of the heads (default {MEDUSA_ITERS})")
    g.add_argument("--tree-size", type=int, default=MEDUSA_TREE_SIZE,
                   help=f"candidates in the saved Medusa tree (default {MEDUSA_TREE_SIZE})")
    g = p.add_argument_group("overrides of the preset")
    for name in ("block_size", "n_layer", "n_head", "n_embd"):
        g.add_argument("--" + name.replace("_", "-"), type=int)
    g.add_argument("--dropout", type=float)
    g.add_argument("--no-bias", dest="bias", action="store_const", const=False)
    for name in ("batch_size", "max_iters", "warmup_iters", "eval_interval", "eval_iters"):
        g.add_argument("--" + name.replace("_", "-"), type=int)
    g.add_argument("--learning-rate", type=float)
    g.add_argument("--min-lr", type=float, help="floor of the cosine decay (default: learning rate / 10)")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--log-interval", type=int, default=50)
    return p.parse_args(argv)


def settings_from_args(args, kind, device):
    """(model config overrides, optimisation settings) of `kind` from its preset and the flags."""
    shaped_by_flags = kind == "target" or args.what == "draft"
    if kind == "draft" and not (shaped_by_flags and args.preset):
        preset = "draft"
    else:
        preset = args.preset or ("gpu" if device.startswith("cuda") else "cpu")
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    model_cfg = dict(PRESETS[preset])
    for name in ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias"):
        if shaped_by_flags and getattr(args, name) is not None:
            model_cfg[name] = getattr(args, name)
    opt = dict(TRAIN_PRESETS[preset])
    for name in ("batch_size", "max_iters", "warmup_iters", "eval_interval", "eval_iters", "learning_rate"):
        if getattr(args, name) is not None:
            opt[name] = getattr(args, name)
    opt.update(min_lr=args.min_lr if args.min_lr is not None else opt["learning_rate"] / 10,
               weight_decay=args.weight_decay, grad_clip=args.grad_clip, preset=preset)
    for name in ("batch_size", "max_iters", "eval_interval", "eval_iters"):
        if opt[name] < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if model_cfg["n_embd"] % model_cfg["n_head"]:
        raise UserError(f"--n-embd {model_cfg['n_embd']} is not divisible by --n-head {model_cfg['n_head']}")
    return model_cfg, opt


def lr_at(it, opt):
    """Linear warmup, then cosine decay to min_lr at max_iters."""
    if it < opt["warmup_iters"]:
        return opt["learning_rate"] * (it + 1) / opt["warmup_iters"]
    progress = min(1.0, (it - opt["warmup_iters"]) / max(1, opt["max_iters"] - opt["warmup_iters"]))
    return opt["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (opt["learning_rate"] - opt["min_lr"])


def make_optimizer(model, opt):
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings; not biases or LayerNorms
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([dict(params=decay, weight_decay=opt["weight_decay"]),
                              dict(params=no_decay, weight_decay=0.0)],
                             lr=opt["learning_rate"], betas=(0.9, 0.99))


@torch.no_grad()
def estimate_loss(model, split, opt, block_size, device, autocast):
    """Mean loss in nats/token over eval_iters batches; the same batches every time (fixed seed),
    so successive evaluations compare like with like."""
    model.eval()
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(opt["eval_iters"]):
        x, y = split.batch(opt["batch_size"], block_size, gen, device)
        with autocast:
            logits = model(x)
        losses.append(F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def format_duration(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def main(argv=None):
    args = parse_args(argv)
    device = cli.resolve_device(args.device)
    dtype = cli.resolve_dtype(args.dtype or "float32", device)
    if args.preset is not None and args.preset not in PRESETS:
        raise UserError(f"unknown preset {args.preset!r}; presets: {', '.join(PRESETS)}")
    text = read_text(args.data)
    for kind in (["target", "draft", "medusa"] if args.what == "all" else [args.what]):
        if kind == "medusa":
            train_heads(args, text, device, dtype)
        else:
            train_model(kind, args, text, device, dtype)
    return 0


def train_heads(args, text, device, dtype):
    """Train OUT_DIR/medusa.pt on the frozen target of OUT_DIR/target.pt (or jointly with it)."""
    out_path = os.path.join(args.out_dir, "medusa.pt")
    if os.path.exists(out_path) and not args.resume:
        raise UserError(f"{out_path} exists: remove it or use another --out-dir")
    if os.path.exists(out_path):
        print(f"{out_path} exists; Medusa heads are trained in one go, so there is nothing to resume")
        return
    target, tokenizer, _ = load_model(os.path.join(args.out_dir, "target.pt"), device=device, dtype=dtype)
    train_text, val_text = split_text(text)
    train = TokenData(tokenizer.encode(train_text), len(train_text), "train")
    val = TokenData(tokenizer.encode(val_text), len(val_text), "val")
    train_medusa(target, tokenizer, train, val, out_path, n_heads=args.medusa_heads, tied=args.medusa_tied,
                 max_iters=args.max_iters or args.medusa_iters, joint=args.medusa_joint, device=device,
                 seed=args.seed, tree_size=args.tree_size)


def train_model(kind, args, text, device, dtype):
    """Train (or resume) OUT_DIR/<kind>.pt."""
    ckpt_path = os.path.join(args.out_dir, f"{kind}.pt")
    train_text, val_text = split_text(text)
    resuming = args.resume and os.path.exists(ckpt_path)
    if resuming:
        state = load_checkpoint(ckpt_path, kind)
        tokenizer = Tokenizer(state["tokenizer"])
        model_cfg, opt = state["config"], state["train_settings"]
        if args.max_iters is not None:
            opt["max_iters"] = args.max_iters
    else:
        if os.path.exists(ckpt_path):
            raise UserError(f"{ckpt_path} exists: pass --resume to continue it, or another --out-dir")
        model_cfg, opt = settings_from_args(args, kind, device)
        if kind == "draft":  # the draft must speak the target's tokenizer, token for token
            target = load_checkpoint(os.path.join(args.out_dir, "target.pt"), "target")
            tokenizer = Tokenizer(target["tokenizer"])
            if args.what != "draft" or args.block_size is None:
                model_cfg["block_size"] = target["config"]["block_size"]
        elif args.tokenizer == "gpt2":
            tokenizer = Tokenizer({"kind": "gpt2"})
        else:
            print(f"training a {args.vocab_size}-token byte-level BPE on {len(train_text):,} characters")
            tokenizer = Tokenizer.train(train_text, args.vocab_size)
        model_cfg = dict(model_cfg, vocab_size=tokenizer.vocab_size)

    train = TokenData(tokenizer.encode(train_text), len(train_text), "train")
    val = TokenData(tokenizer.encode(val_text), len(val_text), "val")
    config = GPTConfig(**model_cfg)
    train.check_fits(config.block_size)
    val.check_fits(config.block_size)

    torch.manual_seed(args.seed)
    model = GPT(config).to(device=device, dtype=dtype)
    optimizer = make_optimizer(model, opt)
    gen = torch.Generator().manual_seed(args.seed)  # draws the training batches
    start_iter, history = 0, []
    if resuming:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        gen.set_state(state["rng"])
        start_iter, history = state["iter"], state["history"]
        print(f"resuming {ckpt_path} at iteration {start_iter}")
    print(f"{kind}: {config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, context {config.block_size}, "
          f"{model.num_params() / 1e6:.2f}M parameters, tokenizer {tokenizer.name}, "
          f"{train.chars_per_token:.2f} characters/token, {len(train.tokens):,} training tokens")
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
                else torch.autocast("cpu", enabled=False))
    step_model = torch.compile(model) if args.compile else model
    teacher = None
    if kind == "draft" and args.distill:
        teacher = load_model(os.path.join(args.out_dir, "target.pt"), device=device, dtype=dtype)[0]
        print("distilling from the target: the training loss is the cross-entropy to its distributions")

    def evaluate_and_save(it, elapsed):
        val_loss = estimate_loss(step_model, val, opt, config.block_size, device, autocast)
        nats_per_char = val_loss / val.chars_per_token
        history.append(dict(iter=it, seconds=elapsed, val_loss=val_loss, val_nats_per_char=nats_per_char))
        print(f"eval {it}: val {val_loss:.4f} nats/token = {nats_per_char:.4f} nats/char "
              f"= {nats_per_char / math.log(2):.4f} bits/char ({format_duration(elapsed)})")
        save_checkpoint(ckpt_path, model, tokenizer, kind=kind, optimizer=optimizer.state_dict(),
                        iter=it, rng=gen.get_state(), history=history, train_settings=opt,
                        data=os.path.abspath(args.data) if args.data else None)

    model.train()
    t_start = time.time() - (history[-1]["seconds"] if history else 0.0)
    t_log, tokens_seen = time.time(), 0
    for it in range(start_iter, opt["max_iters"]):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it, opt)
        x, y = train.batch(opt["batch_size"], config.block_size, gen, device)
        with autocast:
            logits = step_model(x)
            with torch.no_grad():  # a distilled draft learns the target's whole next-token distribution
                labels = y.view(-1) if teacher is None else torch.softmax(teacher(x).float(), -1).flatten(0, 1)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels)
        if not torch.isfinite(loss):
            kept = f"{ckpt_path} keeps iteration {history[-1]['iter']}" if history else "nothing was saved yet"
            raise UserError(f"loss became {loss.item()} at iteration {it}; stopped ({kept}); "
                            "try a lower --learning-rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
        optimizer.step()
        tokens_seen += x.numel()
        done = it + 1
        if done % args.log_interval == 0:
            now = time.time()
            rate = tokens_seen / (now - t_log)
            eta = (opt["max_iters"] - done) * x.numel() / rate
            print(f"iter {done}/{opt['max_iters']} | loss {loss.item():.4f} | lr {lr_at(it, opt):.2e} | "
                  f"{rate / 1e3:.1f}k tokens/s | {format_duration(now - t_start)} | eta {format_duration(eta)}",
                  flush=True)
            t_log, tokens_seen = now, 0
        if done % opt["eval_interval"] == 0 or done == opt["max_iters"]:
            evaluate_and_save(done, time.time() - t_start)
    if start_iter >= opt["max_iters"]:
        print(f"{ckpt_path} is already at iteration {start_iter}; raise --max-iters to train further")
    print(f"saved {ckpt_path}")


if __name__ == "__main__":
    cli.run(main)
