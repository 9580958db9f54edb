"""A GPT-2-style decoder in the nanoGPT manner, with one forward for every kind of pass: training (no
cache), prefill and decode (the cache holds the committed prefix), and verification (n candidates under
a tree mask, at positions prefix length + depth, so each node sees exactly its root-to-node path).
Parameter names and shapes match GPT-2 checkpoints (whose Conv1D weights are stored transposed).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from kernels import attention
from model.kv_cache import KVCache


@dataclass
class GPTConfig:
    block_size: int = 256   # context length: the number of learned positions
    vocab_size: int = 512
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True       # biases in Linears and LayerNorms, as GPT-2 has


# Model shapes only; the vocabulary comes from the tokenizer, training settings live in train.py.
PRESETS = {
    "tiny": dict(block_size=64, n_layer=2, n_head=2, n_embd=32),  # tests
    "cpu": dict(block_size=128, n_layer=4, n_head=4, n_embd=256, dropout=0.1),  # docs/2026-12-05-epyc-m.md
    "gpu": dict(block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2),  # nanoGPT shakespeare-char
    "draft": dict(block_size=128, n_layer=1, n_head=2, n_embd=128),  # ~12x fewer parameters than cpu
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.layer_idx = layer_idx  # which slice of the KV cache is ours

    def forward(self, x, cache=None, mask=None):
        B, T, C = x.size()  # T new positions
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        lengths = None
        if cache is not None:
            lengths = cache.row_lengths()  # (B,) when the batch rows hold different lengths, else None
            k, v = cache.write(self.layer_idx, k, v)  # (B, nh, P+T, hs): committed prefix + new
        y = attention(q, k, v, mask, lengths)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, mask=None):
        x = x + self.attn(self.ln_1(x), cache, mask)
        return x + self.mlp(self.ln_2(x))


def unset_embedding(rows, width):
    """An nn.Embedding that skips its own normal_ init, which on the meta device imports torch._dynamo."""
    return nn.Embedding.from_pretrained(torch.empty(rows, width), freeze=False)


class GPT(nn.Module):
    def __init__(self, config, init=True):
        """init=False: leave the weights as allocated, for a checkpoint to replace (model/checkpoint.py)."""
        super().__init__()
        self.config = config
        embedding = nn.Embedding if init else unset_embedding
        self.transformer = nn.ModuleDict(dict(
            wte=embedding(config.vocab_size, config.n_embd),
            wpe=embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied input/output embeddings, as GPT-2
        if init:
            self.apply(self._init_weights)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self):
        """Parameters without the position embeddings, as nanoGPT counts them."""
        return sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()

    def new_cache(self, scratch, batch_size=1):
        """A KV cache for a full context plus `scratch` speculative entries beyond it."""
        c, p = self.config, self.lm_head.weight
        return KVCache(c.n_layer, batch_size, c.n_head, c.n_embd // c.n_head,
                       c.block_size + scratch, dtype=p.dtype, device=p.device)

    def check_positions(self, pos):
        """Refuse a pass with no tokens or with positions past the learned ones."""
        n = pos.size(-1)
        if n == 0 or int(pos.max()) >= self.config.block_size:
            raise ValueError(f"positions must lie in [0, {self.config.block_size}), got {n} tokens "
                             f"up to position {int(pos.max()) if n else None}")

    def forward(self, idx, cache=None, pos=None, mask=None, return_hidden=False):
        """Logits (B, n, vocab) for n new tokens idx (B, n).

        cache: a model.kv_cache.Cache, the committed prefix (length P, or P_b for batch row b) the new
            tokens follow; their K/V stay in its scratch space until the KVCache's commit keeps them.
        pos: position ids (n,) or (B, n); default P, P+1, ..., P+n-1.
        mask: True = may attend. None: causal among the new tokens. Bool (n, n), or (B, n, n) one per
            row: among the new tokens (a verify pass's tree), the prefix seen whole. Bool (n, T) over
            all T keys cache.write returns: model/compiled.py's static pass, which reads its cache whole.
        return_hidden: also return the final hidden states (B, n, n_embd), after ln_f.
        """
        B, n = idx.size()
        if pos is None:
            lengths = None if cache is None else cache.row_lengths()
            if lengths is None:
                prefix = 0 if cache is None else cache.length
                pos = torch.arange(prefix, prefix + n, device=idx.device)  # (n,)
            else:  # each row goes on from its own length
                pos = lengths[:, None] + torch.arange(n, device=idx.device)  # (B, n)
        if not torch.compiler.is_compiling():  # a graph cannot read a tensor's value: compiled.py checks first
            self.check_positions(pos)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, n, C)
        for block in self.transformer.h:
            x = block(x, cache, mask)
        x = self.transformer.ln_f(x)  # (B, n, C)
        logits = self.lm_head(x)  # (B, n, vocab)
        return (logits, x) if return_hidden else logits
