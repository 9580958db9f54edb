"""The speculation trace (decode/trace.py, generate.py --trace): its rounds say exactly what the
decoder did, for every method, greedy and sampled, held rounds included."""
import json
import os

import pytest
import torch

import trace_page
from decode.batch import generate_batch
from decode.sampling import Sampling
from decode.trace import Trace
from tests.conftest import run_cli
from tests.test_batch import METHODS, PROMPTS, TARGET, EveryOtherRound
from tests.test_cli import assert_one_line_error

SAMPLINGS = {"greedy": Sampling(), "sampled": Sampling(temperature=1.0, top_k=40)}


def traced(method, sampling, prompt, fallback=None, max_new_tokens=50):
    """(the new tokens, the trace as data) of one prompt decoded by the engine."""
    trace = Trace(sampling)
    (new,), (stats,) = generate_batch(TARGET, [prompt], max_new_tokens, sampling, torch.Generator().manual_seed(1),
                                      proposers=[METHODS[method]()], fallback=fallback,
                                      on_round=lambda row, outcome: trace.record(outcome))
    return new, trace.as_dict(stats, lambda t: f"<{t}>", method=method)


def check_rounds(data, new):
    """Every round is there; its accepted path and added tokens are the text, in order; verdicts agree
    with the path; returns the (accepted, rejected) counts."""
    assert data["summary"]["rounds"] == len(data["rounds"]) and data["summary"]["new_tokens"] == len(new)
    assert [token for r in data["rounds"] for token, _ in r["added"]] == new
    accepted = rejected = 0
    for r in data["rounds"]:
        nodes, path = r["candidates"], r["path"]
        assert [nodes[c]["parent"] for c in path] == [-1, *path][:len(path)]  # root down
        assert [nodes[c]["token"] for c in path] == [token for token, _ in r["added"][:len(path)]]
        end = path[-1] if path else -1
        corrected = any(node["parent"] == end for node in nodes)  # the path's end had children, all rejected
        assert [source for _, source in r["added"]] == ["draft"] * len(path) + [
            "target" if not nodes else "corrected" if corrected else "bonus"]
        assert {c for c, node in enumerate(nodes) if node["verdict"] == "accepted"} == set(path)
        for c, node in enumerate(nodes):
            if node["verdict"] is None:
                assert node["p"] is None
            elif node["verdict"] == "rejected":
                rejected += 1
                assert node["parent"] == -1 or node["parent"] in path  # judged only below an accepted node
        accepted += len(path)
        if r["held"]:
            assert not nodes and not r["side"]
    return accepted, rejected


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("method", list(METHODS))
def test_a_trace_is_what_the_decoder_did(method, sampling):
    for prompt in PROMPTS[1:3]:  # one of them slides its window
        new, data = traced(method, SAMPLINGS[sampling], prompt)
        accepted, rejected = check_rounds(data, new)
        summary = data["summary"]
        assert summary["alpha"] == (pytest.approx(accepted / (accepted + rejected)) if accepted + rejected else None)
        assert set(data["texts"]) >= {str(t) for t in new} and data["texts"][str(new[0])] == f"<{new[0]}>"
        for node in (n for r in data["rounds"] for n in r["candidates"] if n["verdict"]):
            if sampling == "greedy":  # p is the target's one-hot: an argmax is accepted, anything else not
                assert node["p"] == (node["verdict"] == "accepted")
            else:
                assert node["verdict"] == "rejected" or node["p"] > 0
                assert node["q"] is None or node["q"] > 0  # a sampled guess was drawn from q


@pytest.mark.parametrize("method", ["draft k=3", "eagle tree", "lookahead"])
def test_held_rounds_are_marked_and_propose_nothing(method):
    new, data = traced(method, SAMPLINGS["sampled"], PROMPTS[1], EveryOtherRound())
    check_rounds(data, new)
    held = [r["held"] for r in data["rounds"]]
    assert held[:4] == [True, False, True, False]
    assert any(r["candidates"] for r in data["rounds"] if not r["held"])


def test_a_trace_replays_the_sampling_verifier():
    """p is what was left of the target's distribution when the guess was tried: the first judged
    child of a node sees the target's whole distribution there."""
    sampling = SAMPLINGS["sampled"]
    outcomes = []
    generate_batch(TARGET, [PROMPTS[1]], 30, sampling, torch.Generator().manual_seed(1),
                   proposers=[METHODS["draft k=3"]()], on_round=lambda row, outcome: outcomes.append(outcome))
    trace = Trace(sampling)
    firsts = 0
    for outcome in outcomes:
        trace.record(outcome)
        if len(outcome.candidates):
            first = trace.rounds[-1]["candidates"][0]
            x = outcome.candidates.tokens[0]
            probs = torch.softmax(outcome.logits[0].double().topk(40).values, -1)  # top-k 40, temperature 1
            ranked = outcome.logits[0].double().topk(40).indices.tolist()
            assert first["p"] == pytest.approx(float(probs[ranked.index(x)]) if x in ranked else 0.0)
            assert first["q"] == pytest.approx(float(outcome.candidates.draft_probs[0][x]))
            firsts += 1
    assert firsts > 5


def test_generate_trace_writes_the_page_and_the_data(tiny_checkpoint, tmp_path):
    r = run_cli("generate.py", "--out-dir", tiny_checkpoint, "--spec", "draft", "--no-fallback", "--max-new-tokens",
                "40", "--json", "--trace", tmp_path / "run.html")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    data = json.loads((tmp_path / "run.json").read_text())
    assert (tmp_path / "run.html").read_text().startswith("<!doctype html>")
    assert data["text"] == out["text"] and data["method"] == "draft" and len(data["tokens"]) == 40
    assert [t for r in data["rounds"] for t, _ in r["added"]] == data["tokens"]
    assert sorted(os.listdir(tmp_path)) == ["run.html", "run.json"]


@pytest.mark.parametrize("args, words", [
    (["--trace", "no/such/folder/run"], ["--trace", "cannot write"]),
    (["--trace", "run", "--batch-size", "2", "--prompt-file", "README.md"], ["--trace", "one prompt"]),
])
def test_generate_trace_bad_input(tiny_checkpoint, args, words):
    assert_one_line_error(run_cli("generate.py", "--out-dir", tiny_checkpoint, *args), *words)


def test_a_trace_that_cannot_be_written_leaves_nothing(tmp_path, monkeypatch):
    def no_room(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", no_room)
    with pytest.raises(OSError):
        trace_page.write(str(tmp_path / "run"), traced("none", Sampling(), [5], max_new_tokens=5)[1])
    assert os.listdir(tmp_path) == []
