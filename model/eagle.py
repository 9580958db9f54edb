"""The EAGLE head (Li et al. 2024): a one-layer draft model that works on the target's features.

The target's final hidden state f_t (after ln_f) is the feature its lm_head reads token t+1 from.
EAGLE predicts the NEXT feature, f_{t+1}, from f_t and the token x_{t+1} that was actually chosen:

    f_t --------------------+
                            +-> fuse (2C -> C) -> one transformer block -> f^_{t+1} -> lm_head -> token t+2
    wte(x_{t+1}) -----------+     (own KV cache)                             (the target's, frozen)

Knowing x_{t+1} is what Medusa's heads lack: they guess t+2 from f_t alone, for every branch at
once. Drafting runs the head autoregressively on its own predicted features: f^_{t+1} and the
drafted token x_{t+2} give f^_{t+2}, and so on. The embedding and lm_head are the target's, frozen;
only the fuse layer and the block are the head's own (~1/n_layer of the target's blocks).

Training (train.py --what eagle) regresses f^_{t+1} onto f_{t+1} (smooth L1) and scores
lm_head(f^_{t+1}) against the target's own distribution of token t+2 (cross-entropy, weight 0.1),
with uniform noise on the input features so that the head learns to cope with its own inexact
predictions when it drafts several steps ahead.
"""
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.checkpoint import load_heads, save_checkpoint, target_fingerprints
from model.gpt import Block
from model.kv_cache import KVCache

FEATURE_NOISE = 0.1    # the input features get U(-0.1, 0.1) noise in training, as in the paper
TOKEN_WEIGHT = 0.1     # the token loss's weight beside the feature regression, as in the paper


@dataclass(frozen=True)
class EagleConfig:
    n_embd: int   # the target's width, which the head works at
    n_head: int


class EagleHead(nn.Module):
    def __init__(self, target, init=True):
        """init=False: leave the weights as allocated, for a checkpoint to replace (model/checkpoint.py)."""
        super().__init__()
        c = target.config
        self.config = EagleConfig(c.n_embd, c.n_head)
        self.fuse = nn.Linear(2 * c.n_embd, c.n_embd)
        self.block = Block(replace(c, dropout=0.0), layer_idx=0)  # the only layer of its own cache
        # a plain tuple keeps the target's embedding and lm_head out of this module's parameters
        # and state dict: the target owns them
        self.target_parts = (target.transformer.wte, target.lm_head)
        self.block_size = c.block_size
        if not init:
            return
        for module in (self.fuse, *self.block.modules()):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                nn.init.zeros_(module.bias)
        p = target.lm_head.weight
        self.to(device=p.device, dtype=p.dtype)

    def new_cache(self, scratch):
        """A cache for a full context of features plus `scratch` drafted entries."""
        c, p = self.config, self.fuse.weight
        return KVCache(1, 1, c.n_head, c.n_embd // c.n_head, self.block_size + scratch, dtype=p.dtype, device=p.device)

    def forward(self, features, tokens, cache=None, mask=None):
        """(predicted features f^_{t+1} (B, n, C), logits of token t+2 (B, n, vocab)) from the
        features f_t (B, n, C) and the tokens x_{t+1} (B, n) that followed them.
        cache, mask: as GPT.forward's (a drafted tree's nodes see the context and their ancestors)."""
        wte, lm_head = self.target_parts
        x = self.fuse(torch.cat([features, wte(tokens)], dim=-1))  # (B, n, C)
        x = self.block(x, cache, mask)  # (B, n, C)
        return x, lm_head(x)


def eagle_losses(head, features, logits, tokens, generator=None):
    """(feature loss, token loss) of the head over a batch of the target's outputs: features f
    (B, T, C) and logits (B, T, V) of the tokens (B, T). Position t's input is (f_t + noise,
    x_{t+1}); its output is scored against f_{t+1} and the target's distribution at t+1."""
    f_in = features[:, :-1]
    if head.training:
        noise = torch.rand(f_in.shape, generator=generator, device=f_in.device, dtype=f_in.dtype)
        f_in = f_in + (2 * noise - 1) * FEATURE_NOISE
    predicted, predicted_logits = head(f_in, tokens[:, 1:])
    feature_loss = F.smooth_l1_loss(predicted.float(), features[:, 1:].float())
    target_probs = torch.softmax(logits[:, 1:].float(), -1)
    token_loss = F.cross_entropy(predicted_logits.flatten(0, 1).float(), target_probs.flatten(0, 1))
    return feature_loss, token_loss


def eagle_loss(feature_loss, token_loss):
    return feature_loss + TOKEN_WEIGHT * token_loss


def save_eagle(path, head, target_model, tokenizer, **extra):
    """Write the head atomically, with the target's fingerprint (and `extra`: accuracies, ...)."""
    save_checkpoint(path, head, tokenizer, kind="eagle", target=target_fingerprints(target_model, tokenizer), **extra)


def load_eagle(path, target_model, tokenizer, device="cpu", dtype=torch.float32):
    """(head in eval mode, raw checkpoint dict) for `target_model`, the target it was trained on."""
    return load_heads(path, "eagle", target_model, tokenizer, lambda state: EagleHead(target_model, init=False),
                      device, dtype)
