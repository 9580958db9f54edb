"""Text data: read (or download) a UTF-8 file, split it 90/10, tokenize, and draw batches."""
import os
import urllib.request

import numpy as np
import torch

from cli import UserError

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SIZE = 1_115_394  # bytes
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")


def download_shakespeare(path):
    """Fetch tiny Shakespeare from the char-rnn repository and check it by size."""
    print(f"downloading tiny Shakespeare to {path} ...")
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
            payload = r.read()
    except OSError as e:
        raise UserError(f"could not download tiny Shakespeare ({e}); pass a local UTF-8 text file with --data") from e
    if len(payload) != SHAKESPEARE_SIZE:
        raise UserError(f"downloaded tiny Shakespeare has {len(payload)} bytes, expected {SHAKESPEARE_SIZE}; "
                        "pass a local copy with --data")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)


def read_text(path=None):
    """The text of `path`, or of tiny Shakespeare (downloaded on first use) when path is None."""
    if path is None:
        path = DEFAULT_DATA
        if not os.path.exists(path):
            download_shakespeare(path)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"data file {path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"data file {path} is a directory") from None
    except UnicodeDecodeError as e:
        raise UserError(f"data file {path} is not UTF-8 text (bad byte at offset {e.start})") from None


def split_text(text):
    """90% train, 10% val, split by characters so that bits per character compare across tokenizers."""
    cut = int(0.9 * len(text))
    return text[:cut], text[cut:]


class TokenData:
    """A tokenized split that hands out random (x, y) windows of block_size tokens."""

    def __init__(self, tokens, n_chars, name):
        self.tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        self.chars_per_token = n_chars / max(1, len(tokens))
        self.name = name

    def check_fits(self, block_size):
        if len(self.tokens) < block_size + 1:
            raise UserError(f"the {self.name} split has {len(self.tokens)} tokens, too short for one "
                            f"window of {block_size + 1}: use more text or a smaller --block-size")

    def positions(self, batch_size, block_size, generator=None):
        """(batch_size, block_size) positions of random windows of the split."""
        starts = torch.randint(len(self.tokens) - block_size, (batch_size,), generator=generator)
        return starts[:, None] + torch.arange(block_size)

    def batch(self, batch_size, block_size, generator=None, device="cpu"):
        """(x, y): random windows (B, T) and the tokens that follow each of their tokens."""
        positions = self.positions(batch_size, block_size, generator)
        return self.tokens[positions].to(device), self.tokens[positions + 1].to(device)
