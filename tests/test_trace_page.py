"""The trace page (trace_page.py): one self-contained file, light even for a long generation, that a
browser opens on the text and a round's tree. The browser test needs a headless Chromium; CI has one
(.ci/run installs it), so there its absence fails the test instead of skipping it."""
import functools
import json
import os
import random
import re
import shutil

import numpy as np
import pytest
import torch
from matplotlib.image import imread

import trace_page
from decode.batch import generate_batch
from decode.sampling import Sampling
from decode.trace import Trace
from tests.test_batch import METHODS, PROMPTS, TARGET, EveryOtherRound

MARKUP = "</script><!--<script>&amp;"  # a token's text that must stay text: not end the data, not be markup
COLOURS = {"accepted": (0xae, 0xe8, 0xb8), "rejected": (0xf8, 0xc4, 0xc4)}  # the page's node fills


@functools.cache
def eagle_trace():
    """A sampled EAGLE tree trace of the tiny target, held plain every other round, one token's text
    being MARKUP."""
    sampling = Sampling(temperature=0.7)
    trace = Trace(sampling)
    (new,), (stats,) = generate_batch(TARGET, [PROMPTS[0]], 40, sampling, torch.Generator().manual_seed(0),
                                      proposers=[METHODS["eagle tree"]()], fallback=EveryOtherRound(),
                                      on_round=lambda row, outcome: trace.record(outcome))
    return trace.as_dict(stats, lambda t: MARKUP if t == new[0] else f"t{t} ", method="eagle", setting="tree:6",
                         dtype="float64", prompt="ROMEO:", text="", prompt_tokens=PROMPTS[0], tokens=new)


def embedded(html):
    """The data the page embeds, as its script reads it."""
    (block,) = re.findall(r'<script type="application/json" id=data>(.*?)</script>', html, re.S)
    return json.loads(block)


def test_the_page_is_one_file_that_embeds_the_data_once_and_names_nothing_outside():
    data = eagle_trace()
    html = trace_page.render(data)
    for outside in ("http://", "https://", "src=", "<link", "url(", "@import"):
        assert outside not in html.lower()
    assert html.count("<script") == 2 and html.count("</script>") == 2  # MARKUP ended nothing
    assert embedded(html) == json.loads(json.dumps(trace_page.packed(data)))  # the one block: the data, whole


def test_a_2000_token_generation_of_60_node_trees_over_gpt2s_vocabulary_gives_a_page_under_3_mb():
    """As large as the page is meant to stay light for: 2,000 rounds of 60-node trees, their tokens drawn
    from GPT-2's 50,257 (so are the texts), six candidates judged in each (a real 2,000-token EAGLE trace
    of train.py's tiny test models, 1,931 rounds of mostly 60 nodes, is 7.5 MB as FILE.json, 1.1 MB as a page)."""
    rng, rounds = random.Random(0), []
    for _ in range(2000):
        candidates = [dict(token=rng.randrange(50257), parent=rng.randrange(-1, i), verdict=None, p=None, q=None)
                      for i in range(60)]
        for c in candidates[:6]:
            c.update(verdict=rng.choice(["accepted", "rejected"]), p=rng.random(), q=rng.random())
        rounds.append(dict(held=False, width=61, candidates=candidates, side=[], path=[0],
                           added=[[candidates[0]["token"], "draft"], [rng.randrange(50257), "corrected"]]))
    texts = {str(t): f" token{t}" for r in rounds for t in [c["token"] for c in r["candidates"]] + [r["added"][1][0]]}
    data = dict(eagle_trace(), texts=texts, rounds=rounds)
    size = len(trace_page.render(data).encode())
    print(f"2,000 rounds of 60-node trees: {len(json.dumps(data)) / 1e6:.1f} MB of JSON, a {size / 1e6:.2f} MB page")
    assert size < 3e6


def browser_or_skip():
    if not any(map(shutil.which, trace_page.BROWSERS)):
        why = f"no headless Chromium: none of {', '.join(trace_page.BROWSERS)} on PATH"
        if os.environ.get("CI"):
            pytest.fail(why + " (CI installs chromium-headless-shell: the browser test must run there)")
        pytest.skip(why)


def test_in_a_browser_the_page_shows_the_text_and_the_rounds_tree(tmp_path):
    browser_or_skip()
    data = eagle_trace()
    page = tmp_path / "trace.html"
    page.write_text(trace_page.render(data), encoding="utf-8")
    verdicts = [{c["verdict"] for c in r["candidates"]} for r in data["rounds"]]
    n = next((i for i, v in enumerate(verdicts) if {"accepted", "rejected", None} <= v), None)
    assert n is not None, "no round with accepted, rejected and unjudged candidates to draw: try another seed"
    trace_page.screenshot(page, tmp_path / "trace.png", round=n + 1)
    pixels = imread(tmp_path / "trace.png")[..., :3]
    assert pixels.shape == (900, 1200, 3) and pixels.std() > 0.05
    for name, colour in COLOURS.items():
        assert (abs(pixels - np.array(colour) / 255).max(-1) < 0.02).sum() > 500, f"no {name} node"
    assert (pixels.max(-1) < 0.3).sum() > 500  # dark text

    dom = trace_page.headless(page, "--dump-dom", round=n + 1)
    r = data["rounds"][n]
    assert dom.count('<g class="node') == 1 + len(r["candidates"]) + (r["added"][-1][1] != "draft")
    assert f"round {n + 1} of {len(data['rounds'])}" in dom
    assert len(re.findall(r'<span class="(draft|corrected|bonus|target)[^"]*" data-round=', dom)) == 40
    assert "&lt;/script&gt;&lt;!--&lt;script&gt;&amp;amp;" in dom  # MARKUP, as text
    largest = max(range(len(data["rounds"])), key=lambda i: (len(data["rounds"][i]["candidates"]), -i))
    assert f"round {largest + 1} of" in trace_page.headless(page, "--dump-dom")  # by default, the largest tree
    # a click on a token of the round before a held one, then the right arrow key: the held round
    held = next(i for i, r in enumerate(data["rounds"]) if r["held"] and i)
    page.write_text(trace_page.render(data) + f"""<script>document.querySelector('[data-round="{held - 1}"]').click();
        document.dispatchEvent(new KeyboardEvent('keydown', {{key: 'ArrowRight'}}));</script>""", encoding="utf-8")
    dom = trace_page.headless(page, "--dump-dom")
    assert f"round {held + 1} of {len(data['rounds'])}: held plain by the fallback" in dom


def test_the_screenshot_command_without_a_browser_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    page = tmp_path / "trace.html"
    page.write_text(trace_page.render(eagle_trace()), encoding="utf-8")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert trace_page.main([str(page), str(tmp_path / "trace.png")]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "trace.png").exists()
