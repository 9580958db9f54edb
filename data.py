"""Text data: read (or download) a UTF-8 file, split it 90/10, tokenize, and draw batches; and the
frozen target's outputs over a split, computed once for the models that learn from them."""
import os
import time
import urllib.request
from functools import cached_property

import numpy as np
import torch
import torch.distributed as dist

from model.checkpoint import load_model

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SIZE = 1_115_394  # bytes
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")
TEACHER_TOP = 32  # a distilled draft learns the target's 32 likeliest next tokens at each position


class DataError(ValueError):
    """Data that cannot be used (a missing file, a split too short); the commands print it as one line."""


def read_text(path=None):
    """The text of `path`, or of tiny Shakespeare (downloaded on first use from the char-rnn repository
    and checked by size) when path is None."""
    if path is None and not os.path.exists(path := DEFAULT_DATA):
        print(f"downloading tiny Shakespeare to {path} ...")
        try:
            with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
                payload = r.read()
        except OSError as e:
            raise DataError(f"could not download tiny Shakespeare ({e}); "
                            "pass a local UTF-8 text file with --data") from e
        if len(payload) != SHAKESPEARE_SIZE:
            raise DataError(f"downloaded tiny Shakespeare has {len(payload)} bytes, expected {SHAKESPEARE_SIZE}; "
                            "pass a local copy with --data")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(payload)
        os.replace(path + ".tmp", path)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"data file {path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"data file {path} is a directory") from None
    except UnicodeDecodeError as e:
        raise DataError(f"data file {path} is not UTF-8 text (bad byte at offset {e.start})") from None


def split_text(text):
    """90% train, 10% val, split by characters so that bits per character compare across tokenizers."""
    cut = int(0.9 * len(text))
    return text[:cut], text[cut:]


def tokenized_splits(text, tokenizer):
    """(train, val): the TokenData of text's two splits."""
    return [TokenData(tokenizer.encode(part), len(part), name) for part, name in zip(split_text(text), ("train", "val"))]


def format_duration(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def autocast_for(device):
    """The precision a model runs in while it trains on `device`: bfloat16 autocast on CUDA, as it is elsewhere."""
    return (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
            else torch.autocast("cpu", enabled=False))


class TokenData:
    """A tokenized split that hands out random (x, y) windows of block_size tokens."""

    def __init__(self, tokens, n_chars, name):
        self.tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        self.chars_per_token = n_chars / max(1, len(tokens))
        self.name = name

    def check_fits(self, block_size):
        if len(self.tokens) < block_size + 1:
            raise DataError(f"the {self.name} split has {len(self.tokens)} tokens, too short for one "
                            f"window of {block_size + 1}: use more text or a smaller --block-size")

    def positions(self, batch_size, block_size, generator=None):
        """(batch_size, block_size) positions of random windows of the split."""
        starts = torch.randint(len(self.tokens) - block_size, (batch_size,), generator=generator)
        return starts[:, None] + torch.arange(block_size)

    def batch(self, batch_size, block_size, generator=None, device="cpu"):
        """(x, y): random windows (B, T) and the tokens that follow each of their tokens."""
        positions = self.positions(batch_size, block_size, generator)
        return self.tokens[positions].to(device), self.tokens[positions + 1].to(device)

    def fixed_batches(self, count, batch_size, block_size, device):
        """`count` batches, the same at every call (a fixed seed), so that evaluations compare like with like."""
        generator = torch.Generator().manual_seed(0)
        return (self.batch(batch_size, block_size, generator, device) for _ in range(count))


class TargetOutputs(TokenData):
    """The training split with the frozen target's outputs computed once, for the models that learn
    from them (docs/2026-12-06-epyc-t.md). outputs: what is kept of each position, any of
      "distributions": the target's TEACHER_TOP likeliest next tokens (`ids`) and their
          probabilities, renormalised (`probs`), for a draft to distil;
      "features": its final hidden state (`features`, after ln_f), for heads on the frozen target
          (Medusa-1, EAGLE), whose logits are `target.lm_head(features)`;
    each an attribute (len(split), size). The split is read in back-to-back windows of the target's
    context (the last ends with the split, kept from where the one before ended), so each position is
    read after 0 to block_size - 1 tokens, as random windows read it; `windows` of them at a time
    (default: 4,096 tokens' worth, so that a long context's logits stay within memory). batch()
    returns windows and, in place of the tokens that follow, their positions, whose outputs the loss
    reads. share=(k, n): only every n-th group of windows from the k-th is read, the other positions
    left zero, so that n processes can split the work and sum their shares (`shared`)."""

    @torch.no_grad()
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
        starts = sorted({*range(0, n - block_size + 1, block_size), n - block_size})  # the last: the split's end
        kept_from = [0] + [start + block_size for start in starts[:-1]]  # where the window before ended
        for i in range(share[0] * windows, len(starts), share[1] * windows):
            group = torch.tensor(starts[i:i + windows])
            with autocast_for(device):
                logits, hidden = target(self.tokens[group[:, None] + torch.arange(block_size)].to(device),
                                        return_hidden=True)
            for name, values in self.keep(logits, hidden).items():  # (B, T, size)
                for row, (start, begin) in enumerate(zip(starts[i:i + windows], kept_from[i:i + windows])):
                    getattr(self, name)[begin:start + block_size] = values[row, begin - start:]

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
    def shared(cls, split, target, outputs, device):
        """The outputs over the split, each of torchrun's processes computing its share; a split that
        already holds them (an earlier phase's, on the same target) is returned as it is."""
        if isinstance(split, cls) and split.outputs >= set(outputs):
            return split
        processes, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        data = cls(split, target, outputs, device, share=(rank, processes))
        for name in data.kept if processes > 1 else ():
            dist.all_reduce(getattr(data, name))  # each position was read by one process, the others hold zeros
        return data

    def batch(self, batch_size, block_size, generator=None, device="cpu"):
        positions = self.positions(batch_size, block_size, generator)
        return self.tokens[positions].to(device), positions.to(device)


class FrozenTarget:
    """The trained target at `path` as a run's later phases learn from it: loaded once, with its tokenizer
    and the splits, the training split holding the `outputs` (TargetOutputs) that any of the phases reads."""

    def __init__(self, path, text, outputs, device, dtype, log):
        self.path, self.text, self.outputs, self.device, self.dtype, self.log = path, text, outputs, device, dtype, log

    def load(self):
        """(target, tokenizer, train split, val split), loaded afresh: a copy of the target to train."""
        target, tokenizer, _ = load_model(self.path, device=self.device, dtype=self.dtype)
        return (target, tokenizer, *tokenized_splits(self.text, tokenizer))

    @cached_property
    def loaded(self):
        """load()'s, loaded on first use, the training split with the outputs."""
        target, tokenizer, train, val = self.load()
        started = time.time()
        train = TargetOutputs.shared(train, target, self.outputs, self.device)
        described = " and ".join(dict(distributions="next-token distributions", features="features")[name]
                                 for name in sorted(self.outputs))
        self.log(f"the target's {described} over the {train.name} split, computed once: "
                 f"{format_duration(time.time() - started)}")
        return target, tokenizer, train, val
