"""Shared fixtures: tiny models (nanochat-style CPU tests) and a tiny trained checkpoint."""
import contextlib
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernel runs on the CPU under its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # pytest.ini runs a worker per core: one thread each, or
    # their thread pools fight over the cores and the suite runs slower than in one process
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import cli
import kernels
from model.gpt import GPT, GPTConfig
from model.kv_cache import KVCache

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "tests" / "data" / "shakespeare.txt"  # the first 60 KB of tiny Shakespeare


def tiny_model(seed=0, dtype=torch.float64, **overrides):
    """A randomly initialised tiny GPT in eval mode; float64 so that batched and step-by-step passes
    agree to ~1e-12 and an argmax never flips between them."""
    torch.manual_seed(seed)
    config = GPTConfig(**{**dict(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32), **overrides})
    model = GPT(config).to(dtype).eval()
    # random init gives near-uniform logits; larger weights make the tests' argmaxes and masks matter
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def target_context(tokens, block_size):
    """The tokens a target's cache must hold once a round has written `tokens`: every token but the
    newest, from where plain decoding's context window starts, computed one token at a time by the
    rule decode/window.py states (past the window, keep its last half), never read from the loop."""
    start = 0
    for length in range(1, len(tokens)):  # plain decoding checks before every token it adds
        if length - start > block_size:
            start = length - block_size // 2
    return tokens[start:-1]


@torch.no_grad()
def assert_matches_prefill(model, cache, tokens):
    """The committed part of `cache` equals what a fresh prefill of `tokens` would hold."""
    fresh = model.new_cache(scratch=0)
    if tokens:
        model(torch.tensor([tokens]), fresh)
        fresh.commit()
    assert cache.length == len(tokens)
    torch.testing.assert_close(cache.k[..., :cache.length, :], fresh.k[..., :fresh.length, :], rtol=0, atol=1e-10)
    torch.testing.assert_close(cache.v[..., :cache.length, :], fresh.v[..., :fresh.length, :], rtol=0, atol=1e-10)


def assert_holds_context(model, cache, tokens):
    """After a round that wrote `tokens`, `cache` is a fresh prefill of the target's context."""
    assert_matches_prefill(model, cache, target_context(tokens, model.config.block_size))


def cache_row(cache, b):
    """Batch row b of `cache` as a one-row cache over the same storage, to hold against a prefill."""
    row = KVCache(1, 1, 1, 1, 1)
    row.k, row.v, row.lengths = cache.k[:, b:b + 1], cache.v[:, b:b + 1], [cache.lengths[b]]
    return row


def run_cli(script, *args):
    """Run a command-line tool as `python script args` runs it (cli.run around its main), but in this
    process: a new interpreter spends 3-4 s importing torch on 2 cores, more than most of these
    tests' work. Returns a CompletedProcess with the exit status and what the tool printed."""
    module = importlib.import_module(script.removesuffix(".py"))
    stdout, stderr = io.StringIO(), io.StringIO()
    backend = kernels._backend
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            cli.run(lambda: module.main([str(a) for a in args]))
    except SystemExit as e:  # cli.run ends in sys.exit, as the shell would see it
        status = e.code if isinstance(e.code, int) else int(e.code is not None)  # None: 0, a message: 1
    finally:
        kernels.set_backend(backend)  # --attn sets the backend for the whole process
    return subprocess.CompletedProcess([script, *args], status, stdout.getvalue(), stderr.getvalue())


def run_process(*args, timeout=120, env=None):
    """Run `python args` in a process of its own, for what only a fresh process shows: the exit
    status as the shell sees it, the environment it starts with, a cache on disk read back."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """The out-dir of a 30-iteration tiny training run on the Shakespeare fixture."""
    import train
    out = tmp_path_factory.mktemp("tiny_ckpt")
    train.main(["--data", str(SHAKESPEARE), "--preset", "tiny", "--max-iters", "30", "--vocab-size", "300",
                "--out-dir", str(out), "--eval-interval", "15", "--eval-iters", "2", "--log-interval", "10"])
    return out
