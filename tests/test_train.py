"""A tiny training run learns, saves atomically, survives an interrupted save and resumes; split
into micro-batches or among torchrun's processes, it takes the same steps."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from cli import UserError
from data import TEACHER_TOP, TargetOutputs
from optim import Muon, make_optimizer, orthogonalise
from model.checkpoint import load_checkpoint, load_model
from tests.conftest import ROOT, SHAKESPEARE, run_cli
from tests.test_cli import assert_one_line_error

TINY = ["--data", str(SHAKESPEARE), "--preset", "tiny", "--vocab-size", "300", "--eval-iters", "2",
        "--log-interval", "10"]


def test_training_lowers_the_loss_and_writes_a_loadable_checkpoint(tiny_checkpoint):
    state = load_checkpoint(tiny_checkpoint / "target.pt")
    first, last = state["history"][0]["val_loss"], state["history"][-1]["val_loss"]
    assert state["iter"] == 30 and last < first < 6.0  # ln(300) = 5.7 is the loss of a uniform guess
    model, tokenizer, _ = load_model(tiny_checkpoint / "target.pt")
    assert tokenizer.vocab_size == model.config.vocab_size == 300


def test_resume_continues_where_it_stopped(tmp_path, capsys):
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "10", "--eval-interval", "10"])
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "20", "--eval-interval", "10", "--resume"])
    state = load_checkpoint(tmp_path / "target.pt")
    assert state["iter"] == 20 and [h["iter"] for h in state["history"]] == [10, 20]
    capsys.readouterr()
    train.main(TINY + ["--out-dir", str(tmp_path), "--what", "target", "--max-iters", "20", "--resume"])
    out = capsys.readouterr().out  # a finished run resumed: nothing trained, nothing said to be saved
    assert f"{tmp_path / 'target.pt'} is already at iteration 20" in out and "saved" not in out


def test_resume_with_nothing_to_resume_is_refused_in_one_line(tmp_path):
    r = run_cli("train.py", *TINY, "--out-dir", tmp_path / "empty", "--what", "draft", "--resume")
    assert r.returncode == 2 and not (tmp_path / "empty").exists()
    assert_one_line_error(r, "--resume", "no checkpoint of draft")


def test_resume_says_which_phases_start_afresh(tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path, dirs_exist_ok=True)
    for kind in ("draft", "eagle"):
        (tmp_path / f"{kind}.pt").unlink()
    r = run_cli("train.py", *TINY, "--out-dir", tmp_path, "--max-iters", "2", "--eval-interval", "2", "--resume")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "resuming target, medusa; draft, eagle start afresh"
    assert load_checkpoint(tmp_path / "draft.pt", "draft")["iter"] == 2 and (tmp_path / "eagle.pt").exists()


def test_a_fresh_run_first_says_what_it_will_train_and_for_about_how_long(tmp_path, capsys):
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "4", "--eval-interval", "4"])
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert re.fullmatch(r"training the target \(0\.\d\dM parameters, 4 iterations\), the draft \(.*\), "
                        r"the Medusa heads \(.*\), the EAGLE head \(.*\): about \d+m\d\ds here .*", first)
    # one pass of the target for the draft's distributions and both heads' features
    assert out.count("over the train split, computed once") == 1
    assert "the target's next-token distributions and features over the train split, computed once" in out
    train.main(TINY + ["--out-dir", str(tmp_path), "--max-iters", "6", "--eval-interval", "2", "--resume"])
    assert "about" not in capsys.readouterr().out  # a resumed run shows each phase's ETA instead


def test_the_phases_of_a_run_share_one_pass_over_the_targets_outputs(tmp_path, tiny_checkpoint, capsys):
    # the fixture's whole run computed them in its draft's phase; EAGLE trained alone computes its own
    train.main(TINY + ["--what", "eagle", "--target", str(tiny_checkpoint / "target.pt"), "--out-dir", str(tmp_path),
                       "--max-iters", "30", "--eval-interval", "15"])
    assert capsys.readouterr().out.count("the target's features over the train split, computed once") == 1
    alone, shared = (load_checkpoint(path / "eagle.pt", kind="eagle")["model"] for path in (tmp_path, tiny_checkpoint))
    assert all(torch.equal(alone[name], shared[name]) for name in shared)


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


def test_training_stops_where_val_stops_improving_and_keeps_the_best(tmp_path, monkeypatch):
    """With a patience of 2, two evaluations without a lower val loss end the run; the checkpoint holds
    the best evaluation's weights (its iteration), and --resume goes on from there."""
    scripted = iter([3.0, 2.5, 2.6, 2.5, 2.7, 2.2, 2.1])
    monkeypatch.setattr(train, "estimate_loss", lambda *args: next(scripted))
    train.main(TINY + ["--what", "target", "--out-dir", str(tmp_path), "--max-iters", "20", "--eval-interval", "2",
                       "--patience", "2"])
    state = load_checkpoint(tmp_path / "target.pt")  # stopped after iteration 8
    assert state["iter"] == 4 and [h["val_loss"] for h in state["history"]] == [3.0, 2.5]
    adam = state["optimizer"]["optimizers"][1]  # Muon's matrices, then AdamW's other parameters
    assert int(adam["state"][0]["step"]) == 4  # the weights are iteration 4's too
    train.main(TINY + ["--what", "target", "--out-dir", str(tmp_path), "--max-iters", "10", "--eval-interval", "2",
                       "--patience", "3", "--resume"])  # 2.7 at 6, then lower again at 8 and 10
    state = load_checkpoint(tmp_path / "target.pt")
    assert state["iter"] == 10 and [h["val_loss"] for h in state["history"]] == [3.0, 2.5, 2.7, 2.2, 2.1]


def val_losses(out_dir, kind="target"):
    return [h["val_loss"] for h in load_checkpoint(out_dir / f"{kind}.pt", kind)["history"]]


def test_micro_batches_take_the_steps_of_the_whole_batch(tmp_path):
    runs = {}
    for accum in (1, 4):
        out = tmp_path / str(accum)
        train.main(TINY + ["--what", "target", "--out-dir", str(out), "--max-iters", "20", "--eval-interval", "10",
                           "--grad-accum", str(accum)])
        runs[accum] = val_losses(out)
    assert runs[4] == pytest.approx(runs[1], abs=1e-5)
    with pytest.raises(UserError, match="does not split"):
        train.main(TINY + ["--what", "target", "--out-dir", str(tmp_path / "odd"), "--batch-size", "6", "--grad-accum", "4"])


def torchrun(out_dir, *args, script="train.py", env=None):
    """train.py (or `script`, which runs it) under torchrun in 2 CPU processes (gloo), started, not
    waited for; env: variables to set besides."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script,
               *TINY, "--out-dir", str(out_dir), *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


needs_torchrun = pytest.mark.skipif(not (sys.platform == "linux" and torch.distributed.is_gloo_available()),
                                    reason="torchrun with gloo on Linux")


@needs_torchrun
def test_two_processes_take_the_steps_of_one(tmp_path):
    run = torchrun(tmp_path / "ddp", "--what", "target", "--max-iters", "20", "--eval-interval", "10")
    log, _ = run.communicate(timeout=300)
    assert run.returncode == 0, log
    assert log.count("eval 20:") == 1  # only rank 0 speaks
    train.main(TINY + ["--what", "target", "--out-dir", str(tmp_path / "one"), "--max-iters", "20", "--eval-interval", "10"])
    assert val_losses(tmp_path / "ddp") == pytest.approx(val_losses(tmp_path / "one"), abs=1e-5)


@needs_torchrun
def test_two_processes_distil_the_draft_as_one_does(tmp_path, tiny_checkpoint):
    """Each process reads half of the target's distributions over the split; summed, they are the whole."""
    args = ["--what", "draft", "--target", str(tiny_checkpoint / "target.pt"), "--max-iters", "4",
            "--eval-interval", "2"]
    run = torchrun(tmp_path / "ddp", *args)
    log, _ = run.communicate(timeout=300)
    assert run.returncode == 0, log
    train.main(TINY + ["--out-dir", str(tmp_path / "one"), *args])
    assert val_losses(tmp_path / "ddp", "draft") == pytest.approx(val_losses(tmp_path / "one", "draft"), abs=1e-5)


def rank_pid(parent, rank):
    """The pid of the torchrun worker of `rank`: the child process of `parent` with RANK=rank, from /proc."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:  # the process has ended
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(entry)
    raise AssertionError(f"no worker of rank {rank} under {parent}")


@needs_torchrun
def test_a_rank_killed_mid_save_leaves_the_last_checkpoint_whole_and_it_resumes_in_one_process(tmp_path):
    """Rank 0, the one that writes, is killed halfway through writing its second checkpoint, that of
    iteration 20 (train_stalling_mid_save.py holds it there until the kill); iteration 10's stays."""
    stalled = tmp_path / "stalled"
    run = torchrun(tmp_path, "--what", "target", "--max-iters", "30", "--eval-interval", "10",
                   script="tests/train_stalling_mid_save.py", env={"STALLED_SAVE_MARK": str(stalled)})
    deadline = time.time() + 240
    while not stalled.exists() and time.time() < deadline and run.poll() is None:
        time.sleep(0.2)
    assert stalled.exists(), run.communicate(timeout=120)[0]  # the run ended without stalling: its log
    os.kill(rank_pid(run.pid, 0), signal.SIGKILL)
    log, _ = run.communicate(timeout=120)
    assert run.returncode != 0, log
    assert load_checkpoint(tmp_path / "target.pt")["iter"] == 10  # whole, and not replaced by the half
    train.main(TINY + ["--what", "target", "--out-dir", str(tmp_path), "--resume", "--max-iters", "20"])
    assert load_checkpoint(tmp_path / "target.pt")["iter"] == 20


def test_the_targets_outputs_are_computed_once_over_back_to_back_windows():
    from data import TokenData
    from tests.conftest import tiny_model
    teacher = tiny_model()  # vocabulary 64, context 32
    tokens = torch.randint(64, (101,), generator=torch.Generator().manual_seed(0))
    split = TokenData(tokens.numpy(), 200, "train")
    both = {"distributions", "features"}
    data = TargetOutputs(split, teacher, both, device="cpu", windows=3)

    # windows of the target's context start every 32 tokens, as random windows read them; the last
    # ends with the split, at 69, and keeps what the one before it did not reach
    for position, read_from in [(0, 0), (15, 0), (31, 0), (32, 32), (47, 32), (63, 32), (64, 64), (95, 64),
                                (96, 69), (100, 69)]:
        logits, hidden = teacher(tokens[None, read_from:position + 1], return_hidden=True)
        top, ids = torch.softmax(logits[0, -1], -1).topk(TEACHER_TOP)
        assert torch.equal(data.ids[position], ids.int())
        torch.testing.assert_close(data.probs[position].double(), top / top.sum(), atol=1e-3, rtol=0)
        torch.testing.assert_close(data.features[position], hidden[0, -1])
    x, positions = data.batch(4, 16, torch.Generator().manual_seed(1))
    assert torch.equal(x, tokens[positions]) and positions.shape == (4, 16)
    # a split that holds what is asked for is kept as it is; one that does not gets a pass of its own
    assert TargetOutputs.shared(data, teacher, {"features"}, "cpu") is data
    features = TargetOutputs.shared(split, teacher, {"features"}, "cpu")
    assert features.outputs == {"features"} and not hasattr(features, "ids")
    torch.testing.assert_close(features.features, data.features)  # windows grouped otherwise: rounding may differ
    # two processes' shares (each every other group of windows) sum to the whole
    shares = [TargetOutputs(split, teacher, both, device="cpu", windows=3, share=(k, 2)) for k in range(2)]
    for name in ("ids", "probs", "features"):
        assert torch.equal(getattr(shares[0], name) + getattr(shares[1], name), getattr(data, name))
    assert shares[0].ids.any() and shares[1].ids.any()


def test_orthogonalise_brings_every_singular_value_near_one():
    generator = torch.Generator().manual_seed(0)
    for shape in [(96, 32), (32, 32), (32, 128)]:
        update = torch.randn(shape, generator=generator) * 1e-3
        orthogonalised = orthogonalise(update)
        singular_values = torch.linalg.svdvals(orthogonalised)
        assert orthogonalised.shape == update.shape
        assert 0.65 < singular_values.min() and singular_values.max() < 1.25


def test_muon_takes_torch_muons_steps_up_to_its_bfloat16():
    """torch.optim.Muon with the AdamW-matched scale is the reference; it orthogonalises in bfloat16,
    two or three significant digits."""
    generator = torch.Generator().manual_seed(0)
    for shape in [(96, 32), (32, 128)]:
        start = torch.randn(shape, generator=generator, dtype=torch.float64)
        ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
        optimizers = [Muon([ours], lr=1e-2, weight_decay=0.1),
                      torch.optim.Muon([theirs], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")]
        for _ in range(3):
            grad = torch.randn(shape, generator=generator, dtype=torch.float64)
            for p, optimizer in zip((ours, theirs), optimizers):
                p.grad = grad.clone()
                optimizer.step()
        assert (ours - theirs).abs().max() < 0.03 * (theirs - start).abs().max()


def test_muon_moves_the_linear_layers_matrices_and_adamw_the_rest(tmp_path):
    from tests.conftest import tiny_model
    model = tiny_model()
    muon, adam = make_optimizer(model, dict(optimizer="muon", learning_rate=1e-3, weight_decay=0.1)).optimizers
    moved_by_muon = {id(p) for group in muon.param_groups for p in group["params"]}
    names = {id(p): name for name, p in model.named_parameters()}
    assert sorted(names[i] for i in moved_by_muon) == sorted(
        name for name, p in model.named_parameters() if name.startswith("transformer.h.") and p.dim() == 2)
    assert {id(p) for group in adam.param_groups for p in group["params"]}.isdisjoint(moved_by_muon)
    assert len(moved_by_muon) + sum(len(group["params"]) for group in adam.param_groups) == len(names)
    train.main(TINY + ["--what", "target", "--out-dir", str(tmp_path), "--max-iters", "4", "--eval-interval", "2",
                       "--optimizer", "adamw"])
    assert "optimizers" not in load_checkpoint(tmp_path / "target.pt")["optimizer"]
