"""Train the SpecGPT target model, its draft model, its Medusa heads and its EAGLE head on a text
file (tiny Shakespeare by default), all with one training loop (`fit`).

    python train.py                      # target (preset picked by device: cpu or gpu), draft, heads, EAGLE
    python train.py --what draft         # only the draft, with the tokenizer of out/target.pt
    python train.py --what medusa --target gpt2.pt   # heads for an imported GPT-2 (model/convert.py)
    python train.py --preset tiny --max-iters 50 --out-dir out-tiny
    python train.py --resume             # continue an interrupted run where it stopped
    torchrun --nproc_per_node 2 train.py # data-parallel, the same flags (gloo on CPU, NCCL on CUDA)

Data-parallel training (torchrun). --batch-size is the global batch: every process draws the same
batch from the same generator and trains on its own slice of it, in --grad-accum micro-batches, and
DistributedDataParallel averages the gradients. So N processes take exactly the steps one would
(up to the order of float additions), and a checkpoint resumes on any number of processes. Every
process evaluates (the same fixed val batches, in the time the others would wait anyway); only rank
0 writes checkpoints and logs.

--preset and the model-shape flags (--n-layer, ...) shape the target, or the draft with --what draft
(whose preset is `draft` otherwise); the optimisation flags (--max-iters, ...) apply to every model
trained.

The target and the draft stop where val stops improving: after --patience evaluations (2 by
default) without a lower val loss. Their checkpoint is then written only when the loss is lower, so
it holds the best evaluation, and --resume goes on from there.

The phases after the target's learn from the trained target, frozen: the distilled draft from its
next-token distributions, the Medusa-1 and EAGLE heads from its final hidden states. One pass of
the target over the training split computes what all of them read (FrozenTarget).

Medusa heads (model/medusa.py). Medusa-1 (the default) freezes the target and only the heads learn,
on sum_i 0.8^i CE_i. Medusa-2 (--medusa-joint) trains a copy of the target and the heads together on
L_LM + 0.2 L_heads, the target at a 4x lower learning rate so that the heads' loss nudges its hidden
states without ruining its own predictions; the new target is saved beside the heads
(medusa-target.pt). At every evaluation each head's top-1..top-10 accuracy is measured on val; they
choose the tree saved with the heads (decode.medusa.build_tree).

The EAGLE head (model/eagle.py) also trains on the frozen target, on its features and its
distributions; at the evaluation its top-1 agreement with the target at draft depths 1..4 is
measured on val and saved with it.
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
from cli import UserError
from data import TokenData, read_text, split_text
from decode.eagle import TREE_WIDTH
from decode.medusa import DEFAULT_TREE_SIZE, build_tree, expected_length
from model.checkpoint import checkpoint_path, load_checkpoint, load_model, save_checkpoint
from model.gpt import GPT, GPTConfig, PRESETS
from model.eagle import EagleHead, eagle_loss, eagle_losses, save_eagle
from model.kv_cache import KVCache
from model.medusa import MedusaConfig, MedusaHeads, head_losses, heads_loss, save_medusa
from model.tokenizer import Tokenizer

# Optimisation settings per model preset; every one can be overridden by the flag of the same name.
# patience: evaluations without a lower val loss after which training stops (0: never stops early).
# optimizer: adamw unless said. Muon for the cpu target: val 1.4893 nats/char after 1,200 iterations
# against 1.5136 with AdamW alone, each step 12-18% slower on 2 cores (docs/2026-12-05-epyc-n.md);
# the tiny preset, the tests', takes the same path. The cpu target's 1,000 iterations end at 1.4992,
# six minutes sooner on 2 cores: past 1,000 the 1,200-iteration run gained 0.008 (docs/2026-12-05-epyc-o.md).
# The distilled draft with Muon: val 1.5948 nats/char after 800 iterations against 1.6318 after AdamW's
# 1,200, greedy acceptance 0.68 against 0.67 (docs/2026-12-05-epyc-p.md).
TRAIN_PRESETS = {
    "tiny": dict(batch_size=8, max_iters=200, learning_rate=1e-3, warmup_iters=20,
                 eval_interval=100, eval_iters=4, patience=0, optimizer="muon"),
    "cpu": dict(batch_size=32, max_iters=1000, learning_rate=2e-3, warmup_iters=100,
                eval_interval=100, eval_iters=20, patience=2, optimizer="muon"),
    "gpu": dict(batch_size=64, max_iters=5000, learning_rate=1e-3, warmup_iters=100,
                eval_interval=250, eval_iters=200, patience=2),
    "draft": dict(batch_size=32, max_iters=800, learning_rate=2e-3, warmup_iters=100,
                  eval_interval=200, eval_iters=20, patience=2, optimizer="muon"),
}
# The heads' settings: lr 3e-3 beat Medusa's 1e-3 on the default target (head 0 top-1 0.159 vs 0.136
# after 400 iterations); one evaluation, at the end, which also measures the accuracies.
HEADS_TRAINING = dict(batch_size=16, max_iters=1000, learning_rate=3e-3, warmup_iters=50,
                      eval_interval=1000, eval_iters=20, weight_decay=0.0, grad_clip=1.0)
# The EAGLE head's settings: 2,000 iterations (about 4 min per 1,000 on 2 cores) reached a top-1
# agreement with the default target of 0.720 at depth 1, where 3,000 reached 0.718 on the target
# trained 1,200 iterations (docs/2026-12-05-epyc-o.md); a token-loss weight of 1 instead of the
# paper's 0.1 gained at depth 1 (0.623) and lost deeper (0.576 against 0.590 at depth 2, after 1,000).
EAGLE_TRAINING = dict(batch_size=16, max_iters=2000, learning_rate=3e-3, warmup_iters=50,
                      eval_interval=1000, eval_iters=20, weight_decay=0.0, grad_clip=1.0)
LAMBDA0 = 0.2             # Medusa-2: weight of the heads' loss next to the target's own
BACKBONE_LR_SCALE = 0.25  # Medusa-2: the target learns 4x slower than the heads
TOP = 10                  # accuracies are measured for each head's 10 likeliest tokens
TEACHER_TOP = 32          # a distilled draft learns the target's 32 likeliest next tokens at each position
DEFAULT_VOCAB_SIZE = 512
RANK = int(os.environ.get("RANK", "0"))  # set by torchrun; 0 in a single process


def parse_args(argv=None):
    p = cli.ArgumentParser(description=__doc__, formatter_class=cli.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", choices=["all", "target", "draft", "medusa", "eagle"], default="all",
                   help="which model to train (default all: the target, then the draft, the Medusa heads and "
                        "the EAGLE head)")
    p.add_argument("--data", default=None, help="UTF-8 text file (default: tiny Shakespeare, downloaded to data/)")
    cli.add_checkpoint_args(p, draft=False)
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
    g.add_argument("--tree-size", type=int, default=DEFAULT_TREE_SIZE,
                   help=f"candidates in the saved Medusa tree (default {DEFAULT_TREE_SIZE})")
    g = p.add_argument_group("overrides of the preset")
    for name in ("block_size", "n_layer", "n_head", "n_embd"):
        g.add_argument("--" + name.replace("_", "-"), type=int)
    g.add_argument("--dropout", type=float)
    g.add_argument("--no-bias", dest="bias", action="store_const", const=False)
    for name in ("batch_size", "max_iters", "warmup_iters", "eval_interval", "eval_iters"):
        g.add_argument("--" + name.replace("_", "-"), type=int)
    g.add_argument("--grad-accum", type=int,
                   help="micro-batches per process per step, to fit memory: the batch (global under torchrun) "
                        "is split among processes x micro-batches (default 1)")
    g.add_argument("--optimizer", choices=["adamw", "muon"],
                   help="the target's or draft's optimiser: muon orthogonalises the updates of the Linear layers' "
                        "matrices, AdamW moves the rest (default: the preset's, muon for cpu, draft and tiny)")
    g.add_argument("--learning-rate", type=float)
    g.add_argument("--min-lr", type=float, help="floor of the cosine decay (default: learning rate / 10)")
    g.add_argument("--weight-decay", type=float,
                   help="AdamW weight decay of matrices (default 0.1; 0 for Medusa heads, whose projections "
                        "start as copies of the target's lm_head and must not be pulled towards zero)")
    g.add_argument("--grad-clip", type=float, help="gradient norm clip (default 1.0)")
    g.add_argument("--patience", type=int,
                   help="the target or draft stops after this many evaluations without a lower val loss, its "
                        "checkpoint holding the best; 0 trains all --max-iters, saving at every evaluation "
                        "(default 2; 0 for the tiny preset)")
    g.add_argument("--log-interval", type=int, default=50)
    return p.parse_args(argv)


def override(opt, args):
    """Optimisation settings `opt` with every flag the user gave in their place, checked."""
    opt = dict(opt, grad_accum=opt.get("grad_accum", 1))
    for name in ("batch_size", "max_iters", "warmup_iters", "eval_interval", "eval_iters", "learning_rate",
                 "weight_decay", "grad_clip", "grad_accum"):
        if getattr(args, name) is not None:
            opt[name] = getattr(args, name)
    opt["min_lr"] = args.min_lr if args.min_lr is not None else opt["learning_rate"] / 10
    for name in ("batch_size", "max_iters", "eval_interval", "eval_iters", "grad_accum"):
        if opt[name] < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    return opt


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
    opt = dict(override(dict(TRAIN_PRESETS[preset], weight_decay=0.1, grad_clip=1.0), args), preset=preset)
    opt["optimizer"] = args.optimizer or opt.get("optimizer", "adamw")
    if args.patience is not None:
        opt["patience"] = args.patience
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
    """AdamW; with opt["optimizer"] == "muon", Muon for muon_matrices(model) and AdamW for the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    matrices = [p for p in muon_matrices(model) if p.requires_grad] if opt.get("optimizer", "adamw") == "muon" else []
    moved_by_muon = {id(m) for m in matrices}
    rest = [p for p in params if id(p) not in moved_by_muon]
    decay = [p for p in rest if p.dim() >= 2]  # embeddings and, without Muon, matrices; not biases or LayerNorms
    no_decay = [p for p in rest if p.dim() < 2]
    adam = adamw([dict(params=decay, weight_decay=opt["weight_decay"]), dict(params=no_decay, weight_decay=0.0)], opt)
    if not matrices:
        return adam
    muon = Muon([dict(params=matrices, lr_scale=MUON_LR_SCALE)], lr=opt["learning_rate"] * MUON_LR_SCALE,
                weight_decay=opt["weight_decay"])
    return Optimizers(muon, adam)


def adamw(groups, opt):
    """AdamW, fused (one kernel for all parameters) where the parameters' device and dtype have it."""
    params = [p for group in groups for p in group["params"]]
    fused = all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in params)
    return torch.optim.AdamW(groups, lr=opt["learning_rate"], betas=(0.9, 0.99), weight_decay=opt["weight_decay"],
                             fused=fused)


def muon_matrices(model):
    """The weights Muon moves: the Linear layers' matrices, not the embeddings (whose rows are looked
    up, not multiplied) nor an lm_head tied to one."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in embeddings]


# Muon's matrices learn at 3x AdamW's rate: val 1.4893 nats/char against 1.5066 at 1x (the cpu
# target, 1,200 iterations)
MUON_LR_SCALE = 3
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # Jordan's quintic: the steepest rise at 0 that still settles near 1
NEWTON_SCHULZ_STEPS = 5


def orthogonalisation_flops(model, steps=NEWTON_SCHULZ_STEPS):
    """The arithmetic of one Muon step's Newton-Schulz iterations over model's matrices: for an m x n
    matrix, m <= n, each iteration's x x^T, s s and (...) x multiply 2m^2n + 2m^3 + 2m^2n."""
    return sum(steps * (4 * min(w.shape) ** 2 * max(w.shape) + 2 * min(w.shape) ** 3) for w in muon_matrices(model))


def orthogonalise(update, steps=NEWTON_SCHULZ_STEPS):
    """About U V^T for update = U S V^T: a Newton-Schulz iteration moves the singular values that are
    not tiny against the largest to about 0.7-1.2. In float32: torch.optim.Muon runs it in bfloat16,
    which a CPU without bfloat16 arithmetic emulates slowly (a step of the cpu target took 13 s
    instead of 2 s on a 2-core Zen 1)."""
    x = update.float()
    tall = x.size(0) > x.size(1)
    if tall:  # then x x^T is the smaller square
        x = x.T
    x = x / (x.norm() + 1e-7)  # singular values at most 1, where the iteration converges
    a, b, c = NEWTON_SCHULZ
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if tall else x).to(update.dtype)


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024): SGD with Nesterov momentum, each weight matrix's update
    orthogonalised, so that every direction of the update moves as far. The update is scaled to the
    RMS of an AdamW update, 0.2 sqrt(max(rows, columns)) (Liu et al., 2025, "Muon is Scalable for LLM
    Training"), so that AdamW's schedule and weight decay serve it (at MUON_LR_SCALE x its rate)."""

    def __init__(self, params, lr, weight_decay, momentum=0.95):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                momentum = self.state[p].setdefault("momentum", torch.zeros_like(p))
                momentum.lerp_(p.grad, 1 - group["momentum"])
                update = orthogonalise(p.grad.lerp(momentum, group["momentum"]))  # Nesterov: a step ahead
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * 0.2 * max(p.shape) ** 0.5)


class Optimizers:
    """Muon's matrices and AdamW's other parameters, stepped, zeroed and saved as one optimizer."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    @property
    def param_groups(self):
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self):
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none=True):
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return dict(optimizers=[optimizer.state_dict() for optimizer in self.optimizers])

    def load_state_dict(self, state):
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)


def autocast_for(device):
    return (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
            else torch.autocast("cpu", enabled=False))


def format_duration(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def say(message):
    if RANK == 0:  # under torchrun, one process speaks for all
        print(message, flush=True)  # flushed: a long run's progress shows as it happens, also in a log file


def join_processes(device):
    """This process's device; under torchrun, after joining the process group (NCCL between GPUs,
    gloo between CPU processes)."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return device
    if device.startswith("cuda"):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return device


class Step(nn.Module):
    """A batch's training loss, loss(x, y), as a module over the models it trains, so that
    DistributedDataParallel can wrap it: it averages the gradients of their trainable parameters."""

    def __init__(self, loss, *models):
        super().__init__()
        self.models = nn.ModuleList(models)
        self.loss = loss

    def forward(self, x, y):
        return self.loss(x, y)


def fit(step, optimizer, opt, train, block_size, device, gen, evaluate_and_save, history,
        start_iter=0, log_interval=50, log=say):
    """The one training loop, for the target, the draft and the heads alike.

    step: a Step, the loss of a batch (B, T); optimizer: its param groups may carry an `lr_scale`;
    opt: the optimisation settings (schedule, batch size, micro-batches, clip, eval interval);
    evaluate_and_save(iteration, seconds) runs every eval_interval iterations and at the end, and
    appends to `history`, whose last entry says what is safe on disk if the loss turns to NaN."""
    processes = dist.get_world_size() if dist.is_initialized() else 1
    accum = opt.get("grad_accum", 1)  # settings saved before micro-batches have none
    micro, left = divmod(opt["batch_size"], processes * accum)
    if left or not micro:
        raise UserError(f"--batch-size {opt['batch_size']} does not split into {processes} process(es) x "
                        f"{accum} micro-batch(es) of equal size")
    if processes > 1:
        step = DistributedDataParallel(step)
    autocast = autocast_for(device)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    t_start = time.time() - (history[-1]["seconds"] if history else 0.0)
    t_log, tokens_seen = time.time(), 0
    for it in range(start_iter, opt["max_iters"]):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it, opt) * group.get("lr_scale", 1.0)
        x, y = train.batch(opt["batch_size"], block_size, gen, device)  # the same global batch in every process
        loss = torch.zeros((), device=device)
        for i in range(accum):
            rows = slice((RANK * accum + i) * micro, (RANK * accum + i + 1) * micro)
            # the gradients are averaged across processes once, in the last micro-batch's backward
            with step.no_sync() if processes > 1 and i < accum - 1 else nullcontext():
                with autocast:
                    micro_loss = step(x[rows], y[rows]) / accum
                micro_loss.backward()
            loss += micro_loss.detach()
        if processes > 1:
            dist.all_reduce(loss)
            loss /= processes
        if not torch.isfinite(loss):
            kept = f"the checkpoint keeps iteration {kept_evaluation(history, opt)['iter']}" if history else "nothing was saved yet"
            raise UserError(f"loss became {loss.item()} at iteration {it}; stopped ({kept}); "
                            "try a lower --learning-rate")
        torch.nn.utils.clip_grad_norm_(params, opt["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += x.numel()
        done = it + 1
        if done % log_interval == 0:
            now = time.time()
            rate = tokens_seen / (now - t_log)
            eta = (opt["max_iters"] - done) * x.numel() / rate
            log(f"iter {done}/{opt['max_iters']} | loss {loss.item():.4f} | lr {lr_at(it, opt):.2e} | "
                f"{rate / 1e3:.1f}k tokens/s | {format_duration(now - t_start)} | eta {format_duration(eta)}")
            t_log, tokens_seen = now, 0
        if done % opt["eval_interval"] == 0 or done == opt["max_iters"]:
            evaluate_and_save(done, time.time() - t_start)
            if processes > 1:
                dist.barrier()  # the next phase may read what rank 0 has just written
            best = kept_evaluation(history, opt)
            stop = bool(opt.get("patience")) and len(history) - 1 - history.index(best) >= opt["patience"]
            if processes > 1:  # rank 0 decides for all: a process left behind would wait forever
                decision = torch.tensor(int(stop), device=device)
                dist.broadcast(decision, 0)
                stop = bool(decision)
            if stop:
                log(f"val has not improved for {opt['patience']} evaluations: stopped at iteration {done}; the "
                    f"checkpoint keeps iteration {best['iter']} (val {best['val_loss']:.4f} nats/token)")
                break


def kept_evaluation(history, opt):
    """The evaluation whose weights the checkpoint holds: with early stopping (a patience) the one of
    the lowest val loss, the first of equals, since only a lower loss is saved; else the latest."""
    return min(history, key=lambda h: h["val_loss"]) if opt.get("patience") else history[-1]


@torch.no_grad()
def estimate_loss(model, split, opt, block_size, device):
    """Mean loss in nats/token over eval_iters batches; the same batches every time (fixed seed),
    so successive evaluations compare like with like."""
    model.eval()
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(opt["eval_iters"]):
        x, y = split.batch(opt["batch_size"], block_size, gen, device)
        with autocast_for(device):
            logits = model(x)
        losses.append(F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def rank_counts(logits, truth, top):
    """How often the true token (...) is the (i+1)-th likeliest under logits (..., V), for i < top:
    the rank of a token is the number of tokens with higher logits."""
    rank = (logits > logits.gather(-1, truth[..., None])).sum(-1)
    return torch.bincount(rank.flatten().cpu(), minlength=top)[:top]


@torch.no_grad()
def evaluate_heads(target, heads, val, batch_size, block_size, eval_iters, device):
    """(target's val loss, each head's val loss, accuracies) over eval_iters fixed val batches.
    accuracies[d][i]: the fraction of positions where the true token is head d's (i+1)-th likeliest,
    so sum(accuracies[d][:k]) is head d's top-k accuracy."""
    was_training = target.training
    target.eval()
    heads.eval()
    gen = torch.Generator().manual_seed(0)
    K = heads.n_heads
    lm, ce, hits, positions = 0.0, torch.zeros(K), torch.zeros(K, TOP), torch.zeros(K)
    for _ in range(eval_iters):
        x, y = val.batch(batch_size, block_size, gen, device)
        logits, hidden = target(x, return_hidden=True)
        head_logits = heads(hidden)  # (K, B, T, V)
        lm += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()
        ce += torch.tensor([loss.item() for loss in head_losses(head_logits, y)])
        for d, logits_d in enumerate(head_logits):
            logits_d, truth = logits_d[:, :-(d + 1)], y[:, d + 1:]  # (B, T-d-1, V), (B, T-d-1)
            hits[d] += rank_counts(logits_d, truth, TOP)
            positions[d] += truth.numel()
    target.train(was_training)
    heads.train()
    return lm / eval_iters, (ce / eval_iters).tolist(), (hits / positions[:, None]).tolist()


def train_heads(target, tokenizer, train, val, out_path, opt, n_heads=4, tied=False, joint=False,
                distill=False, tree_size=DEFAULT_TREE_SIZE, device="cpu", seed=1337, log=say,
                log_interval=100):
    """Train K = n_heads Medusa heads on `target` (already on `device`) and save them to out_path
    with their val accuracies and a tree of tree_size candidates. Returns the accuracies.

    train, val: data.TokenData; opt: optimisation settings (HEADS_TRAINING and the flags).
    Medusa-1 freezes the target (requires_grad off); joint=True (Medusa-2) trains it too and saves it
    beside the heads as medusa-target.pt. distill=True scores head i at t against the target's own
    distribution for that token (its logits at t+i+1, free in the same forward) instead of the
    data's token: the heads then learn to guess what the verifier will accept."""
    block_size = target.config.block_size
    train.check_fits(block_size)
    val.check_fits(block_size)
    torch.manual_seed(seed)
    heads = MedusaHeads(target, MedusaConfig(n_heads, tied))
    target.requires_grad_(joint)
    target.train(joint)
    groups = [dict(params=list(heads.parameters()), lr_scale=1.0)]
    if joint:
        groups.append(dict(params=list(target.parameters()), lr_scale=BACKBONE_LR_SCALE))
    optimizer = adamw(groups, opt)
    target_path = os.path.join(os.path.dirname(out_path), "medusa-target.pt")
    what = "Medusa-2: target and heads jointly" if joint else "Medusa-1: heads on the frozen target"
    log(f"medusa: {n_heads} heads ({'tied to' if tied else 'own copies of'} the target's lm_head), "
        f"{sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M parameters, {what}, "
        f"{opt['max_iters']} iterations of {opt['batch_size']} x {block_size} tokens")

    def evaluate():
        return evaluate_heads(target, heads, val, opt["batch_size"], block_size, opt["eval_iters"], device)

    lm_before = evaluate()[0] if joint else None

    if not joint:  # the frozen target's features are the same at every visit of a window
        train = TargetOutputs.shared(train, target, {"features"}, device, log)
        following = train.tokens[1:].to(device)  # following[p]: the token after position p

    def step_loss(x, y):
        if joint:
            logits, hidden = target(x, return_hidden=True)  # (B, T, V), (B, T, C)
        else:  # y: the positions of x's tokens
            hidden, y = train.features[y], following[y]
            with torch.no_grad():
                logits = target.lm_head(hidden) if distill else None
        labels = torch.softmax(logits.detach().float(), -1) if distill else y  # (B, T, V) or (B, T)
        loss = heads_loss(head_losses(heads(hidden), labels))
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()) + LAMBDA0 * loss if joint else loss

    history, result = [], {}

    def evaluate_and_save(it, seconds):
        lm_loss, head_ce, accuracies = evaluate()
        tree = build_tree(accuracies, tree_size)
        history.append(dict(iter=it, seconds=seconds, val_loss=heads_loss(head_ce)))
        log(f"eval {it}: val loss per head " + " ".join(f"{ce:.3f}" for ce in head_ce) + f" ({format_duration(seconds)})")
        result.update(accuracies=accuracies, tree=tree, lm_loss=lm_loss)
        if RANK != 0:  # one process writes
            return
        if joint:
            save_checkpoint(target_path, target, tokenizer, kind="target", medusa_joint=True)
        save_medusa(out_path, heads, target, tokenizer, accuracies=accuracies, tree=[list(p) for p in tree],
                    val_losses=head_ce, target_val_loss=lm_loss, seconds=seconds, history=history,
                    train_settings=dict(opt, joint=joint, seed=seed, tree_size=tree_size, distill=distill))

    fit(Step(step_loss, heads, target), optimizer, opt, train, block_size, device, torch.Generator().manual_seed(seed),
        evaluate_and_save, history, log_interval=log_interval, log=log)
    accuracies, tree = result["accuracies"], result["tree"]
    for d, acc in enumerate(accuracies):
        log(f"head {d} (token t+{d + 2}): top-1 {acc[0]:.3f}  top-5 {sum(acc[:5]):.3f}  top-10 {sum(acc):.3f}")
    log("expected accepted candidates per round, by tree size: " + ", ".join(
        f"{n}: {expected_length(accuracies, build_tree(accuracies, n)):.2f}" for n in (1, 2, 4, 8, 16, 32, 64)))
    if joint:
        log(f"target val loss {lm_before:.4f} -> {result['lm_loss']:.4f} nats/token after joint training; "
            f"saved the new target to {target_path}")
        target.requires_grad_(False)
        target.eval()
    log(f"saved {out_path} (tree of {len(tree)} candidates, expected {expected_length(accuracies, tree):.2f} "
        "accepted per round)")
    return accuracies


EAGLE_DEPTHS = 4  # draft depths at which the head's agreement with the target is measured


@torch.no_grad()
def evaluate_eagle(target, head, val, batch_size, block_size, eval_iters, device):
    """(feature loss, token loss, accuracies, ranks) over eval_iters fixed val batches.
    accuracies[d-1]: how often the head's top-1 at draft depth d equals the target's top-1 there;
    ranks[i]: how often the target's top-1 is the head's (i+1)-th choice at depth 1. Depth 1 reads the
    target's real features; depth d > 1, as in drafting, its own predicted feature from depth d-1
    (with the text's token), attending to the real pairs up to where drafting started and to its
    own earlier drafts."""
    was_training = head.training
    head.eval()
    gen = torch.Generator().manual_seed(0)
    losses, hits, counts = torch.zeros(2), torch.zeros(EAGLE_DEPTHS), torch.zeros(EAGLE_DEPTHS)
    rank_hits = torch.zeros(TREE_WIDTH)
    for _ in range(eval_iters):
        x, _ = val.batch(batch_size, block_size, gen, device)
        logits, features = target(x, return_hidden=True)  # (B, T, V), (B, T, C)
        losses += torch.tensor([loss.item() for loss in eagle_losses(head, features, logits, x)])
        best = logits.argmax(-1)  # (B, T): the target's token after each position
        B, T, C = features.shape
        n = T - 1  # drafts start after every position t < T-1, at the pair (f_t, x_{t+1})
        cache = KVCache(1, B, head.config.n_head, C // head.config.n_head, n * (EAGLE_DEPTHS + 1),
                        dtype=features.dtype, device=device)
        predicted, head_logits = head(features[:, :-1], x[:, 1:], cache)  # depth 1, over the real pairs
        cache.commit()
        rank_hits += rank_counts(head_logits, best[:, 1:], TREE_WIDTH)
        for d in range(1, EAGLE_DEPTHS + 1):
            valid = n - d + 1  # row t guesses the token at t+d+1, which the target predicts at t+d
            hits[d - 1] += (head_logits[:, :valid].argmax(-1) == best[:, d:d + valid]).sum().item()
            counts[d - 1] += B * valid
            if d == EAGLE_DEPTHS or valid <= 1:
                break
            # depth d+1: row t reads (its depth-d feature, x_{t+d+1}); it sees the real pairs 0..t
            # and its own drafts at depths 2..d+1
            tokens = torch.cat([x[:, d + 1:], x.new_zeros(B, d)], 1)  # (B, n); the tail rows go unscored
            rows = torch.arange(n, device=device)
            mask = torch.zeros(n, cache.length + n, dtype=torch.bool, device=device)
            mask[:, :n] = rows[None, :] <= rows[:, None]
            for depth_slot in range(1, d + 1):
                mask[rows, depth_slot * n + rows] = True
            predicted, head_logits = head(predicted, tokens, cache, mask)
            cache.commit()
    head.train(was_training)
    return *(losses / eval_iters).tolist(), (hits / counts.clamp_min(1)).tolist(), (rank_hits / counts[0]).tolist()


def train_eagle(target, tokenizer, train, val, out_path, opt, device="cpu", seed=1337, log=say, log_interval=100):
    """Train an EAGLE head on the frozen `target` (already on `device`) and save it to out_path with
    its val accuracies at draft depths 1..EAGLE_DEPTHS. Returns the accuracies."""
    block_size = target.config.block_size
    train.check_fits(block_size)
    val.check_fits(block_size)
    torch.manual_seed(seed)
    head = EagleHead(target)
    target.requires_grad_(False)
    target.eval()
    optimizer = make_optimizer(head, opt)
    log(f"eagle: one {target.config.n_embd}-wide block on the frozen target's features, "
        f"{sum(p.numel() for p in head.parameters()) / 1e6:.2f}M parameters, "
        f"{opt['max_iters']} iterations of {opt['batch_size']} x {block_size} tokens")
    noise = torch.Generator(device).manual_seed(seed)
    train = TargetOutputs.shared(train, target, {"features"}, device, log)

    def step_loss(x, positions):
        features = train.features[positions]  # (B, T, C)
        with torch.no_grad():
            logits = target.lm_head(features)  # (B, T, V)
        return eagle_loss(*eagle_losses(head, features, logits, x, noise))

    history, result = [], {}

    def evaluate_and_save(it, seconds):
        feature_loss, token_loss, accuracies, ranks = evaluate_eagle(target, head, val, opt["batch_size"],
                                                                     block_size, opt["eval_iters"], device)
        history.append(dict(iter=it, seconds=seconds, val_loss=eagle_loss(feature_loss, token_loss)))
        log(f"eval {it}: val feature loss {feature_loss:.4f}, token loss {token_loss:.4f}, top-1 agreement "
            f"with the target at depth 1..{EAGLE_DEPTHS}: " + " ".join(f"{a:.3f}" for a in accuracies)
            + f"; depth 1 by rank: " + " ".join(f"{a:.3f}" for a in ranks) + f" ({format_duration(seconds)})")
        result.update(accuracies=accuracies)
        if RANK == 0:  # one process writes
            save_eagle(out_path, head, target, tokenizer, accuracies=accuracies, ranks=ranks,
                       feature_loss=feature_loss, token_loss=token_loss, seconds=seconds, history=history,
                       train_settings=dict(opt, seed=seed))

    head.train()
    fit(Step(step_loss, head), optimizer, opt, train, block_size, device, torch.Generator().manual_seed(seed),
        evaluate_and_save, history, log_interval=log_interval, log=log)
    log(f"saved {out_path}")
    return result["accuracies"]


def main(argv=None):
    args = parse_args(argv)
    device = join_processes(cli.resolve_device(args.device))
    dtype = cli.resolve_dtype(args.dtype or "float32", device)
    if args.preset is not None and args.preset not in PRESETS:
        raise UserError(f"unknown preset {args.preset!r}; presets: {', '.join(PRESETS)}")
    if args.tokenizer == "bpe" and args.vocab_size < 256:
        raise UserError(f"--vocab-size must be at least 256 (one token per byte), got {args.vocab_size}")
    if args.patience is not None and args.patience < 0:
        raise UserError("--patience must be 0 or more")
    if args.target is not None and args.what not in ("draft", "medusa", "eagle"):
        raise UserError("--target names the model that --what draft, medusa or eagle trains for")
    text = read_text(args.data)
    summary = []
    kinds = ["target", "draft", "medusa", "eagle"] if args.what == "all" else [args.what]
    if RANK == 0 and not any(os.path.exists(checkpoint_path(args.out_dir, kind)) for kind in kinds):
        plan(args, kinds, device, dtype, text)  # a fresh run: a resumed one shows each phase's ETA as it goes
    frozen = FrozenTarget(args, text, device, dtype, kinds)  # for the phases after the target's
    try:
        for kind in kinds:
            started = time.time()
            if kind in ("medusa", "eagle"):
                result = train_on_target(kind, args, text, device, dtype, frozen)
            else:
                result = train_model(kind, args, text, device, dtype, frozen)
            summary.append(f"{kind} {result} ({format_duration(time.time() - started)})")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    say("trained: " + "; ".join(summary))
    return 0


def plan(args, kinds, device, dtype, text):
    """One line before anything trains: each model's iterations and size, and about how long the
    whole run should take here. A training step of the target's shape is timed now; each phase's
    time is that rate applied to its arithmetic per token (6 x the parameters trained, 2 x those
    only run forward, as Kaplan et al. count), evaluations included. Each phase's own ETA follows."""
    target_cfg, target_opt = settings_from_args(args, "target", device)
    saved = None  # the target's checkpoint, when this run does not train it
    if "target" in kinds:
        target_cfg["vocab_size"] = 50257 if args.tokenizer == "gpt2" else args.vocab_size
    elif os.path.exists(cli.checkpoint_of(args, "target")):
        saved = load_checkpoint(cli.checkpoint_of(args, "target"), "target")
        target_cfg = saved["config"]
    else:
        return  # the phase itself says what is missing
    draft_cfg, draft_opt = settings_from_args(args, "draft", device)
    draft_cfg["vocab_size"] = target_cfg["vocab_size"]
    match_target_context(args, draft_cfg, target_cfg)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        target, draft = GPT(GPTConfig(**target_cfg)), GPT(GPTConfig(**draft_cfg))
        n_target = target.num_params()
        params = dict(target=n_target, draft=draft.num_params(),
                      medusa=sum(p.numel() for p in MedusaHeads(target, MedusaConfig(args.medusa_heads,
                                                                                     args.medusa_tied)).parameters()),
                      eagle=sum(p.numel() for p in EagleHead(target).parameters()))
    opts = dict(target=target_opt, draft=draft_opt,
                medusa=override(HEADS_TRAINING, args), eagle=override(EAGLE_TRAINING, args))
    lm_head = target.lm_head.weight.numel()
    # per token: (parameters whose products run forward and backward, those that run forward only
    # in a training step and in an evaluation); the EAGLE head trains back through the lm_head, whose
    # forward also gives the target's logits from its cached features
    arithmetic = dict(target=(n_target, 0, 0), draft=(params["draft"], 0, 0),
                      medusa=(params["medusa"] + n_target * args.medusa_joint, 0, n_target * (not args.medusa_joint)),
                      eagle=(params["eagle"] + lm_head, lm_head, n_target))
    flops = 0.0
    for kind in kinds:
        opt, (both, forward, eval_forward) = opts[kind], arithmetic[kind]
        evals = math.ceil(opt["max_iters"] / opt["eval_interval"]) * opt["eval_iters"]
        tokens = opt["batch_size"] * (draft_cfg if kind == "draft" else target_cfg)["block_size"]
        flops += tokens * (opt["max_iters"] * (6 * both + 2 * forward) + evals * 2 * (both + eval_forward))
        if opt.get("optimizer") == "muon":
            flops += opt["max_iters"] * orthogonalisation_flops(dict(target=target, draft=draft)[kind])
    if any(outputs_read(args, kind) for kind in kinds):  # one pass over the training split, for all of them
        flops += training_tokens(args, text, saved) * 2 * n_target
    names = dict(target="the target", draft="the draft", medusa="the Medusa heads", eagle="the EAGLE head")
    sizes = ", ".join(f"{names[kind]} ({params[kind] / 1e6:.2f}M parameters, {opts[kind]['max_iters']:,} iterations)"
                      for kind in kinds)
    seconds = flops / training_rate(target_cfg, opts["target"], device, dtype)
    stops_early = any(opts[kind].get("patience") for kind in kinds)
    say(f"training {sizes}: about {format_duration(seconds)} here (a training step timed now)"
        + ("; less if val stops improving sooner" if stops_early else ""))


def training_tokens(args, text, target_state):
    """The training split's tokens: counted with the saved target's tokenizer or GPT-2's; a BPE not
    trained yet makes about 2 characters a token of English at 512 tokens (1.94 on tiny Shakespeare)."""
    train_text = split_text(text)[0]
    if target_state is not None:
        return len(Tokenizer(target_state["tokenizer"]).encode(train_text))
    if args.tokenizer == "gpt2":
        return len(Tokenizer({"kind": "gpt2"}).encode(train_text))
    return len(train_text) / 2


def training_rate(target_cfg, opt, device, dtype, steps=2):
    """Arithmetic per second of a training step of the target's shape here (a throwaway model)."""
    model = GPT(GPTConfig(**target_cfg)).to(device=device, dtype=dtype)
    x = torch.randint(target_cfg["vocab_size"], (opt["batch_size"] // opt["grad_accum"], target_cfg["block_size"]),
                      device=device)
    for step in range(steps + 1):  # the first is a warm-up
        if step == 1:
            started = time.perf_counter()
        with autocast_for(device):
            logits = model(x)
        logits.float().logsumexp(-1).mean().backward()  # a cross-entropy's cost, without labels
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 6 * model.num_params() * x.numel() * steps / (time.perf_counter() - started)


def match_target_context(args, draft_cfg, target_cfg):
    """The draft reads as far back as the target, unless `--what draft` is given a --block-size of its own."""
    if args.what != "draft" or args.block_size is None:
        draft_cfg["block_size"] = target_cfg["block_size"]


class TargetOutputs(TokenData):
    """The training split with the frozen target's outputs computed once, for the models that learn
    from them: run on every batch instead, the target took four fifths of the draft's training time
    (docs/2026-12-04-epyc-k.md, with the draft's acceptance either way).
    outputs: what is kept of each position, any of
      "distributions": the target's TEACHER_TOP likeliest next tokens (`ids`) and their
          probabilities, renormalised (`probs`), for a draft to distil;
      "features": its final hidden state (`features`, after ln_f), for heads on the frozen target
          (Medusa-1, EAGLE), whose logits are `target.lm_head(features)`;
    each an attribute (len(split), size). The split is read in windows of the target's context, back
    to back (the last ends with the split, kept from where the one before ended), so each position
    is read after 0 to block_size - 1 tokens, as random windows read it. Windows overlapping by half,
    each position read after at least half a window, cost the draft's pass twice the time for the
    same acceptance (docs/2026-12-05-epyc-o.md). The target runs on `windows` of them at a time
    (default: 4,096 tokens' worth, so that a long context's logits stay within memory).
    batch() returns windows and, in place of the tokens that follow, their positions, whose outputs
    the loss reads.
    share=(k, n): only every n-th group of windows from the k-th is read, the other positions left
    zero, so that n processes can split the work and sum their shares (`merge`)."""

    DESCRIPTIONS = dict(distributions="next-token distributions", features="features")

    def __init__(self, split, target, outputs, device, windows=None, share=(0, 1)):
        self.tokens, self.chars_per_token, self.name = split.tokens, split.chars_per_token, split.name
        self.outputs = frozenset(outputs)
        n, block_size = len(self.tokens), target.config.block_size
        windows = windows or max(1, 4096 // block_size)
        # one buffer per name keep() returns, of its width and dtype (read off an empty window)
        weight = target.lm_head.weight
        nothing = self.keep(weight.new_zeros(0, 0, weight.size(0)), weight.new_zeros(0, 0, weight.size(1)))
        self.kept = list(nothing)
        for name, values in nothing.items():
            setattr(self, name, torch.zeros(n, values.size(-1), dtype=values.dtype, device=device))
        starts = list(range(0, n - block_size + 1, block_size))
        if starts[-1] != n - block_size:  # the split's last tokens
            starts.append(n - block_size)
        kept_from = [0] + [start + block_size for start in starts[:-1]]  # where the window before ended
        part, parts = share
        with torch.no_grad():
            for i in range(part * windows, len(starts), parts * windows):
                group = torch.tensor(starts[i:i + windows])
                with autocast_for(device):
                    logits, hidden = target(self.tokens[group[:, None] + torch.arange(block_size)].to(device),
                                            return_hidden=True)
                for name, values in self.keep(logits, hidden).items():  # (B, T, size)
                    outputs = getattr(self, name)
                    for row, (start, begin) in enumerate(zip(starts[i:i + windows], kept_from[i:i + windows])):
                        outputs[begin:start + block_size] = values[row, begin - start:]

    def keep(self, logits, hidden):
        """What is kept of a group of windows' positions, as it is stored: name -> (B, T, size)."""
        kept = {}
        if "distributions" in self.outputs:
            probs, ids = torch.softmax(logits.float(), -1).topk(TEACHER_TOP, dim=-1)  # (B, T, top)
            kept.update(probs=(probs / probs.sum(-1, keepdim=True)).half(), ids=ids.int())
        if "features" in self.outputs:
            kept.update(features=hidden)
        return kept

    @classmethod
    def shared(cls, split, target, outputs, device, log=say):
        """The outputs over the split, each of torchrun's processes computing its share; a split that
        already holds them (an earlier phase's, on the same target) is returned as it is."""
        if isinstance(split, cls) and split.outputs >= set(outputs):
            return split
        started = time.time()
        processes = dist.get_world_size() if dist.is_initialized() else 1
        data = cls(split, target, outputs, device, share=(RANK, processes))
        if processes > 1:
            data.merge()
        described = " and ".join(cls.DESCRIPTIONS[name] for name in sorted(data.outputs))
        log(f"the target's {described} over the {split.name} split, computed once: "
            f"{format_duration(time.time() - started)}")
        return data

    def merge(self):
        """Sum the processes' shares: each position was read by one of them, the others hold zeros."""
        for name in self.kept:
            dist.all_reduce(getattr(self, name))

    def batch(self, batch_size, block_size, generator=None, device="cpu"):
        positions = self.positions(batch_size, block_size, generator)
        return self.tokens[positions].to(device), positions.to(device)


def outputs_read(args, kind):
    """What phase `kind` reads of the frozen target's outputs (TargetOutputs): a distilled draft its
    distributions, the Medusa-1 and EAGLE heads its features; Medusa-2 trains the target itself."""
    if kind == "draft" and args.distill:
        return {"distributions"}
    if kind == "eagle" or (kind == "medusa" and not args.medusa_joint):
        return {"features"}
    return set()


class FrozenTarget:
    """The trained target as a run's later phases learn from it: loaded once, with its tokenizer, the
    splits, and the training split's outputs that any of the phases reads, all computed in one pass
    by the first of them (about 1m10s a pass on 2 cores, docs/2026-12-05-epyc-o.md)."""

    def __init__(self, args, text, device, dtype, kinds):
        self.args, self.text, self.device, self.dtype = args, text, device, dtype
        self.outputs = set().union(*(outputs_read(args, kind) for kind in kinds))
        self.loaded = None

    def load(self):
        """(target, tokenizer, train split with the outputs, val split)."""
        if self.loaded is None:
            self.loaded = load_target(self.args, self.text, self.device, self.dtype)
        target, tokenizer, train, val = self.loaded
        train = TargetOutputs.shared(train, target, self.outputs, self.device)
        self.loaded = target, tokenizer, train, val
        return self.loaded


def load_target(args, text, device, dtype):
    """(target, tokenizer, train split, val split) of OUT_DIR/target.pt or --target."""
    target, tokenizer, _ = load_model(cli.checkpoint_of(args, "target"), device=device, dtype=dtype)
    train_text, val_text = split_text(text)
    return (target, tokenizer, TokenData(tokenizer.encode(train_text), len(train_text), "train"),
            TokenData(tokenizer.encode(val_text), len(val_text), "val"))


def train_on_target(kind, args, text, device, dtype, frozen):
    """Train OUT_DIR/medusa.pt or OUT_DIR/eagle.pt on the run's frozen target (a FrozenTarget);
    Medusa-2 trains its own copy of it jointly with the heads. Returns a line for the summary."""
    out_path = checkpoint_path(args.out_dir, kind)
    if os.path.exists(out_path) and not args.resume:
        raise UserError(f"{out_path} exists: remove it or use another --out-dir")
    if os.path.exists(out_path):
        say(f"{out_path} exists; {kind} heads are trained in one go, so there is nothing to resume")
        return f"{out_path} kept"
    joint = kind == "medusa" and args.medusa_joint
    target, tokenizer, train, val = load_target(args, text, device, dtype) if joint else frozen.load()
    if kind == "eagle":
        accuracies = train_eagle(target, tokenizer, train, val, out_path, override(EAGLE_TRAINING, args),
                                 device=device, seed=args.seed, log_interval=args.log_interval)
        return f"{out_path}: top-1 agreement with the target {accuracies[0]:.3f} at depth 1"
    accuracies = train_heads(target, tokenizer, train, val, out_path, override(HEADS_TRAINING, args),
                             n_heads=args.medusa_heads, tied=args.medusa_tied, joint=joint,
                             tree_size=args.tree_size, device=device, seed=args.seed, log_interval=args.log_interval)
    return f"{out_path}: head 0 top-1 {accuracies[0][0]:.3f}"


def train_model(kind, args, text, device, dtype, frozen):
    """Train (or resume) OUT_DIR/<kind>.pt; a distilled draft learns from the run's frozen target (a
    FrozenTarget). Returns a line for the summary."""
    ckpt_path = checkpoint_path(args.out_dir, kind)
    train_text, val_text = split_text(text)
    resuming = args.resume and os.path.exists(ckpt_path)
    if resuming:
        state = load_checkpoint(ckpt_path, kind)
        tokenizer = Tokenizer(state["tokenizer"])
        model_cfg, opt = state["config"], state["train_settings"]
        for name in ("max_iters", "grad_accum", "patience"):  # a run resumed longer, or on other hardware
            if getattr(args, name) is not None:
                opt[name] = getattr(args, name)
    else:
        if os.path.exists(ckpt_path):
            raise UserError(f"{ckpt_path} exists: pass --resume to continue it, or another --out-dir")
        model_cfg, opt = settings_from_args(args, kind, device)
        if kind == "draft":  # the draft must speak the target's tokenizer, token for token
            target = load_checkpoint(cli.checkpoint_of(args, "target"), "target")
            tokenizer = Tokenizer(target["tokenizer"])
            match_target_context(args, model_cfg, target["config"])
        elif args.tokenizer == "gpt2":
            tokenizer = Tokenizer({"kind": "gpt2"})
        else:
            say(f"training a {args.vocab_size}-token byte-level BPE on {len(train_text):,} characters")
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
        say(f"resuming {ckpt_path} at iteration {start_iter}")
    say(f"{kind}: {config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, context {config.block_size}, "
          f"{model.num_params() / 1e6:.2f}M parameters, tokenizer {tokenizer.name}, "
          f"{train.chars_per_token:.2f} characters/token, {len(train.tokens):,} training tokens")
    step_model = torch.compile(model) if args.compile else model
    distilled = kind == "draft" and args.distill
    if distilled:  # the same tokens, with the target's outputs
        train = frozen.load()[2]

    def step_loss(x, y):
        logits = step_model(x)
        if distilled:  # y: the positions of x's tokens, whose cached target distributions the draft learns
            logprobs = F.log_softmax(logits.float(), -1).gather(-1, train.ids[y].long())  # (B, T, top)
            return -(train.probs[y].float() * logprobs).sum(-1).mean()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))

    def evaluate_and_save(it, elapsed):
        val_loss = estimate_loss(step_model, val, opt, config.block_size, device)
        nats_per_char = val_loss / val.chars_per_token
        improved = all(val_loss < h["val_loss"] for h in history)
        history.append(dict(iter=it, seconds=elapsed, val_loss=val_loss, val_nats_per_char=nats_per_char))
        say(f"eval {it}: val {val_loss:.4f} nats/token = {nats_per_char:.4f} nats/char "
            f"= {nats_per_char / math.log(2):.4f} bits/char ({format_duration(elapsed)})")
        if RANK == 0 and (improved or not opt.get("patience")):  # one process writes; stopping early, the best
            save_checkpoint(ckpt_path, model, tokenizer, kind=kind, optimizer=optimizer.state_dict(),
                            iter=it, rng=gen.get_state(), history=history, train_settings=opt,
                            data=os.path.abspath(args.data) if args.data else None)

    model.train()
    fit(Step(step_loss, model), optimizer, opt, train, config.block_size, device, gen, evaluate_and_save, history,
        start_iter=start_iter, log_interval=args.log_interval)
    kept = kept_evaluation(history, opt)
    if start_iter >= opt["max_iters"]:
        say(f"{ckpt_path} is already at iteration {start_iter}; raise --max-iters to train further")
    else:
        say(f"saved {ckpt_path} (iteration {kept['iter']})")
    return f"{ckpt_path}: val {kept['val_loss']:.4f} nats/token = {kept['val_nats_per_char']:.4f} nats/char"


if __name__ == "__main__":
    cli.run(main)
