"""Costs measured once per machine and reused: StoredCosts and the commands' costs.json."""
import json

import pytest

from decode.cost import StoredCosts, nondecreasing_fit
from tests.conftest import run_cli


def counting(value):
    calls = []

    def measure():
        calls.append(1)
        return value
    return measure, calls


def test_a_cost_is_measured_once_per_machine(tmp_path):
    path = str(tmp_path / "costs.json")
    measure, calls = counting([1.0, 1.4])
    assert StoredCosts(path, "cpu fp32").get("lookahead 2,2,2", measure) == [1.0, 1.4]
    assert StoredCosts(path, "cpu fp32").get("lookahead 2,2,2", measure) == [1.0, 1.4]
    assert len(calls) == 1
    StoredCosts(path, "cpu bf16").get("lookahead 2,2,2", measure)  # another machine: measured for it
    assert len(calls) == 2 and set(json.loads((tmp_path / "costs.json").read_text())) == {"cpu fp32", "cpu bf16"}
    StoredCosts(path, "cpu fp32").forget()
    StoredCosts(path, "cpu fp32").get("lookahead 2,2,2", measure)
    StoredCosts(path, "cpu bf16").get("lookahead 2,2,2", measure)  # forget dropped only its own machine
    assert len(calls) == 3


def test_a_broken_or_absent_store_means_measuring(tmp_path):
    (tmp_path / "costs.json").write_text("{not json")
    measure, calls = counting(0.25)
    assert StoredCosts(str(tmp_path / "costs.json"), "m").get("draft auto", measure) == 0.25
    assert StoredCosts(str(tmp_path / "costs.json"), "m").get("draft auto", measure) == 0.25
    assert len(calls) == 1  # the broken file was replaced by a good one
    for _ in range(2):
        StoredCosts().get("draft auto", measure)  # no file: measured every time
    assert len(calls) == 3


def test_generate_measures_the_machine_once_and_bench_profile_refreshes(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("target.pt", "draft.pt"):
        (out / name).write_bytes((tiny_checkpoint / name).read_bytes())
    lookahead = ["generate.py", "--out-dir", out, "--spec", "lookahead", "--max-new-tokens", "5", "--json"]
    first, second = run_cli(*lookahead), run_cli(*lookahead)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "measuring this machine's pass costs for lookahead 2,2,2" in first.stderr
    assert "measuring" not in second.stderr
    assert run_cli("bench.py", "--out-dir", out, "--profile", "--json").returncode == 0
    assert "measuring" in run_cli(*lookahead).stderr
    draft = ["generate.py", "--out-dir", out, "--spec", "draft", "--k", "auto", "--max-new-tokens", "5"]
    assert "for draft" in run_cli(*draft).stderr and "measuring" not in run_cli(*draft).stderr
    auto = ["generate.py", "--out-dir", out, "--dtype", "auto", "--max-new-tokens", "5", "--json"]
    first, second = run_cli(*auto), run_cli(*auto)
    dtype = json.loads(first.stdout)["dtype"]  # whichever ran faster here
    assert json.loads(second.stdout)["dtype"] == dtype and f"dtype auto: {dtype} (" in second.stderr
    assert "measuring" not in second.stderr


@pytest.mark.parametrize("medians, fitted", [
    ([1.0, 1.2, 1.5, 1.5, 2.0], [1.0, 1.2, 1.5, 1.5, 2.0]),        # already non-decreasing: kept
    ([1.0, 1.3, 2.9, 1.4, 1.5, 1.6], [1.0, 1.3, 1.85, 1.85, 1.85, 1.85]),  # a spike: spread, not carried to the end
    ([1.0, 1.4, 1.2, 1.5], [1.0, 1.3, 1.3, 1.5]),                  # a dip: averaged with the size before it
    ([1.1, 1.0], [1.05, 1.05]),
])
def test_the_cost_curve_is_fitted_non_decreasing(medians, fitted):
    assert nondecreasing_fit(medians) == pytest.approx(fitted)
