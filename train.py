"""Train the SpecGPT target model, its draft model, its Medusa heads and its EAGLE head on a text
file (tiny Shakespeare by default), all with one training loop (`fit`).

    python train.py                      # target (preset picked by device: cpu or gpu), draft, heads, EAGLE
    python train.py --what draft         # only the draft, with the tokenizer of out/target.pt
    python train.py --what medusa --target gpt2.pt   # heads for an imported GPT-2 (model/convert.py)
    python train.py --preset tiny --max-iters 50 --out-dir out-tiny
    python train.py --resume             # continue an interrupted run where it stopped
    torchrun --nproc_per_node 2 train.py # data-parallel, the same flags (gloo on CPU, NCCL on CUDA)

Data-parallel training (torchrun). --batch-size is the global batch: every process draws the same
batch from the same generator and trains on its own slice of it, and DistributedDataParallel averages
the gradients. So N processes take exactly the steps one would (up to the order of float additions),
and a checkpoint resumes on any number of processes. Every process evaluates (the same fixed val
batches, in the time the others would wait anyway); only rank 0 writes checkpoints and logs.

--preset and the model-shape flags (--n-layer, ...) shape the target, or the draft with --what draft
(whose preset is `draft` otherwise); the optimisation flags (--max-iters, ...) apply to every model
trained.

The phases after the target's learn from it, frozen (the distilled draft from its distributions,
the Medusa-1 and EAGLE heads from its features), all from one pass of it over the training split.
"""
import math
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import cli
import heads_training
from cli import UserError
from data import FrozenTarget, autocast_for, format_duration, read_text, split_text, tokenized_splits
from decode.medusa import DEFAULT_TREE_SIZE
from model.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from model.gpt import GPT, GPTConfig, PRESETS
from model.tokenizer import Tokenizer
from optim import lr_at, make_optimizer
from plan import plan

# Optimisation settings per model preset; every one can be overridden by the flag of the same name.
# patience: evaluations without a lower val loss after which training stops (0: never stops early).
# optimizer: adamw or muon (muon, and the iterations: docs/2026-12-06-epyc-t.md).
TRAIN_PRESETS = {
    "tiny": dict(batch_size=8, max_iters=200, learning_rate=1e-3, warmup_iters=20,
                 eval_interval=100, eval_iters=4, patience=0, optimizer="muon"),
    "cpu": dict(batch_size=32, max_iters=1000, learning_rate=2e-3, warmup_iters=100,
                eval_interval=100, eval_iters=20, patience=2, optimizer="muon"),
    "gpu": dict(batch_size=64, max_iters=5000, learning_rate=1e-3, warmup_iters=100,
                eval_interval=250, eval_iters=200, patience=2, optimizer="adamw"),
    "draft": dict(batch_size=32, max_iters=800, learning_rate=2e-3, warmup_iters=100,
                  eval_interval=200, eval_iters=20, patience=2, optimizer="muon"),
}
KINDS = ("target", "draft", "medusa", "eagle")  # the phases of a whole run, in order
COUNTS = ("batch_size", "max_iters", "eval_interval", "eval_iters", "grad_accum")  # settings of at least 1
RANK = int(os.environ.get("RANK", "0"))  # set by torchrun; 0 in a single process


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__ + "\n" + heads_training.__doc__,
                           formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", choices=["all", *KINDS], default="all", help="which model to train (default all: "
                   "the target, then the draft, the Medusa heads and the EAGLE head)")
    p.add_argument("--data", help="UTF-8 text file (default: tiny Shakespeare, downloaded to data/)")
    cli.add_checkpoint_args(p, draft=False)
    p.add_argument("--preset", help=f"model and optimiser preset: {', '.join(PRESETS)} "
                                    "(default: cpu on CPU, gpu on CUDA)")
    p.add_argument("--resume", action="store_true", help="continue each model from its checkpoint in OUT_DIR, "
                   "with its settings (a model without a checkpoint starts afresh; refused if none has one)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--tokenizer", choices=["bpe", "gpt2"], default="bpe",
                   help="bpe: byte-level BPE trained on the training split; gpt2: tiktoken's GPT-2 encoding")
    p.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size; 256 = plain bytes (default 512)")
    cli.add_device_args(p, dtype_help="parameter dtype (default float32; CUDA trains under bf16 autocast)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--distill", action=cli.argparse.BooleanOptionalAction, default=True, help="train the draft on "
                   "the target's predicted distributions instead of the data's next tokens, so that it learns to "
                   "agree with the target (default: on)")
    g = p.add_argument_group("Medusa heads")
    g.add_argument("--medusa-heads", type=int, default=4, help="how many heads (default 4)")
    g.add_argument("--medusa-tied", action="store_true", help="share the target's output projection instead of "
                   "giving each head its own copy")
    g.add_argument("--medusa-joint", action="store_true", help="Medusa-2: train the target with the heads (saved as "
                   "medusa-target.pt)")
    g.add_argument("--tree-size", type=int, default=DEFAULT_TREE_SIZE, help="candidates in the saved Medusa tree "
                   f"(default {DEFAULT_TREE_SIZE})")
    g = p.add_argument_group("overrides of the preset")
    for name in ("block_size", "n_layer", "n_head", "n_embd"):
        g.add_argument("--" + name.replace("_", "-"), type=int)
    g.add_argument("--dropout", type=float)
    g.add_argument("--no-bias", dest="bias", action="store_const", const=False)
    for name in ("batch_size", "max_iters", "warmup_iters", "eval_interval", "eval_iters"):
        g.add_argument("--" + name.replace("_", "-"), type=int)
    g.add_argument("--grad-accum", type=int, help="micro-batches per process per step, to fit memory: the batch "
                   "(global under torchrun) is split among processes x micro-batches (default 1)")
    g.add_argument("--optimizer", choices=["adamw", "muon"], help="the target's or draft's optimiser: muon "
                   "orthogonalises the updates of the Linear layers' matrices, AdamW moves the rest (default: the "
                   "preset's, muon for cpu, draft and tiny)")
    g.add_argument("--learning-rate", type=float)
    g.add_argument("--min-lr", type=float, help="floor of the cosine decay (default: learning rate / 10)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay of matrices (default 0.1; 0 for Medusa "
                   "heads, whose projections start as copies of the target's lm_head and must not be pulled "
                   "towards zero)")
    g.add_argument("--grad-clip", type=float, help="gradient norm clip (default 1.0)")
    g.add_argument("--patience", type=int, help="the target or draft stops after this many evaluations without a "
                   "lower val loss, its checkpoint holding the best; 0 trains all --max-iters, saving at every "
                   "evaluation (default 2; 0 for the tiny preset)")
    g.add_argument("--log-interval", type=int, default=50)
    return p.parse_args(argv)


def phase_settings(args, kind, device, target_cfg=None):
    """(model config, None for heads; optimisation settings) of phase `kind`: its preset's, with every
    flag the user gave in their place, checked. The draft reads as far back as the target (target_cfg),
    unless `--what draft` is given a --block-size of its own."""
    model_cfg, shaped_by_flags = None, kind == "target" or args.what == "draft"
    if kind in ("medusa", "eagle"):
        settings = dict(heads_training.HEADS_TRAINING if kind == "medusa" else heads_training.EAGLE_TRAINING)
    else:
        preset = "draft" if kind == "draft" and not (shaped_by_flags and args.preset) else \
            args.preset or ("gpu" if device.startswith("cuda") else "cpu")
        shape = ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias")
        model_cfg = dict(PRESETS[preset], **(given(args, shape) if shaped_by_flags else {}))
        if kind == "draft" and (args.what != "draft" or args.block_size is None):
            model_cfg["block_size"] = target_cfg["block_size"]
        settings = dict(TRAIN_PRESETS[preset], weight_decay=0.1, grad_clip=1.0, preset=preset)
        settings.update(given(args, ("optimizer", "patience")))
    settings.setdefault("grad_accum", 1)
    settings.update(given(args, (*COUNTS, "warmup_iters", "learning_rate", "weight_decay", "grad_clip")))
    settings["min_lr"] = args.min_lr if args.min_lr is not None else settings["learning_rate"] / 10
    for name in COUNTS:
        if settings[name] < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if model_cfg and model_cfg["n_embd"] % model_cfg["n_head"]:
        raise UserError(f"--n-embd {model_cfg['n_embd']} is not divisible by --n-head {model_cfg['n_head']}")
    return model_cfg, settings


def given(args, names):
    """The flags among `names` that the user gave: name -> value."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def say(message):
    if RANK == 0:  # under torchrun, one process speaks for all
        print(message, flush=True)  # flushed: a long run's progress shows as it happens, also in a log file


class ModelTraining(nn.Module):
    """The target or the draft as `fit` trains it, afresh or resumed from its checkpoint at `path`: on
    the data's next tokens, or a distilled draft on the frozen target's distributions (FrozenTarget)."""

    def __init__(self, kind, args, path, text, device, dtype, frozen):
        super().__init__()
        self.kind, self.device, self.path = kind, device, path
        state = load_checkpoint(path, kind) if args.resume and os.path.exists(path) else None
        if state is not None:  # with its settings, but for how long it trains and on what hardware
            self.settings = state["train_settings"] | given(args, ("max_iters", "grad_accum", "patience"))
            model_cfg, self.tokenizer = state["config"], Tokenizer(state["tokenizer"])
        else:
            target = load_checkpoint(cli.checkpoint_of(args, "target"), "target") if kind == "draft" else None
            model_cfg, self.settings = phase_settings(args, kind, device, target and target["config"])
            if target:  # the draft must speak the target's tokenizer, token for token
                self.tokenizer = Tokenizer(target["tokenizer"])
            elif args.tokenizer == "gpt2":
                self.tokenizer = Tokenizer({"kind": "gpt2"})
            else:  # a byte-level BPE trained on the training split
                train_text = split_text(text)[0]
                say(f"training a {args.vocab_size}-token byte-level BPE on {len(train_text):,} characters")
                self.tokenizer = Tokenizer.train(train_text, args.vocab_size)
            model_cfg["vocab_size"] = self.tokenizer.vocab_size
        self.train_split, self.val_split = tokenized_splits(text, self.tokenizer)
        config = GPTConfig(**model_cfg)
        self.block_size = config.block_size
        for split in (self.train_split, self.val_split):
            split.check_fits(config.block_size)
        torch.manual_seed(args.seed)
        self.model = GPT(config).to(device=device, dtype=dtype)
        self.optimizer = make_optimizer(self.model, self.settings)
        self.generator = torch.Generator().manual_seed(args.seed)  # draws the training batches
        self.start_iter, self.history = 0, []
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["rng"])
            self.start_iter, self.history = state["iter"], state["history"]
            say(f"resuming {path} at iteration {self.start_iter}")
        say(f"{kind}: {config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, context "
            f"{config.block_size}, {self.model.num_params() / 1e6:.2f}M parameters, tokenizer {self.tokenizer.name}, "
            f"{self.train_split.chars_per_token:.2f} characters/token, {len(self.train_split.tokens):,} training tokens")
        self.compiled = torch.compile(self.model) if args.compile else self.model
        self.data = os.path.abspath(args.data) if args.data else None
        self.distilled = kind == "draft" and args.distill
        if self.distilled:  # the same tokens, with the target's outputs
            self.train_split = frozen.loaded[2]

    def forward(self, x, y):
        """The batch's loss: the cross-entropy against the next tokens y, or, distilled, against the
        target's cached distributions at x's positions y (B, T)."""
        logits = self.compiled(x).float()
        if not self.distilled:
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        logprobs = F.log_softmax(logits, -1).gather(-1, self.train_split.ids[y].long())  # (B, T, top)
        return -(self.train_split.probs[y].float() * logprobs).sum(-1).mean()

    def evaluate(self):
        val_loss = estimate_loss(self.compiled, self.val_split, self.settings, self.block_size, self.device)
        nats_per_char = val_loss / self.val_split.chars_per_token
        return (dict(val_loss=val_loss, val_nats_per_char=nats_per_char), f"val {val_loss:.4f} nats/token = "
                f"{nats_per_char:.4f} nats/char = {nats_per_char / math.log(2):.4f} bits/char")

    def save(self, history):
        save_checkpoint(self.path, self.model, self.tokenizer, kind=self.kind, optimizer=self.optimizer.state_dict(),
                        iter=history[-1]["iter"], rng=self.generator.get_state(), history=history,
                        train_settings=self.settings, data=self.data)

    def finish(self):
        """Say what was saved; a line for the run's summary."""
        kept = kept_evaluation(self.history, self.settings)
        say(f"{self.path} is already at iteration {self.start_iter}; raise --max-iters to train further"
            if self.start_iter >= self.settings["max_iters"] else f"saved {self.path} (iteration {kept['iter']})")
        return f"{self.path}: val {kept['val_loss']:.4f} nats/token = {kept['val_nats_per_char']:.4f} nats/char"


def fit(trainee, log_interval=50, log=say):
    """The one training loop, for the target, the draft and the heads alike: from trainee.start_iter to
    max_iters, evaluating every eval_interval iterations and at the end (evaluate_and_save). trainee: a
    ModelTraining, MedusaTraining or EagleTraining, whose forward(x, y) is a batch's loss (for DDP)."""
    settings, device, history = trainee.settings, trainee.device, trainee.history
    processes = dist.get_world_size() if dist.is_initialized() else 1
    accum = settings.get("grad_accum", 1)  # settings saved before micro-batches have none
    micro, left = divmod(settings["batch_size"], processes * accum)
    if left or not micro:
        raise UserError(f"--batch-size {settings['batch_size']} does not split into {processes} process(es) x "
                        f"{accum} micro-batch(es) of equal size")
    step = DistributedDataParallel(trainee) if processes > 1 else trainee
    params = [p for group in trainee.optimizer.param_groups for p in group["params"]]
    t_start = time.time() - (history[-1]["seconds"] if history else 0.0)
    t_log, tokens_seen = time.time(), 0
    for it in range(trainee.start_iter, settings["max_iters"]):
        for group in trainee.optimizer.param_groups:
            group["lr"] = lr_at(it, settings) * group.get("lr_scale", 1.0)
        # the same global batch in every process; y: the tokens after x's, or x's positions in a
        # split that holds the target's outputs (TargetOutputs)
        x, y = trainee.train_split.batch(settings["batch_size"], trainee.block_size, trainee.generator, device)
        loss = backward(step, x, y, micro, accum, processes, device)
        if not torch.isfinite(loss):
            kept = f"the checkpoint keeps iteration {kept_evaluation(history, settings)['iter']}" if history \
                else "nothing was saved yet"
            raise UserError(f"loss became {loss.item()} at iteration {it}; stopped ({kept}); "
                            "try a lower --learning-rate")
        torch.nn.utils.clip_grad_norm_(params, settings["grad_clip"])
        trainee.optimizer.step()
        trainee.optimizer.zero_grad(set_to_none=True)
        tokens_seen += x.numel()
        done = it + 1
        if done % log_interval == 0:
            now = time.time()
            rate = tokens_seen / (now - t_log)
            eta = (settings["max_iters"] - done) * x.numel() / rate
            log(f"iter {done}/{settings['max_iters']} | loss {loss.item():.4f} | lr {lr_at(it, settings):.2e} | "
                f"{rate / 1e3:.1f}k tokens/s | {format_duration(now - t_start)} | eta {format_duration(eta)}")
            t_log, tokens_seen = now, 0
        if (done % settings["eval_interval"] == 0 or done == settings["max_iters"]) and \
                evaluate_and_save(trainee, done, time.time() - t_start, processes, log):
            break


def backward(step, x, y, micro, accum, processes, device):
    """The gradients of the batch (x, y), this process's rows of it in `accum` micro-batches of
    `micro` rows; the batch's loss, averaged over the processes."""
    loss = torch.zeros((), device=device)
    for i in range(accum):
        rows = slice((RANK * accum + i) * micro, (RANK * accum + i + 1) * micro)
        # the gradients are averaged across processes once, in the last micro-batch's backward
        with step.no_sync() if processes > 1 and i < accum - 1 else nullcontext():
            with autocast_for(device):
                micro_loss = step(x[rows], y[rows]) / accum
            micro_loss.backward()
        loss += micro_loss.detach()
    if processes > 1:
        dist.all_reduce(loss)
        loss /= processes
    return loss


def evaluate_and_save(trainee, it, seconds, processes, log):
    """trainee.evaluate() -> (what history keeps, val_loss included; a line for the log), kept in trainee.history
    (whose last entry says what is safe on disk if the loss turns to NaN), then saved if the checkpoint is to
    hold it (with a patience, only a lower val loss). Whether to stop: no lower val for `patience` evaluations."""
    settings, history = trainee.settings, trainee.history
    kept, line = trainee.evaluate()
    history.append(dict(iter=it, seconds=seconds, **kept))
    log(f"eval {it}: {line} ({format_duration(seconds)})")
    best = kept_evaluation(history, settings)
    if RANK == 0 and best is history[-1]:  # one process writes
        trainee.save(history)
    stop = bool(settings.get("patience")) and len(history) - 1 - history.index(best) >= settings["patience"]
    if processes > 1:
        dist.barrier()  # the next phase may read what rank 0 has just written
        decision = torch.tensor(int(stop), device=trainee.device)
        dist.broadcast(decision, 0)  # rank 0 decides for all: a process left behind would wait forever
        stop = bool(decision)
    if stop:
        log(f"val has not improved for {settings['patience']} evaluations: stopped at iteration {it}; the "
            f"checkpoint keeps iteration {best['iter']} (val {best['val_loss']:.4f} nats/token)")
    return stop


def kept_evaluation(history, settings):
    """The evaluation whose weights the checkpoint holds: with early stopping (a patience) the one of
    the lowest val loss, the first of equals, since only a lower loss is saved; else the latest."""
    return min(history, key=lambda h: h["val_loss"]) if settings.get("patience") else history[-1]


@torch.no_grad()
def estimate_loss(model, split, settings, block_size, device):
    """Mean loss in nats/token over eval_iters fixed batches of the split."""
    model.eval()
    losses = []
    for x, y in split.fixed_batches(settings["eval_iters"], settings["batch_size"], block_size, device):
        with autocast_for(device):
            logits = model(x)
        losses.append(F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def train_phase(kind, args, text, device, dtype, frozen):
    """Train (or resume) OUT_DIR/<kind>.pt, heads on the run's frozen target; a line for the summary."""
    path, heads = checkpoint_path(args.out_dir, kind), kind in ("medusa", "eagle")
    if os.path.exists(path) and not args.resume:
        raise UserError(f"{path} exists: " + ("remove it or use another --out-dir" if heads else
                                              "pass --resume to continue it, or another --out-dir"))
    if heads and os.path.exists(path):
        say(f"{path} exists; {kind} heads are trained in one go, so there is nothing to resume")
        return f"{path} kept"
    training = heads_training.for_phase(kind, args, frozen, phase_settings(args, kind, device)[1], say) if heads \
        else ModelTraining(kind, args, path, text, device, dtype, frozen)
    fit(training, args.log_interval)
    return training.finish()


def main(argv=None):
    args = parse_args(argv)
    device = cli.resolve_device(args.device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: this process's device, in the process group
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    dtype = cli.resolve_dtype(args.dtype or "float32", device)
    if args.preset is not None and args.preset not in PRESETS:
        raise UserError(f"unknown preset {args.preset!r}; presets: {', '.join(PRESETS)}")
    if args.tokenizer == "bpe" and args.vocab_size < 256:
        raise UserError(f"--vocab-size must be at least 256 (one token per byte), got {args.vocab_size}")
    if args.patience is not None and args.patience < 0:
        raise UserError("--patience must be 0 or more")
    if args.target is not None and args.what not in ("draft", "medusa", "eagle"):
        raise UserError("--target names the model that --what draft, medusa or eagle trains for")
    kinds = list(KINDS) if args.what == "all" else [args.what]
    found = [kind for kind in kinds if os.path.exists(checkpoint_path(args.out_dir, kind))]
    if args.resume and not found:  # as nanoGPT's init_from='resume': a resume with nothing to resume is a mistake
        raise UserError(f"--resume: {args.out_dir} holds no checkpoint of {' or '.join(kinds)} to resume; "
                        "leave out --resume to start afresh")
    if args.resume and len(found) < len(kinds):
        say(f"resuming {', '.join(found)}; {', '.join(k for k in kinds if k not in found)} start afresh")
    text = read_text(args.data)
    # what the phases read of the frozen target's outputs: a distilled draft its distributions, the
    # Medusa-1 and EAGLE heads its features (Medusa-2 trains the target itself)
    outputs = {"distributions"} if "draft" in kinds and args.distill else set()
    outputs |= {"features"} if "eagle" in kinds or ("medusa" in kinds and not args.medusa_joint) else set()
    fresh = RANK == 0 and not found
    if fresh and (line := plan(args, kinds, outputs, text, phase_settings, device, dtype)):
        say(line)  # about how long the run should take; a resumed one shows each phase's ETA as it goes
    frozen = FrozenTarget(cli.checkpoint_of(args, "target"), text, outputs, device, dtype, say)
    summary = []
    try:
        for kind in kinds:
            started = time.time()
            result = train_phase(kind, args, text, device, dtype, frozen)
            summary.append(f"{kind} {result} ({format_duration(time.time() - started)})")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    say("trained: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    cli.run(main)
