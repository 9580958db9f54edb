from collections import Counter

import pytest
import regex
import tiktoken
import torch

from model.tokenizer import GPT2_SPLIT_PATTERN, Tokenizer, TokenizerError, train_bpe
from tests.conftest import SHAKESPEARE


SAMPLES = [
    "",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "MENENIUS:\nI tell you, friends, most charitable care\nHave the patricians of you.",
    "café naïve résumé",
    "日本語のテキスト",
    "emoji 🙂👍🏽 and a family 👨‍👩‍👧",
    "   leading, trailing   \t\n\n\n  \r\n ",
    "numbers 12345 and 3.14, it's we'll they've",
]


@pytest.fixture(scope="module")
def text():
    return SHAKESPEARE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tok(text):
    return Tokenizer.train(text, 384)


def naive_train_bpe(text, vocab_size):
    """Reference trainer: recounts every pair from scratch at each step."""
    words = Counter(tuple(c.encode("utf-8")) for c in regex.findall(GPT2_SPLIT_PATTERN, text))
    merges = []
    while len(merges) < vocab_size - 256:
        counts = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                counts[pair] += freq
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        new_id = 256 + len(merges)
        merges.append(pair)
        merged = Counter()
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == pair:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += freq
        words = merged
    return merges


def test_split_pattern_matches_tiktoken():
    from tiktoken_ext.openai_public import r50k_pat_str
    assert GPT2_SPLIT_PATTERN == r50k_pat_str


def test_vocab_256_is_plain_bytes():
    tok = Tokenizer.train("anything at all", 256)
    assert tok.vocab_size == 256 and tok.spec == {"kind": "bpe", "merges": []}
    for s in SAMPLES:
        assert tok.encode(s) == list(s.encode("utf-8"))
        assert tok.decode(tok.encode(s)) == s
    assert train_bpe("aaaa", 256) == []


@pytest.mark.parametrize("s", SAMPLES)
def test_round_trip(tok, s):
    assert tok.decode(tok.encode(s)) == s


def test_round_trip_excerpts(tok, text):
    for start in range(0, len(text), 20_000):
        excerpt = text[start:start + 2_000]
        assert tok.decode(tok.encode(excerpt)) == excerpt


def test_training_deterministic_and_compresses(tok, text):
    assert tok.vocab_size == 256 + len(tok.spec["merges"]) == 384
    assert tok.name == "bpe-384"
    assert Tokenizer.train(text, 384).spec == tok.spec
    excerpt = text[:10_000]
    assert len(tok.encode(excerpt)) < 0.7 * len(excerpt.encode("utf-8"))


def test_incremental_counts_match_naive_trainer(text):
    small = text[:5_000] + "日本語 日本 🙂🙂 🙂🙂"
    assert train_bpe(small, 330) == naive_train_bpe(small, 330)


def test_stops_when_no_pair_repeats():
    merges = train_bpe("abcabc", 1000)
    assert len(merges) < 744 and Tokenizer.train("abcabc", 1000).vocab_size == 256 + len(merges)
    assert train_bpe("", 300) == []


def test_spec_round_trip(tok, tmp_path):
    path = tmp_path / "spec.pt"
    torch.save({"tokenizer": tok.spec}, path)
    spec = torch.load(path, weights_only=True)["tokenizer"]
    again = Tokenizer(spec)
    assert again.spec == tok.spec and again.vocab_size == tok.vocab_size
    for s in SAMPLES:
        assert again.encode(s) == tok.encode(s)


def test_token_bytes(tok):
    assert tok.token_bytes(ord("a")) == b"a"
    a, b = tok.spec["merges"][0]
    assert tok.token_bytes(256) == tok.token_bytes(a) + tok.token_bytes(b)
    assert b"".join(tok.token_bytes(i) for i in tok.encode(SAMPLES[4])) == SAMPLES[4].encode()


@pytest.mark.parametrize("s", SAMPLES)
def test_stream_decoder_never_splits_characters(s):
    tok = Tokenizer.train("", 256)  # one token per byte, so multi-byte chars span several tokens
    stream = tok.stream_decoder()
    pieces = [stream.push(i) for i in tok.encode(s)]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.flush() == s


def test_stream_decoder_flushes_dangling_bytes():
    tok = Tokenizer.train("", 256)
    stream = tok.stream_decoder()
    assert stream.push("é".encode()[0]) == ""
    assert stream.flush() == "\ufffd"


@pytest.mark.parametrize("spec", [
    {"kind": "sentencepiece"},
    {},
    None,
    {"kind": "bpe"},
    {"kind": "bpe", "merges": "nope"},
    {"kind": "bpe", "merges": [[97, 256]]},     # 256 is the merge being defined
    {"kind": "bpe", "merges": [[97, 98, 99]]},
    {"kind": "bpe", "merges": [[97, -1]]},
    {"kind": "bpe", "merges": [[97, "b"]]},
    {"kind": "bpe", "merges": [[97, 98], [97, 98]]},  # two ids with the same bytes
])
def test_bad_spec(spec):
    with pytest.raises(TokenizerError, match="not valid"):
        Tokenizer(spec)


def test_vocab_too_small():
    with pytest.raises(TokenizerError):
        Tokenizer.train("hello", 255)


@pytest.mark.parametrize("exc", [OSError("network unreachable"), ValueError("hash mismatch")])
def test_gpt2_offline(monkeypatch, exc):
    def offline(name):
        raise exc
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(TokenizerError, match="GPT-2") as info:
        Tokenizer({"kind": "gpt2"})
    assert "TIKTOKEN_CACHE_DIR" in str(info.value) and info.value.__cause__ is exc
