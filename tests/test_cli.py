"""The command-line tools: they work, and bad input gets one clear line and a non-zero exit."""
import argparse
import gc
import json
import os
import sys

import pytest
import torch

import cli
import generate
import kernels
from model.compiled import StaticGPT
from tests.conftest import SHAKESPEARE, run_cli, run_process, tiny_model


def assert_one_line_error(result, *words):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def generate_compared(*args):
    """generate.py ARGS --compare --json, greedy in float64 and speculating every round
    (--no-fallback: a method the measured fallback holds plain writes plain decoding's text, whatever
    the method would). Asserts that candidates were proposed and some accepted, and that the text is
    plain decoding's; returns the JSON."""
    r = run_cli("generate.py", *args, "--compare", "--no-fallback", "--temperature", "0", "--dtype", "float64",
                "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["alpha"], "no candidate proposed or none accepted: plain decoding's text proves nothing"
    assert out["held"] == 0 and out["text"] == out["plain_text"] and out["identical_to_plain"] is True
    return out


def test_generate_streams_and_reports(tiny_checkpoint):
    r = run_cli("generate.py", "--out-dir", tiny_checkpoint, "--prompt", "ROMEO:", "--max-new-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ROMEO:")
    assert "20 new tokens" in r.stderr and "tokens/s" in r.stderr


def test_generate_json_past_the_context_window(tiny_checkpoint):
    # the tiny preset's context is 64 tokens; 150 new tokens need re-prefills
    r = run_cli("generate.py", "--out-dir", tiny_checkpoint, "--prompt", "", "--max-new-tokens", "150",
                "--temperature", "0", "--dtype", "float64", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["new_tokens"] == 150 and out["tau"] == 1.0 and out["alpha"] is None and out["spec"] == "none"
    assert out["dtype"] == "float64"
    assert out["prompt"] == "\n" and isinstance(out["text"], str)


@pytest.mark.parametrize("sizing", ["auto", "fixed"])
def test_lookahead_sizings_say_what_plain_says(tiny_checkpoint, sizing):
    generate_compared("--out-dir", tiny_checkpoint, "--spec", "lookahead", "--sizing", sizing, "--max-new-tokens", "40")


def test_bench_table_and_profile(tiny_checkpoint):
    r = run_cli("bench.py", "--out-dir", tiny_checkpoint, "--num-prompts", "2", "--max-new-tokens", "16",
                "--dtype", "float64", "--no-fallback", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    rows = result["rows"]
    assert rows[0]["method"] == "none" and rows[0]["speedup"] == 1.0 and rows[0]["tau"] == 1.0
    assert rows[-1]["method"] == "none again (noise)" and rows[-1]["tau"] == 1.0
    assert len(rows) > 20 and all(row["identical_to_plain"] == 1.0 for row in rows)  # every method, greedy
    assert all(row["held"] == 0 for row in rows)  # --no-fallback: every round speculated
    # and each method proposed candidates and had some accepted, or its identity would show nothing;
    # not plain decoding, nor the sized rows, which may find that nothing pays on this machine
    assert all(row["alpha"] for row in rows if not any(word in row["method"] for word in ("none", "auto", "sized")))
    assert {"eagle tree:auto", "medusa chain", "draft 4"} <= {row["method"] for row in rows}
    # EAGLE's head forward is timed at each width its rows expand: a chain's one node, a tree's four
    assert set(result["c_eagle"]) == {"1", "4"} and all(c > 0 for c in result["c_eagle"].values())
    assert len(rows[1]["acceptance_by_depth"]) == 4
    r = run_cli("bench.py", "--out-dir", tiny_checkpoint, "--profile", "--json")
    assert r.returncode == 0, r.stderr
    curves = json.loads(r.stdout)["profile"]
    assert len(curves) == 3 and all(len(c["r"]) == 32 and c["r"][0] == 1.0 for c in curves.values())  # n up to half the 64-token context


def test_bench_prompt_lookup_rows(tiny_checkpoint):
    r = run_cli("bench.py", "--out-dir", tiny_checkpoint, "--methods", "prompt-lookup", "--prompt-lookup", "3,5,2",
                "1,4,8", "--num-prompts", "2", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert [row["method"] for row in result["rows"]] == ["none", "prompt-lookup 3,5,2", "prompt-lookup 1,4,8",
                                                         "none again (noise)"]
    # the measured fallback is on by default: a share of each method's rounds, none of plain decoding's
    assert all(0 <= row["held"] <= 1 for row in result["rows"]) and result["rows"][0]["held"] == 0
    assert result["command"].startswith("python bench.py --out-dir ") and result["command"].endswith("--json")


def test_bench_plots(tiny_checkpoint, tmp_path):
    r = run_cli("bench.py", "--out-dir", tiny_checkpoint, "--methods", "draft,jacobi", "--k", "2", "--jacobi", "3",
                "--num-prompts", "1", "--max-new-tokens", "8", "--plot", tmp_path / "plots")
    assert r.returncode == 0, r.stderr
    for name in ("cost_curve.png", "speedup.png"):
        assert (tmp_path / "plots" / name).read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("args,words", [
    (["--lookahead", "5,3"], ["--lookahead", "three"]),
    (["--lookahead", "5,1,5"], ["N must be at least 2"]),
    (["--prompt-lookup", "0,5,2"], ["--prompt-lookup", "1 to 64"]),
    (["--methods", "draft", "--k", "2", "17"], ["--k", "17"]),
    (["--methods", "medusa", "--medusa-tree", "bushy"], ["--medusa-tree", "saved"]),
    (["--methods", "eagle", "--eagle", "tree:8", "bush:3"], ["--eagle", "chain:K"]),
    (["--methods", "warp"], ["unknown method"]),
    (["--num-prompts", "0"], ["--num-prompts"]),
    (["--batch-sizes", "0", "4"], ["--batch-sizes"]),
])
def test_bench_bad_input(tiny_checkpoint, args, words):
    assert_one_line_error(run_cli("bench.py", "--out-dir", tiny_checkpoint, *args), *words)


@pytest.mark.parametrize("args,words", [
    (["--prompt", "x" * 2000], ["longer than the model's context"]),
    (["--max-new-tokens", "-5"], ["--max-new-tokens"]),
    (["--max-new-tokens", "10000000"], ["--max-new-tokens"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--top-p", "1.5"], ["--top-p"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--top-k", "0"], ["--top-k"]),
    (["--spec", "nonsense"], ["--spec", "none"]),
    (["--device", "cuda"], ["CUDA"]),
    (["--prompt-file", "/no/such/file"], ["does not exist"]),
    (["--spec", "jacobi", "--jacobi", "0"], ["--jacobi", "1 to 64"]),
    (["--spec", "lookahead", "--lookahead", "2,1,2"], ["N must be at least 2"]),
    (["--spec", "prompt-lookup", "--prompt-lookup", "3,5"], ["--prompt-lookup", "three"]),
    (["--spec", "medusa", "--medusa-tree", "300"], ["--medusa-tree", "256"]),
    (["--spec", "eagle", "--eagle", "tree:100"], ["--eagle", "tree:N", "64"]),
    (["--spec", "eagle", "--eagle", "chain"], ["--eagle", "chain:K"]),
    (["--batch-size", "4"], ["--batch-size", "--prompt-file"]),
])
def test_generate_bad_input(tiny_checkpoint, args, words):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tiny_checkpoint, *args), *words)


def test_generate_without_or_with_a_foreign_checkpoint(tmp_path):
    # in a process of its own once: what the shell sees
    assert_one_line_error(run_process("generate.py", "--out-dir", tmp_path), "no target checkpoint", "python train.py")
    (tmp_path / "target.pt").write_bytes(b"not a checkpoint")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tmp_path), "not a SpecGPT checkpoint")
    torch.save({"state_dict": {}}, tmp_path / "target.pt")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tmp_path), "not a SpecGPT checkpoint")


def test_bench_batch_sizes(tiny_checkpoint, tmp_path):
    r = run_cli("bench.py", "--out-dir", tiny_checkpoint, "--batch-sizes", "1", "3", "--max-new-tokens", "8",
                "--dtype", "float64", "--no-fallback", "--json", "--plot", tmp_path / "plots")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["num_prompts"] == 3  # the largest batch size
    rows = result["rows"]
    assert {(row["method"], row["batch_size"]) for row in rows} >= {
        ("none", 1), ("none", 3), ("draft auto", 3), ("eagle tree:auto", 3), ("lookahead 2,2,2 sized (default)", 3)}
    assert all(row["identical_to_plain"] == 1.0 and row["held"] == 0 for row in rows)  # every round speculated
    assert (tmp_path / "plots" / "batch.png").read_bytes().startswith(b"\x89PNG")


def test_generate_keeps_its_fallback_averages_and_starts_from_them(tiny_checkpoint, tmp_path):
    for name in ("target.pt", "draft.pt"):
        (tmp_path / name).write_bytes((tiny_checkpoint / name).read_bytes())
    args = ("generate.py", "--out-dir", tmp_path, "--spec", "draft", "--temperature", "0", "--max-new-tokens", "30",
            "--json")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    stored = json.loads((tmp_path / "costs.json").read_text())
    (machine, costs), = stored.items()
    kept = costs["the fallback's averages for draft 4 in batches of 1"]
    assert set(kept) == {"speculating", "plain", "probe budget"}
    kept.update(speculating=[0.01, 1.0], plain=[1.0, 1e-3])  # speculating lost by far
    (tmp_path / "costs.json").write_text(json.dumps(stored))
    second = json.loads(run_cli(*args).stdout)
    assert second["held"] == 1.0 and second["text"] == json.loads(first.stdout)["text"]


def test_a_new_batch_size_holds_where_a_smaller_one_held(tiny_checkpoint, tmp_path):
    for name in ("target.pt", "draft.pt"):
        (tmp_path / name).write_bytes((tiny_checkpoint / name).read_bytes())
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(p) for p in ["ROMEO:", "To be", "O"]))
    args = ("generate.py", "--out-dir", tmp_path, "--spec", "draft", "--temperature", "0", "--max-new-tokens", "20",
            "--json")
    assert run_cli(*args).returncode == 0  # keeps averages for batches of 1
    stored = json.loads((tmp_path / "costs.json").read_text())
    (machine, costs), = stored.items()
    costs["the fallback's averages for draft 4 in batches of 1"] = dict(speculating=[0.01, 1.0], plain=[1.0, 1e-3],
                                                                       **{"probe budget": 5.0})  # lost by far
    (tmp_path / "costs.json").write_text(json.dumps(stored))
    r = run_cli(*args, "--prompt-file", tmp_path / "p.jsonl", "--batch-size", "3")
    assert r.returncode == 0, r.stderr
    assert all(json.loads(line)["held"] == 1.0 for line in r.stdout.splitlines())  # no trial rounds, no probes
    kept = json.loads((tmp_path / "costs.json").read_text())[machine]
    assert kept["the fallback's averages for draft 4 in batches of 3"]["probe budget"] < 1.0  # not batches of 1's 5 s


def test_a_new_batch_size_takes_nothing_from_a_smaller_one_that_speculated(tiny_checkpoint, tmp_path):
    for name in ("target.pt", "draft.pt"):
        (tmp_path / name).write_bytes((tiny_checkpoint / name).read_bytes())
    args = generate.parse_args(["--out-dir", str(tmp_path), "--spec", "draft"])
    costs = cli.stored_costs(args, "cpu", torch.float32)
    averages = "the fallback's averages for draft 4 in batches of {}".format
    for speculating, taken in (([0.01, 1.0], True), ([2.0, 1e-3], False)):  # lost by far; paid 2x
        costs.put(averages(1), dict(speculating=speculating, plain=[1.0, 1e-3], **{"probe budget": 5.0}))
        costs.put(averages(3), None)
        with cli.kept_fallback(args, "draft 4", 3, "cpu", torch.float32) as fallback:
            if taken:  # less their probe budget, a speculative round's extra seconds for 3 rows, not 1
                assert fallback.gained[True] == 0.01 and fallback.probe_budget == 0.0
                assert fallback.seconds[True] == pytest.approx(1e-3 + (1.0 - 1e-3) * 3)
            else:  # nothing: both modes are tried first
                assert fallback.measured == {True: 0, False: 0}


def test_generate_batches_of_prompts_say_what_each_prompt_says_alone(tiny_checkpoint, tmp_path):
    prompts = ["ROMEO:", "To be", "", "And so\nthe king", "O"]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(p) for p in prompts[:3]) + "\n"
                                      + "\n".join(json.dumps({"prompt": p}) for p in prompts[3:]))
    common = ["--out-dir", tiny_checkpoint, "--dtype", "float64", "--temperature", "0", "--max-new-tokens", "30"]
    r = run_cli("generate.py", *common, "--prompt-file", tmp_path / "p.jsonl", "--batch-size", "2",
                "--spec", "draft", "--compare", "--no-fallback", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == ["ROMEO:", "To be", "\n", "And so\nthe king", "O"]
    assert {(row["dtype"], row["compiled"]) for row in rows} == {("float64", False)}
    # every row proposed and some accepted: else its text would be plain decoding's whatever the batch did
    assert all(row["alpha"] is not None and row["held"] == 0 for row in rows) and any(row["alpha"] for row in rows)
    assert all(row["text"] == row["plain_text"] and row["identical_to_plain"] for row in rows)
    assert "identical to plain: 5 of 5" in r.stderr
    alone = run_cli("generate.py", *common, "--prompt", "To be", "--json")
    assert json.loads(alone.stdout)["text"] == rows[1]["text"]
    (tmp_path / "bad.jsonl").write_text('"fine"\n{"text": 3}\n')
    assert_one_line_error(run_cli("generate.py", *common, "--prompt-file", tmp_path / "bad.jsonl", "--batch-size", "2"),
                          "line 2")


def test_non_utf8_prompt_file(tiny_checkpoint, tmp_path):
    (tmp_path / "prompt.txt").write_bytes(b"\xff\xfe caf\xe9")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tiny_checkpoint, "--prompt-file",
                                  tmp_path / "prompt.txt"), "not UTF-8")


def test_train_bad_input(tmp_path):
    def train(*args):
        return run_cli("train.py", "--out-dir", tmp_path / "out", "--max-iters", "1", *args)

    missing = run_process("train.py", "--out-dir", tmp_path / "out", "--data", tmp_path / "missing.txt")
    assert_one_line_error(missing, "does not exist")
    (tmp_path / "latin1.txt").write_bytes("Roméo".encode("latin-1") * 100)
    assert_one_line_error(train("--data", tmp_path / "latin1.txt"), "not UTF-8")
    (tmp_path / "short.txt").write_text("To be or not to be.")
    assert_one_line_error(train("--data", tmp_path / "short.txt", "--vocab-size", "256"), "too short")
    assert_one_line_error(train("--data", SHAKESPEARE, "--preset", "huge"), "unknown preset", "tiny")
    assert_one_line_error(train("--data", SHAKESPEARE, "--patience", "-1"), "--patience")
    if not torch.cuda.is_available():
        assert_one_line_error(train("--data", SHAKESPEARE, "--device", "cuda"), "CUDA")
    assert not (tmp_path / "out" / "target.pt").exists()


def test_generate_draft_compare_is_identical_to_plain(tiny_checkpoint):
    out = generate_compared("--out-dir", tiny_checkpoint, "--spec", "draft", "--k", "3", "--max-new-tokens", "100")
    assert out["spec"] == "draft" and out["draft_forwards"] > 0 and out["tau"] > 1


def test_generate_draft_bad_input(tiny_checkpoint, tmp_path):
    assert_one_line_error(run_cli("generate.py", "--out-dir", tiny_checkpoint, "--spec", "draft", "--k", "0"), "--k")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tiny_checkpoint, "--spec", "draft", "--k", "many"),
                          "--k")
    (tmp_path / "target.pt").write_bytes((tiny_checkpoint / "target.pt").read_bytes())
    assert_one_line_error(run_cli("generate.py", "--out-dir", tmp_path, "--spec", "draft"), "--what draft")
    # a draft trained with another tokenizer must be refused
    state = torch.load(tiny_checkpoint / "draft.pt", weights_only=True)
    state["tokenizer"] = {"kind": "bpe", "merges": state["tokenizer"]["merges"][:-1]}
    torch.save(state, tmp_path / "draft.pt")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tmp_path, "--spec", "draft"), "another tokenizer")


@pytest.mark.skipif(sys.platform != "linux" and not kernels.triton_installed(),
                    reason="triton has wheels for Linux only (requirements.txt installs it there)")
def test_generate_with_the_triton_kernel_says_what_the_reference_says(tiny_checkpoint):
    texts = []
    for attn in ("torch", "triton"):  # triton runs under its interpreter here (conftest.py)
        r = run_cli("generate.py", "--out-dir", tiny_checkpoint, "--attn", attn, "--spec", "draft", "--k", "3",
                    "--temperature", "0", "--max-new-tokens", "12", "--json")
        assert r.returncode == 0, r.stderr
        texts.append(json.loads(r.stdout)["text"])
    assert texts[0] == texts[1]


def test_attn_triton_without_cuda_or_interpreter(tiny_checkpoint):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = run_process("generate.py", "--out-dir", tiny_checkpoint, "--attn", "triton", env=env)
    assert_one_line_error(r, "--attn triton")
    r = run_cli("bench.py", "--out-dir", tiny_checkpoint, "--attn", "triton", "--dtype", "float64")
    assert_one_line_error(r, "float64")


@pytest.mark.parametrize("tree", [["--medusa-tree", "chain"], [], ["--medusa-tree", "8"]])
def test_generate_medusa_compare_is_identical_to_plain(tiny_checkpoint, tree):
    out = generate_compared("--out-dir", tiny_checkpoint, "--spec", "medusa", *tree, "--max-new-tokens", "80")
    assert out["lossy"] is False and out["draft_forwards"] > 0


def test_generate_medusa_typical_is_labelled_lossy(tiny_checkpoint):
    r = run_cli("generate.py", "--out-dir", tiny_checkpoint, "--spec", "medusa", "--typical",
                "--max-new-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert "LOSSY" in r.stderr


def test_medusa_heads_of_another_target_are_refused(tiny_checkpoint, tmp_path):
    (tmp_path / "medusa.pt").write_bytes((tiny_checkpoint / "medusa.pt").read_bytes())
    state = torch.load(tiny_checkpoint / "target.pt", weights_only=True)
    state["model"]["transformer.ln_f.bias"] += 1.0  # another target
    torch.save(state, tmp_path / "target.pt")
    r = run_cli("generate.py", "--out-dir", tmp_path, "--spec", "medusa")
    assert_one_line_error(r, "another target", "python train.py --what medusa")
    (tmp_path / "medusa.pt").unlink()
    assert_one_line_error(run_cli("generate.py", "--out-dir", tmp_path, "--spec", "medusa"), "--what medusa")


def test_generate_eagle_compare_is_identical_to_plain(tiny_checkpoint):
    # a tree of fixed size: the default, sized from this machine's timings, may sit out most rounds
    out = generate_compared("--out-dir", tiny_checkpoint, "--spec", "eagle", "--eagle", "tree:8",
                            "--max-new-tokens", "80")
    assert out["lossy"] is False and out["draft_forwards"] > 0


def test_an_eagle_head_of_another_target_is_refused(tiny_checkpoint, tmp_path):
    (tmp_path / "eagle.pt").write_bytes((tiny_checkpoint / "eagle.pt").read_bytes())
    state = torch.load(tiny_checkpoint / "target.pt", weights_only=True)
    state["model"]["transformer.ln_f.bias"] += 1.0  # another target
    torch.save(state, tmp_path / "target.pt")
    assert_one_line_error(run_cli("generate.py", "--out-dir", tmp_path, "--spec", "eagle"),
                          "another target", "python train.py --what eagle")


def test_generate_compiled_says_what_eager_says_and_compiles_once(tiny_checkpoint):
    # passes of several lengths through one program: prompt lookup of one token verifies a pass of 2
    # where the last token came before and takes a decode step of 1 where not, as --compare's plain
    # decoding does after the prompt's one-token prefill
    args = ("generate.py", "--out-dir", tiny_checkpoint, "--prompt", "A", "--spec", "prompt-lookup",
            "--prompt-lookup", "1,1,1", "--compare", "--no-fallback", "--max-new-tokens", "16", "--temperature", "0",
            "--json")
    eager = run_cli(*args)
    # --compile always: whether compiling pays is not this test's business; the second run reads the disk
    first, second = (run_process(*args, "--compile", "always", timeout=300) for _ in range(2))
    assert eager.returncode == first.returncode == second.returncode == 0, first.stderr + second.stderr
    runs = [json.loads(r.stdout) for r in (eager, first, second)]
    assert all(run["alpha"] for run in runs)  # guesses were verified, and some held
    assert len({(run["text"], run["plain_text"]) for run in runs}) == 1
    assert first.stderr.count("compiling target.pt's passes") == 1
    assert "compiling" not in second.stderr


def test_a_command_freezes_what_it_has_loaded(tiny_checkpoint):
    """So that no garbage collection while it decodes scans the loaded models and torch again."""
    gc.unfreeze()
    try:
        cli.setup(generate.parse_args(["--out-dir", str(tiny_checkpoint)]))
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def timed_steps(monkeypatch, seconds):
    """Decode steps that take seconds[dtype]: the list of dtypes that cli.cast_to_auto_dtype timed a step in."""
    timed = []

    def forward_seconds(model, n, prefix):
        timed.append(model.lm_head.weight.dtype)
        return seconds[model.lm_head.weight.dtype]
    monkeypatch.setattr(cli, "forward_seconds", forward_seconds)
    return timed


def flags(out_dir):
    return argparse.Namespace(out_dir=str(out_dir), target=None, draft=None, attn="auto", compile=False)


@pytest.mark.parametrize("float32, bfloat16, chosen", [
    (2e-3, 1e-3, torch.bfloat16),
    (1e-3, 2e-3, torch.float32),
    (1e-3, 0.95e-3, torch.float32),  # barely faster does not pay for texts that change
])
def test_dtype_auto_takes_the_dtype_measured_faster_once(monkeypatch, capsys, tmp_path, float32, bfloat16, chosen):
    timed = timed_steps(monkeypatch, {torch.float32: float32, torch.bfloat16: bfloat16})
    model = tiny_model(dtype=torch.float32)
    weight = model.lm_head.weight.detach().clone()
    assert cli.cast_to_auto_dtype(flags(tmp_path), model, "cpu") == chosen
    assert model.lm_head.weight.dtype == chosen and set(timed) == {torch.float32, torch.bfloat16}
    if chosen == torch.float32:  # bfloat16 was timed on a copy: float32's bits are intact
        assert torch.equal(model.lm_head.weight, weight)
    measured = len(timed)
    assert cli.cast_to_auto_dtype(flags(tmp_path), tiny_model(dtype=torch.float32), "cpu") == chosen
    assert len(timed) == measured  # read from the costs file, not measured again
    assert "a decode step by dtype" in (tmp_path / "costs.json").read_text()
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == lines[-2] and lines[-1].startswith(f"dtype auto: {cli.dtype_name(chosen)} (a decode step here")


def test_dtype_auto_measures_on_every_cpu_and_takes_bfloat16_on_cuda_unmeasured(monkeypatch, capsys, tmp_path):
    """A CPU without native bfloat16 may still run it faster (a small model on a Zen 1 EPYC did)."""
    timed = timed_steps(monkeypatch, {torch.float32: 2e-3, torch.bfloat16: 1e-3})
    for flag in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, flag, lambda: False)
    model = tiny_model(dtype=torch.float32)
    assert cli.cast_to_auto_dtype(flags(tmp_path), model, "cpu") == torch.bfloat16 == model.lm_head.weight.dtype
    assert set(timed) == {torch.float32, torch.bfloat16}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cuda, model, measured = tmp_path / "cuda", tiny_model(dtype=torch.float32), len(timed)
    assert cli.cast_to_auto_dtype(flags(cuda), model, "cuda") == torch.bfloat16 == model.lm_head.weight.dtype
    assert len(timed) == measured and not cuda.exists()
    cpu_line, cuda_line = capsys.readouterr().err.splitlines()[-2:]
    assert cpu_line.startswith("dtype auto: bfloat16 (a decode step here: float32 2.00 ms, bfloat16 1.00 ms")
    assert cuda_line == "dtype auto: bfloat16 (on CUDA: not measured)"


@pytest.mark.parametrize("eager, compiled, pays", [(2e-3, 1e-3, True), (1e-3, 2e-3, False), (1e-3, 0.95e-3, False)])
def test_compile_runs_compiled_only_where_a_step_measured_faster_once(monkeypatch, capsys, tmp_path, eager, compiled,
                                                                      pays):
    timed = []

    def forward_seconds(model, n, prefix):
        timed.append(type(model).__name__)
        return compiled if isinstance(model, StaticGPT) else eager
    monkeypatch.setattr(cli, "forward_seconds", forward_seconds)
    monkeypatch.setattr(StaticGPT, "prepare", lambda self: None)  # nothing is compiled here
    (tmp_path / "target.pt").write_bytes(b"a checkpoint")
    args = flags(tmp_path)
    args.compile = "auto"
    model = tiny_model(dtype=torch.float32)
    chosen = cli.compiled_where_it_pays(model, str(tmp_path / "target.pt"), args, "cpu", torch.float32)
    assert isinstance(chosen, StaticGPT) == pays and (chosen.model if pays else chosen) is model
    assert set(timed) == {"GPT", "StaticGPT"}
    measured = len(timed)
    cli.compiled_where_it_pays(model, str(tmp_path / "target.pt"), args, "cpu", torch.float32)
    assert len(timed) == measured  # read from the costs file, not measured again
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == lines[-2] and lines[-1].startswith("compile target.pt: " + ("yes" if pays else "no"))
