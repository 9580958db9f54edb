"""The optimisers train.py steps: AdamW, or Muon for the Linear layers' matrices and AdamW for the
rest, on a linear-warmup cosine schedule. `settings` throughout is a model's optimisation settings
(train.py's TRAIN_PRESETS and the flags): learning_rate, min_lr, warmup_iters, max_iters,
weight_decay and which optimizer."""
import math

import torch
from torch import nn

# Muon's matrices learn at 3x AdamW's rate (docs/2026-12-06-epyc-t.md)
MUON_LR_SCALE = 3
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # Jordan's quintic: the steepest rise at 0 that still settles near 1
NEWTON_SCHULZ_STEPS = 5


def lr_at(it, settings):
    """Linear warmup, then cosine decay to min_lr at max_iters."""
    if it < settings["warmup_iters"]:
        return settings["learning_rate"] * (it + 1) / settings["warmup_iters"]
    progress = min(1.0, (it - settings["warmup_iters"]) / max(1, settings["max_iters"] - settings["warmup_iters"]))
    return settings["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (settings["learning_rate"] - settings["min_lr"])


def make_optimizer(model, settings):
    """AdamW; with settings["optimizer"] == "muon", Muon for muon_matrices(model) and AdamW for the rest."""
    matrices = [p for p in muon_matrices(model) if p.requires_grad] if settings.get("optimizer") == "muon" else []
    rest = [p for p in model.parameters() if p.requires_grad and all(p is not m for m in matrices)]
    # decay: embeddings and, without Muon, matrices; not biases or LayerNorms
    adam = adamw([dict(params=[p for p in rest if p.dim() >= 2], weight_decay=settings["weight_decay"]),
                  dict(params=[p for p in rest if p.dim() < 2], weight_decay=0.0)], settings)
    if not matrices:
        return adam
    muon = Muon([dict(params=matrices, lr_scale=MUON_LR_SCALE)], lr=settings["learning_rate"] * MUON_LR_SCALE,
                weight_decay=settings["weight_decay"])
    return Optimizers(muon, adam)


def adamw(groups, settings):
    """AdamW, fused (one kernel for all parameters) where the parameters' device and dtype have it."""
    fused = all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for group in groups for p in group["params"])
    return torch.optim.AdamW(groups, lr=settings["learning_rate"], betas=(0.9, 0.99),
                             weight_decay=settings["weight_decay"], fused=fused)


def muon_matrices(model):
    """The weights Muon moves: the Linear layers' matrices, not the embeddings (whose rows are looked
    up, not multiplied) nor an lm_head tied to one."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in embeddings]


def orthogonalisation_flops(model, steps=NEWTON_SCHULZ_STEPS):
    """The arithmetic of one Muon step's Newton-Schulz iterations over model's matrices: for an m x n
    matrix, m <= n, each iteration's x x^T, s s and (...) x multiply 2m^2n + 2m^3 + 2m^2n."""
    return sum(steps * (4 * min(w.shape) ** 2 * max(w.shape) + 2 * min(w.shape) ** 3) for w in muon_matrices(model))


def orthogonalise(update, steps=NEWTON_SCHULZ_STEPS):
    """About U V^T for update = U S V^T: a Newton-Schulz iteration moves the singular values that are
    not tiny against the largest to about 0.7-1.2. In float32: torch.optim.Muon runs it in bfloat16,
    which a CPU without bfloat16 arithmetic emulates slowly (docs/2026-12-06-epyc-t.md)."""
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
