"""Medusa heads (Cai et al. 2024): extra next-next-token predictors on the target's last hidden state.

The target's own lm_head turns the final hidden state at position t into the distribution of token
t+1. Medusa head i turns the same hidden state into a guess at token t+i+2: head 0 guesses the token
after next, head 1 the one after that, and so on. One target forward thus yields the next token and
K guesses beyond it, with no draft model and no extra forward.

Each head is a residual block h + SiLU(W h) followed by its own vocabulary projection. W starts at
zero and the projection as a copy of the target's lm_head, so an untrained head starts out saying
exactly what the target says about the next token, a far better start than random for a guess at
the token after it. With tied=True every head reuses the target's lm_head (fewer parameters, and
nothing to train but the K residual blocks).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.checkpoint import load_heads, save_checkpoint, target_fingerprints


@dataclass(frozen=True)
class MedusaConfig:
    n_heads: int = 4
    tied: bool = False  # share the target's lm_head instead of a copy per head


class ResBlock(nn.Module):
    """x + SiLU(W x), with W zero-initialized so that the block starts as the identity."""

    def __init__(self, n_embd, init=True):
        super().__init__()
        self.linear = nn.Linear(n_embd, n_embd)
        if init:
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, target, config=MedusaConfig(), init=True):
        """init=False: leave the weights as allocated, for a checkpoint to replace (model/checkpoint.py)."""
        super().__init__()
        self.config = config
        n_embd, vocab_size = target.config.n_embd, target.config.vocab_size
        # one module per head: `[ResBlock(n)] * K` would be K references to a single block
        self.blocks = nn.ModuleList([ResBlock(n_embd, init) for _ in range(config.n_heads)])
        if config.tied:
            # a plain tuple keeps the target's lm_head out of this module's parameters and state
            # dict: the target owns it, moves it and saves it
            self.shared_head = (target.lm_head,)
        else:
            self.lm_heads = nn.ModuleList([nn.Linear(n_embd, vocab_size, bias=False) for _ in range(config.n_heads)])
        if not init:
            return
        p = target.lm_head.weight
        self.to(device=p.device, dtype=p.dtype)  # before the copies, which must not round through float32
        if not config.tied:
            with torch.no_grad():
                for head in self.lm_heads:
                    head.weight.copy_(p)

    @property
    def n_heads(self):
        return self.config.n_heads

    def forward(self, hidden):
        """Logits (K, B, T, vocab) of heads 0..K-1 from the target's final hidden states (B, T, C)."""
        heads = self.shared_head * self.n_heads if self.config.tied else self.lm_heads
        return torch.stack([head(block(hidden)) for block, head in zip(self.blocks, heads)])  # (K, B, T, V)

    @torch.no_grad()
    def decoder(self):
        """For decoding: a function from one hidden state (C,) to the logits (K, vocab) of every head.
        The K residual blocks run as one batched matmul; the projections as one (K, C) x (C, V)
        product when tied, else one matrix-vector product per head, faster on a CPU than a batched
        (K, V, C) x (K, C, 1) product (docs/2026-12-06-epyc-t.md). It works on copies of the heads'
        own weights as they are now."""
        weight = torch.stack([block.linear.weight for block in self.blocks])  # (K, C, C)
        bias = torch.stack([block.linear.bias for block in self.blocks])      # (K, C)
        projections = None if self.config.tied else [head.weight.clone() for head in self.lm_heads]

        def logits(h):
            x = h + F.silu(torch.matmul(weight, h) + bias)  # (K, C): every residual block at once
            if projections is None:
                return F.linear(x, self.shared_head[0].weight)  # (K, V)
            return torch.stack([F.linear(x_k, w) for x_k, w in zip(x, projections)])  # (K, V)
        return logits


HEAD_DECAY = 0.8  # head i's loss weighs 0.8^i: far heads are harder, and used only after the near ones


def head_losses(head_logits, labels):
    """Cross-entropy of each head (list of K scalars). head_logits (K, B, T, V); labels: the next
    tokens y (B, T), or distributions over them (B, T, V); head i at position t is scored against
    labels[t+i+1], the token i+2 places beyond t:

        tokens  x0 x1 x2 x3 x4 ...      y[t] = x[t+1] (the target's own job)
        head 0 at t=0 -> x2 = y[1]      head i at t -> y[t+i+1]; positions past the window are dropped
        head 1 at t=0 -> x3 = y[2]
    """
    return [F.cross_entropy(logits[:, :-(i + 1)].flatten(0, 1).float(), labels[:, i + 1:].flatten(0, 1))
            for i, logits in enumerate(head_logits)]


def heads_loss(losses):
    """The heads' training loss: sum_i HEAD_DECAY^i CE_i."""
    return sum(HEAD_DECAY ** i * ce for i, ce in enumerate(losses))


def save_medusa(path, heads, target_model, tokenizer, **extra):
    """Write the heads atomically, with the target's fingerprint (and `extra`: accuracies, tree, ...)."""
    save_checkpoint(path, heads, tokenizer, kind="medusa", target=target_fingerprints(target_model, tokenizer), **extra)


def load_medusa(path, target_model, tokenizer, device="cpu", dtype=torch.float32):
    """(heads in eval mode, raw checkpoint dict) for `target_model`, whose file must be the one the
    heads were trained on. The dict also holds the measured 'accuracies' and the chosen 'tree'."""
    return load_heads(path, "medusa", target_model, tokenizer,
                      lambda state: MedusaHeads(target_model, MedusaConfig(**state["config"]), init=False),
                      device, dtype)
