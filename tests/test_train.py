"""A tiny training run learns, saves atomically, survives an interrupted save and resumes."""
import pytest
import torch

import train
from cli import UserError
from model.checkpoint import load_checkpoint, load_model
from tests.conftest import SHAKESPEARE

TINY = ["--data", str(SHAKESPEARE), "--preset", "tiny", "--vocab-size", "300", "--eval-iters", "2",
        "--log-interval", "10"]


def test_training_lowers_the_loss_and_writes_a_loadable_checkpoint(tiny_checkpoint):
    state = load_checkpoint(tiny_checkpoint / "target.pt")
    first, last = state["history"][0]["val_loss"], state["history"][-1]["val_loss"]
    assert state["iter"] == 30 and last < first < 6.0  # ln(300) = 5.7 is the loss of a uniform guess
    model, tokenizer, _ = load_model(tiny_checkpoint / "target.pt")
    assert tokenizer.vocab_size == model.config.vocab_size == 300


def test_resume_continues_where_it_stopped(tmp_path):
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "10", "--eval-interval", "10"])
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "20", "--eval-interval", "10", "--resume"])
    state = load_checkpoint(tmp_path / "target.pt")
    assert state["iter"] == 20 and [h["iter"] for h in state["history"]] == [10, 20]


def test_refuses_to_overwrite_a_run_without_resume(tmp_path):
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "5", "--eval-interval", "5"])
    with pytest.raises(UserError, match="--resume"):
        train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "5"])


def test_an_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "5", "--eval-interval", "5"])
    before = load_checkpoint(tmp_path / "target.pt")["iter"]
    real_save = torch.save

    def save_then_die(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(100)  # a half-written file, as after a crash mid-save
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "10", "--eval-interval", "5", "--resume"])
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "target.pt")["iter"] == before


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real_cross_entropy = torch.nn.functional.cross_entropy
    calls = []

    def nan_after_a_while(*args, **kwargs):
        calls.append(1)
        loss = real_cross_entropy(*args, **kwargs)
        return loss * float("nan") if len(calls) > 12 else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", nan_after_a_while)
    with pytest.raises(UserError, match="nan"):
        train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "20", "--eval-interval", "5",
                           "--eval-iters", "1"])
    assert load_checkpoint(tmp_path / "target.pt")["iter"] == 10
