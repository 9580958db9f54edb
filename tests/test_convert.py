"""Imported GPT-2 checkpoints: Hugging Face's GPT2LMHeadModel and our GPT compute the same thing, our
tokenizer splits text as Hugging Face's does, and every method speculates on an imported model.

The models are random, of two tiny GPT-2 shapes, made and saved by `transformers` (a test-only
dependency: where it is not installed, the tests that need it skip and the others run); the
tokenizer is a byte-level BPE trained on the fixture by Hugging Face `tokenizers`.
"""
import json
import shutil

import pytest
import torch

from decode import generate
from decode.methods import make_proposer
from decode.sampling import Sampling
from decode.tree import Candidates, pass_mask
from model import convert
from model.checkpoint import load_model
from model.eagle import EagleHead
from model.medusa import MedusaConfig, MedusaHeads
from model.tokenizer import Tokenizer, gpt2_byte_alphabet
from tests.conftest import SHAKESPEARE, run_cli, run_process, tiny_model
from tests.test_cli import assert_one_line_error, generate_compared

try:
    import tokenizers

    from scripts.hf import transformers  # not `import transformers`: our kernels/ shadows a package it needs
except ImportError:
    tokenizers = transformers = None
NO_TRANSFORMERS = "Hugging Face transformers is not installed (pip install -r requirements-dev.txt)"

SHAPES = {"small": dict(n_embd=32, n_layer=2, n_head=2), "large": dict(n_embd=48, n_layer=3, n_head=4)}
CONTEXT = 64
MIXED_TEXT = [
    "Hello, world! It's 2024 — naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, emoji 😀👍🏽.",
    "don't won't I'm we'll they're you've she'd 'tis O'er",
    "tabs\tand\t\tspaces   runs    of   whitespace   ",
    "  leading spaces and trailing newline\n", "\n\n\nnewlines\r\nand CRLF\r\n", "numbers 3.14159 1,000,000 42nd",
    "symbols: <|> {}[]() @#$%^&* ~`_+=-/\\ ¡¿ «» “quotes”", "\u00a0non-breaking\u2009thin\u200bzero-width",
]


def gpt2_folder(folder, shape, vocab_files, seed, weights="safetensors"):
    """A random GPT2LMHeadModel of `shape` saved the way Hugging Face saves it, with the tokenizer's
    files beside it. Every weight, bias and layer-norm gain is random, so a transpose or a mix-up
    anywhere shows. Returns the model (eval, float64)."""
    torch.manual_seed(seed)
    vocab_size = len(json.loads((vocab_files / "vocab.json").read_text(encoding="utf-8")))
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=CONTEXT, bos_token_id=None,
                                     eos_token_id=None, **shape)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if ".ln_" in name and name.endswith(".weight") else 0.0, 0.3)
    if weights == "safetensors":
        hf.save_pretrained(folder)
    else:  # the older format: a state dict pickled by torch.save
        hf.config.save_pretrained(folder)
        torch.save(hf.state_dict(), folder / "pytorch_model.bin")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(vocab_files / name, folder / name)
    return hf.double()


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    """(a byte-level BPE trained by Hugging Face on the fixture, the folder of its vocab/merges); every
    test that needs Hugging Face's packages needs this fixture, so here they skip without them."""
    if transformers is None:
        pytest.skip(NO_TRANSFORMERS)
    folder = tmp_path_factory.mktemp("bpe")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([SHAKESPEARE.read_text(encoding="utf-8")], vocab_size=420, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save_model(str(folder))
    return bpe, folder


@pytest.fixture(scope="module")
def imported(tmp_path_factory, hf_tokenizer):
    """{shape: (HF model, our checkpoint path)}: the small one saved as safetensors, the large one as
    pytorch_model.bin, both converted with `python -m model.convert`."""
    models = {}
    for seed, (shape, weights) in enumerate([("small", "safetensors"), ("large", "bin")]):
        folder = tmp_path_factory.mktemp(f"gpt2-{shape}")
        hf = gpt2_folder(folder, SHAPES[shape], hf_tokenizer[1], seed, weights)
        out = folder / "converted.pt"
        assert convert.main([str(folder), str(out)]) == 0
        models[shape] = hf, out
    return models


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("shape", list(SHAPES))
@torch.no_grad()
def test_logits_equal_hugging_face(imported, shape, dtype, tolerance):
    hf, path = imported[shape]
    hf = hf.to(dtype)
    model, _, _ = load_model(path, dtype=dtype)
    tokens = torch.randint(model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    expected = hf(tokens).logits[0]  # (40, vocab)

    def close(ours, theirs):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=tolerance)

    cache = model.new_cache(scratch=7)
    close(model(tokens[:, :30], cache)[0], expected[:30])  # prefill
    cache.commit()
    for t in range(30, 35):  # cached single steps
        close(model(tokens[:, t:t + 1], cache)[0, 0], expected[t])
        cache.commit()
    # a tree-masked verify pass: each node's logits are those of the text along its path
    root = tokens[0, 35].item()
    tree = Candidates([11, 12, 13, 14, 15, 16], [-1, 0, 0, -1, 3, 4])
    pos = torch.tensor([35] + [35 + d for d in tree.depths()])
    logits = model(torch.tensor([[root, *tree.tokens]]), cache, pos=pos, mask=pass_mask(tree, 1))[0]
    for node in range(len(tree)):
        path, v = [], node
        while v >= 0:
            path.insert(0, tree.tokens[v])
            v = tree.parents[v]
        text = torch.cat([tokens[0, :36], torch.tensor(path)])[None]
        close(logits[node + 1], hf(text).logits[0, -1])


def test_greedy_generation_equals_hugging_face_generate(imported):
    hf, path = imported["large"]
    model, tokenizer, _ = load_model(path, dtype=torch.float64)
    prompt = tokenizer.encode("ROMEO:\nWhat light")
    ours, _ = generate(model, prompt, 40, Sampling())
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert ours == theirs[0, len(prompt):].tolist()
    r = run_cli("generate.py", "--target", path, "--prompt", "ROMEO:\nWhat light", "--temperature", "0",
                "--dtype", "float64", "--max-new-tokens", "40", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == tokenizer.decode(ours)


def test_tokenizer_equals_hugging_face(hf_tokenizer):
    bpe, folder = hf_tokenizer
    ours = Tokenizer.from_files(folder / "vocab.json", folder / "merges.txt")
    assert ours.vocab_size == bpe.get_vocab_size()
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()[:300] + MIXED_TEXT
    for line in lines:
        ids = ours.encode(line)
        assert ids == bpe.encode(line).ids, line
        assert ours.decode(ids) == line
    assert ours.spec == Tokenizer(ours.spec).spec  # travels in a checkpoint


def test_tokenizer_refuses_a_vocabulary_out_of_merge_order(hf_tokenizer, tmp_path):
    _, folder = hf_tokenizer
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    first, second = [m for m in merges if not m.startswith("#")][:2]
    a, b = ("".join(m.split(" ")) for m in (first, second))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(ValueError, match="merge order"):
        Tokenizer.from_files(tmp_path / "vocab.json", folder / "merges.txt")


# lookahead's fixed sizes: sized by this machine's timings, a loaded machine may leave it nothing to verify
@pytest.mark.parametrize("method, setting", [("draft", ["--k", "3"]), ("lookahead", ["--sizing", "fixed"]), ("prompt-lookup", []),
                                             ("jacobi", []), ("medusa", []), ("eagle", ["--eagle", "tree:8"])])
def test_every_method_on_an_imported_model_says_what_plain_says(imported, tmp_path_factory, method, setting):
    """Greedy, float64, past the 64-token context (the slide). The large GPT-2 drafts for itself: two
    random models agree on next to nothing, and a draft whose every guess is rejected writes plain
    decoding's text whatever the loop would do with guesses that hold (the small one drafts in the
    test below)."""
    _, target = imported["large"]
    out_dir = tmp_path_factory.getbasetemp() / "imported-heads"
    if method in ("medusa", "eagle") and not (out_dir / f"{method}.pt").exists():
        # a few iterations make Medusa heads that guess right now and then; an EAGLE head needs more
        heads, iters = (["--medusa-heads", "2"], "4") if method == "medusa" else ([], "60")
        r = run_cli("train.py", "--what", method, "--target", target, "--out-dir", out_dir, "--data", SHAKESPEARE,
                    "--max-iters", iters, "--batch-size", "4", "--eval-iters", "1", *heads)
        assert r.returncode == 0, r.stderr
    # the default prompt: from it this random model's text repeats itself enough for every method to
    # have guesses accepted
    generate_compared("--target", target, "--draft", target, "--out-dir", out_dir, "--spec", method, *setting,
                      "--max-new-tokens", "80")


def test_bench_decodes_with_an_imported_target_and_draft(imported):
    (_, small), (_, large) = imported["small"], imported["large"]
    r = run_cli("bench.py", "--target", large, "--draft", small, "--data", SHAKESPEARE, "--methods", "draft,prompt-lookup",
                "--k", "2", "--num-prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--dtype", "float64",
                "--no-fallback", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["method"] for row in rows] == ["none", "draft 2", "prompt-lookup 3,5,2", "none again (noise)"]
    assert all(row["identical_to_plain"] == 1.0 and row["held"] == 0 for row in rows)
    # the small draft drafted, though for another random model it guesses next to nothing right;
    # prompt lookup had guesses accepted
    assert rows[1]["draft_forwards"] > 0 and rows[1]["alpha"] is not None and rows[2]["alpha"]


def test_a_draft_of_another_tokenizer_is_refused(imported, tmp_path):
    _, target = imported["large"]
    state = torch.load(imported["small"][1], weights_only=True)
    state["tokenizer"]["merges"] = state["tokenizer"]["merges"][:-1]
    torch.save(state, tmp_path / "other.pt")
    assert_one_line_error(run_cli("generate.py", "--target", target, "--spec", "draft", "--draft", tmp_path / "other.pt"),
                          "another tokenizer")


def test_train_draft_for_an_imported_target(imported, tmp_path):
    _, target = imported["large"]
    r = run_cli("train.py", "--what", "draft", "--target", target, "--out-dir", tmp_path, "--data", SHAKESPEARE,
                "--preset", "tiny", "--max-iters", "2", "--eval-iters", "1")
    assert r.returncode == 0, r.stderr
    _, draft_tokenizer, state = load_model(tmp_path / "draft.pt", kind="draft")
    assert draft_tokenizer.spec == load_model(target)[1].spec and state["config"]["block_size"] == CONTEXT


@pytest.mark.skipif(transformers is None, reason=NO_TRANSFORMERS)
def test_the_documented_random_gpt2_imports(tmp_path):
    """`python -m scripts.random_gpt2 SIZE DIR` and `python -m model.convert DIR OUT`, as the README's layout
    and docs/2026-12-03-epyc-f.md run them: each a process of its own, the repository root on its path."""
    r = run_process("-m", "scripts.random_gpt2", "tiny", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    r = run_process("-m", "model.convert", tmp_path / "hf", tmp_path / "tiny.pt")
    assert r.returncode == 0, r.stderr
    model, tokenizer, _ = load_model(tmp_path / "tiny.pt")
    c = model.config
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size) == (2, 2, 32, 1024, 50257)
    assert tokenizer.name == "byte-level-257"  # the 256 bytes and <|endoftext|>


def test_bad_folders_get_one_line(imported, tmp_path, capsys):
    hf, _ = imported["small"]
    folder = tmp_path / "gpt2"
    hf.save_pretrained(folder)
    assert convert.main([str(folder), str(tmp_path / "out.pt")]) == 2  # no vocab.json
    assert "vocab.json" in capsys.readouterr().err
    assert convert.main([str(tmp_path / "nowhere"), str(tmp_path / "out.pt")]) == 2
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, activation_function="relu")))
    assert convert.main([str(folder), str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "nowhere" in err[0] and "activation_function" in err[1]
    assert not (tmp_path / "out.pt").exists()
    r = run_process("-m", "model.convert", tmp_path / "nowhere", tmp_path / "out.pt")
    assert_one_line_error(r, "nowhere")
    assert_one_line_error(run_cli("generate.py", "--target", tmp_path / "missing.pt"), "--target", "missing.pt")


def test_bench_profiles_each_size_and_predicts_the_draft(imported, tmp_path):
    (_, small), (_, large) = imported["small"], imported["large"]
    r = run_cli("bench.py", "--profile", small, large, "--draft", small, "--json", "--plot", tmp_path)
    assert r.returncode == 0, r.stderr
    profile = json.loads(r.stdout)["profile"]
    assert len(profile) == 2 and all(len(p["r"]) == CONTEXT // 2 and p["r"][0] == 1.0 for p in profile.values())
    small_row, large_row = profile.values()
    assert "c" not in small_row and large_row["c"] > 0  # a draft is priced only against larger models
    assert [k for k, _ in large_row["best"]] and all(speedup > 0 for _, speedup in large_row["best"])
    assert (tmp_path / "cost_by_size.png").read_bytes().startswith(b"\x89PNG")
    assert_one_line_error(run_cli("bench.py", "--profile", tmp_path / "none.pt"), "none.pt")


@pytest.mark.parametrize("method, setting", [("draft", "3"), ("lookahead", "5,3,5"), ("prompt-lookup", None),
                                             ("jacobi", None), ("medusa", "8"), ("eagle", "tree:8")])
def test_every_method_at_gpt2s_context_length(method, setting):
    """GPT-2's 1,024 positions: a 1,000-token prompt and 100 new tokens cross the slide, greedy."""
    target = tiny_model(seed=0, block_size=1024, vocab_size=96, n_embd=16)
    draft = tiny_model(seed=1, block_size=1024, vocab_size=96, n_embd=16, n_layer=1)
    heads = MedusaHeads(target, MedusaConfig(n_heads=2)).double()
    with torch.no_grad():  # trained heads are not the identity; random ones will do
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompt = torch.randint(96, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    prompt[-60:] = prompt[:60]  # a repeat for prompt lookup to find
    torch.manual_seed(0)  # the EAGLE head's random weights: a few of its guesses hold
    proposer = make_proposer(method, setting, target, draft, (heads, dict(tree=[[0]], accuracies=[[0.5] * 10] * 2)),
                             sizing="fixed", eagle_head=(EagleHead(target).double(), {}))
    plain, _ = generate(target, prompt, 100, Sampling())
    ours, stats = generate(target, prompt, 100, Sampling(), proposer=proposer)
    assert ours == plain and stats.accepted > 0  # and it did speculate: some guesses were verified and held


def test_gpt2s_own_vocabulary_agrees_with_tiktoken(tmp_path, monkeypatch):
    """Where tiktoken's GPT-2 encoding is cached on the machine: GPT-2's vocab.json and merges.txt,
    written back out of it, give a tokenizer that splits text as tiktoken's does."""
    import tiktoken
    import tiktoken.load

    def offline(blobpath):
        raise ConnectionError("the tests do not download")
    monkeypatch.setattr(tiktoken.load, "read_file", offline)  # only the cache may answer
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception:
        pytest.skip("needs the network: tiktoken's GPT-2 encoding is not cached on this machine")
    ranks = encoding._mergeable_ranks
    alphabet = gpt2_byte_alphabet()

    def spell(token):
        return "".join(alphabet[b] for b in token)

    def halves(token):
        """The two tokens BPE joins into `token`: merge with the ranks below its own until two are left."""
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            i = min(range(len(parts) - 1), key=lambda j: ranks.get(parts[j] + parts[j + 1], len(ranks)))
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts
    vocab = {spell(token): rank for token, rank in ranks.items()} | {"<|endoftext|>": encoding.eot_token}
    merges = [" ".join(map(spell, halves(token))) for token, _ in sorted(ranks.items(), key=lambda kv: kv[1])
              if len(token) > 1]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    ours = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert ours.vocab_size == encoding.n_vocab == 50257
    for line in SHAKESPEARE.read_text(encoding="utf-8").splitlines()[:300] + MIXED_TEXT:
        assert ours.encode(line) == encoding.encode_ordinary(line), line


def test_the_byte_alphabet_is_gpt2s():
    alphabet = gpt2_byte_alphabet()
    assert (alphabet[ord(" ")], alphabet[ord("\n")], alphabet[ord("A")]) == ("Ġ", "Ċ", "A")  # as in "Ġthe"
    assert len(set(alphabet)) == 256
