"""Tokenizers on tiktoken: a byte-level BPE trained on the user's own text (the default, works
offline), tiktoken's stock GPT-2 encoding, or a GPT-2-style vocabulary read from a Hugging Face
folder's vocab.json and merges.txt (model/convert.py). A tokenizer is described by a small primitive
`spec` dict so that it can travel inside a checkpoint loaded with weights_only=True.
"""
import codecs
import heapq
import json
from collections import Counter, defaultdict

import regex
import tiktoken

# tiktoken's GPT-2 (r50k) pre-split pattern, copied out of tiktoken_ext.openai_public.r50k_pat_str
# because that module is an internal of tiktoken's plugin mechanism, not a stable API.
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TokenizerError(ValueError):
    """A tokenizer spec that is not valid, or a vocabulary that cannot be had."""


def _merge_word(word, pair, new_id):
    """Replaces every occurrence of `pair` in `word`, left to right, by `new_id`."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def train_bpe(text, vocab_size):
    """Byte-level BPE merges learned on `text`. Ids 0..255 are the single bytes; merge i creates token
    256 + i from the pair (left_id, right_id). Merges never cross the boundaries of the GPT-2 pre-split
    chunks, exactly as tiktoken will apply them. Ties between equally frequent pairs go to the lowest
    pair, so training is deterministic. Stops early when no pair occurs at least twice."""
    chunks = Counter(regex.findall(GPT2_SPLIT_PATTERN, text))
    words = [list(chunk.encode("utf-8")) for chunk in chunks]
    freqs = list(chunks.values())

    # counts[pair] = occurrences weighted by chunk frequency; where[pair] = chunks that may hold it
    # (a superset: stale entries are cheap to skip, and keeping it exact would cost more)
    counts = defaultdict(int)
    where = defaultdict(set)
    for w, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            counts[pair] += freq
            where[pair].add(w)
    # max-heap of (-count, pair) with lazy deletion: an entry is live only if its count is current
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)

    merges = []
    while len(merges) < vocab_size - 256 and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg:
            continue
        if -neg < 2:
            break
        new_id = 256 + len(merges)
        merges.append(pair)
        changed = set()
        for w in where.pop(pair):
            word, freq = words[w], freqs[w]
            new_word = _merge_word(word, pair, new_id)
            if len(new_word) == len(word):  # a stale entry of `where`
                continue
            for p in zip(word, word[1:]):
                counts[p] -= freq
                changed.add(p)
            for p in zip(new_word, new_word[1:]):
                counts[p] += freq
                changed.add(p)
                where[p].add(w)
            words[w] = new_word
        for p in changed:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                del counts[p]
    return merges


def _bpe_ranks(merges):
    """mergeable_ranks for tiktoken from a list of merges, checking that the list is well formed."""
    if not isinstance(merges, (list, tuple)):
        raise TokenizerError("tokenizer spec is not valid: 'merges' must be a list of [left, right] pairs")
    vocab = [bytes([b]) for b in range(256)]
    for i, merge in enumerate(merges):
        new_id = 256 + i
        if (not isinstance(merge, (list, tuple)) or len(merge) != 2
                or not all(type(t) is int and 0 <= t < new_id for t in merge)):
            raise TokenizerError(f"tokenizer spec is not valid: merge {i} ({merge!r}) must be a pair of "
                            f"token ids below {new_id}")
        vocab.append(vocab[merge[0]] + vocab[merge[1]])
    ranks = {token: rank for rank, token in enumerate(vocab)}
    # tiktoken keys tokens by their bytes, so two ids with the same bytes would silently collapse
    if len(ranks) != len(vocab):
        raise TokenizerError("tokenizer spec is not valid: two merges produce the same bytes")
    return ranks


def gpt2_byte_alphabet():
    """The printable character GPT-2's vocab.json writes for each byte (0..255): the byte's own
    character where that is printable and not a space, else one of chr(256), chr(257), ... in byte
    order, so that no token is spelled with whitespace or control characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    stand_ins = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(stand_ins)) for b in range(256)]


def _vocab_ranks(vocab, merges, special):
    """mergeable_ranks for tiktoken from a GPT-2-style vocabulary, checking that it is one.

    tiktoken merges, at each step, the adjacent pair whose joined bytes have the lowest rank, and
    returns ranks as token ids. So the ids of vocab.json serve as ranks only if they follow the
    merges' order (merge i makes a token with a larger id than merge i-1): true of GPT-2's files and
    of any vocabulary a byte-level BPE trainer writes, where merged tokens are numbered as learnt."""
    if not (isinstance(vocab, dict) and isinstance(merges, list) and isinstance(special, dict)):
        raise TokenizerError("tokenizer spec is not valid: 'vocab' and 'special' must be dicts, 'merges' a list")
    byte_of = {c: b for b, c in enumerate(gpt2_byte_alphabet())}
    ranks = {}
    for token, i in vocab.items():
        if token in special:
            continue
        if not set(token) <= byte_of.keys() or type(i) is not int:
            raise TokenizerError(f"vocabulary entry {token!r}: {i!r} is not a byte-level token")
        ranks[bytes(byte_of[c] for c in token)] = i
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(f"the vocabulary lacks {len(missing)} of the 256 single-byte tokens (e.g. byte "
                             f"{missing[0]}): not a byte-level BPE")
    last = max(ranks[bytes([b])] for b in range(256))
    for n, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else []
        if len(parts) != 2 or not all(part in vocab for part in parts) or parts[0] + parts[1] not in vocab:
            raise TokenizerError(f"merge {n + 1} ({merge!r}) is not two vocabulary tokens joining into a third")
        made = vocab[parts[0] + parts[1]]
        if made <= last:
            raise TokenizerError(f"merge {n + 1} ({merge!r}) makes token {made}, not after the tokens before it: "
                                 "the vocabulary's ids do not follow the merge order")
        last = made
    if len(set(ranks.values()) | set(special.values())) != len(ranks) + len(special):
        raise TokenizerError("two vocabulary entries share an id")
    return ranks


class Tokenizer:
    def __init__(self, spec):
        kind = spec.get("kind") if isinstance(spec, dict) else None
        if kind == "bpe":
            merges, special = spec.get("merges"), {}
            ranks = _bpe_ranks(merges)
            self.name = f"bpe-{len(ranks)}"
            self.spec = {"kind": "bpe", "merges": [[a, b] for a, b in merges]}
        elif kind == "gpt2":
            try:
                self.encoding = tiktoken.get_encoding("gpt2")
            except Exception as e:  # the download can fail in many ways (DNS, proxy, SSL, HTTP)
                raise TokenizerError(
                    f"the GPT-2 vocabulary could not be downloaded or found in tiktoken's cache "
                    f"(set TIKTOKEN_CACHE_DIR to a folder holding it) ({type(e).__name__}: {e}); "
                    f"use the default trained BPE tokenizer instead") from e
            self.name, self.spec = "gpt2", {"kind": "gpt2"}
        elif kind == "byte-level":
            vocab, merges, special = spec.get("vocab"), spec.get("merges"), spec.get("special", {})
            ranks = _vocab_ranks(vocab, merges, special)
            self.name = f"byte-level-{len(vocab)}"
            self.spec = {"kind": "byte-level", "vocab": dict(vocab), "merges": list(merges), "special": dict(special)}
        else:
            shown = repr(kind) if isinstance(spec, dict) else f"of type {type(spec).__name__}"
            raise TokenizerError(f"tokenizer spec is not valid: unknown kind {shown} "
                            f"(expected 'bpe', 'gpt2' or 'byte-level')")
        if kind != "gpt2":
            self.encoding = tiktoken.Encoding(name=self.name, pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                                              special_tokens=dict(special))
        self.vocab_size = self.encoding.n_vocab

    @classmethod
    def train(cls, text, vocab_size):
        """A byte-level BPE tokenizer with (at most) `vocab_size` tokens, learned on `text`."""
        if vocab_size < 256:
            raise TokenizerError(f"tokenizer vocab size must be at least 256 (one token per byte), "
                            f"got {vocab_size}")
        return cls({"kind": "bpe", "merges": [list(m) for m in train_bpe(text, vocab_size)]})

    @classmethod
    def from_files(cls, vocab_path, merges_path):
        """A GPT-2-style tokenizer from Hugging Face's vocab.json and merges.txt; <|endoftext|> is
        its special token where the vocabulary has it."""
        with open(vocab_path, encoding="utf-8") as f:
            vocab = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            merges = [line for line in f.read().split("\n") if line and not line.startswith("#version")]
        special = {t: vocab[t] for t in ("<|endoftext|>",) if t in vocab}
        return cls({"kind": "byte-level", "vocab": vocab, "merges": merges, "special": special})

    def encode(self, text):
        return self.encoding.encode_ordinary(text)

    def decode(self, ids):  # ids: any iterable of ints, e.g. a list or a 1-D tensor
        return self.encoding.decode([int(i) for i in ids], errors="replace")

    def token_bytes(self, token_id):
        return self.encoding.decode_single_token_bytes(int(token_id))

    def stream_decoder(self):
        return StreamDecoder(self)

    def __repr__(self):
        return f"Tokenizer({self.name})"


class StreamDecoder:
    """Turns token ids into text as they arrive without ever emitting half a multi-byte UTF-8 character:
    a token may end in the middle of one, so its bytes are held back until the character is complete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id):
        """The text that became complete with this token (often "", sometimes several chars)."""
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def flush(self):
        """Whatever is left; a dangling partial character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
