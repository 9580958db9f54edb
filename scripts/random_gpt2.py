"""A GPT-2 of one of the real sizes with random weights, saved the way Hugging Face saves GPT-2, for
timing what a pass of a model that size costs here (no real weights are on this machine, and a
pass costs the same whatever the weights are):

    python -m scripts.random_gpt2 gpt2-large /tmp/gpt2-large
    python -m model.convert /tmp/gpt2-large out/gpt2-large.pt
    python bench.py --profile out/target.pt out/gpt2-large.pt

Its tokenizer has only the 256 single-byte tokens and <|endoftext|>: enough to import and time the
model, not to read what it writes. The size `tiny` (2 layers, 32 wide, GPT-2's vocabulary and context)
is no GPT-2's: the tests run this script and the import on it. Needs transformers (requirements-dev.txt).
"""
import json
import sys
from pathlib import Path

import torch

from model.tokenizer import gpt2_byte_alphabet

try:
    from scripts.hf import transformers
except ImportError:
    sys.exit("scripts.random_gpt2 needs Hugging Face transformers: pip install -r requirements-dev.txt")

SIZES = {  # n_layer, n_head, n_embd, as published with the GPT-2 checkpoints, and one for the tests
    "gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600),
    "tiny": (2, 2, 32),
}
VOCAB_SIZE, CONTEXT = 50257, 1024


def main(size, folder):
    n_layer, n_head, n_embd = SIZES[size]
    config = transformers.GPT2Config(vocab_size=VOCAB_SIZE, n_positions=CONTEXT, n_layer=n_layer, n_head=n_head,
                                     n_embd=n_embd)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    vocab = {char: i for i, char in enumerate(gpt2_byte_alphabet())}
    vocab["<|endoftext|>"] = VOCAB_SIZE - 1
    Path(folder, "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    Path(folder, "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    print(f"wrote a random {size} ({n_layer} layers, {n_head} heads, {n_embd} wide) to {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SIZES:
        print(f"usage: python -m scripts.random_gpt2 {{{','.join(SIZES)}}} FOLDER", file=sys.stderr)
        sys.exit(2)  # bad input
    main(*sys.argv[1:])
