"""A speculation trace (decode/trace.py) as files: FILE.json, the data, and FILE.html, one
self-contained page that draws every round. A page's screenshot, with a headless Chromium:

    python -m trace_page eagle.html eagle.png [--round N]
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome")
VERDICTS = {"accepted": "a", "rejected": "r", None: "-"}  # a letter per candidate in the page's data


def stem(path):
    """FILE for --trace FILE, FILE.html or FILE.json."""
    root, extension = os.path.splitext(path)
    return root if extension in (".html", ".json") else path


def write(path, data):
    """Both files, or neither: each is written whole beside its final name, then moved there."""
    base = stem(path)
    contents = {base + ".json": json.dumps(data), base + ".html": render(data)}
    written, umask = [], os.umask(0)
    os.umask(umask)
    try:
        for final, text in contents.items():
            fd, temporary = tempfile.mkstemp(dir=os.path.dirname(final) or ".", suffix=".partial")
            written.append((temporary, final))
            os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        for temporary, final in written:
            os.replace(temporary, final)
    finally:
        for temporary, _ in written:
            if os.path.exists(temporary):
                os.remove(temporary)
    return list(contents)


def packed(data):
    """The data as the page embeds it: each round's candidates as columns, p and q (of the judged ones
    only) to 4 digits. A 2,000-token EAGLE trace of 60-node trees, 7.5 MB of JSON objects in FILE.json,
    makes a 1.1 MB page this way. The rounds' `added` are the new tokens: `tokens` and `text` are left out."""
    def digits(x):
        return None if x is None else float(f"{x:.4g}")

    def columns(r):
        judged = [c for c in r["candidates"] if c["verdict"]]
        return dict(held=r["held"], width=r["width"], token=[c["token"] for c in r["candidates"]],
                    parent=[c["parent"] for c in r["candidates"]],
                    verdict="".join(VERDICTS[c["verdict"]] for c in r["candidates"]),
                    p=[digits(c["p"]) for c in judged], q=[digits(c["q"]) for c in judged],
                    side=r["side"], path=r["path"], added=r["added"])
    about = {k: v for k, v in data.items() if k not in ("rounds", "tokens", "prompt_tokens", "text")}
    return dict(about, rounds=[columns(r) for r in data["rounds"]])


def render(data):
    """The page: the summary, the text coloured by source, a strip of every round and the selected
    round's tree, drawn by the page's script from the data it embeds once."""
    # JSON escapes "<" so that no "</script>" or "<!--" in a token's text can end or unbalance the block
    return PAGE.replace("/*DATA*/", json.dumps(packed(data), separators=(",", ":")).replace("<", "\\u003c"))


def headless(html_path, *options, round=None, size=(1200, 900)):
    """Open the page (at `round`, counted from 1) in a headless Chromium with `options`; returns what
    the browser printed to stdout (with --dump-dom, the DOM after the page's script ran)."""
    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    if browser is None:
        raise FileNotFoundError(f"no headless Chromium on PATH (looked for {', '.join(BROWSERS)}): "
                                "on Debian, apt-get install chromium-headless-shell")
    if not os.path.isfile(html_path):
        raise FileNotFoundError(f"{html_path}: no such file")
    url = pathlib.Path(html_path).resolve().as_uri() + ("" if round is None else f"#round={round}")
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: nothing remembered, nothing kept
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                               *options, url], capture_output=True, text=True, timeout=120)
    if done.returncode:
        last = done.stderr.strip().rpartition("\n")[2]  # one line of Chromium's many
        raise RuntimeError(f"{browser} failed ({done.returncode}): {last}")
    return done.stdout


def screenshot(html_path, png_path, round=None, size=(1200, 900)):
    """A PNG of the page as a browser window of `size` shows it, at `round` (default: the largest tree)."""
    headless(html_path, f"--screenshot={os.path.abspath(png_path)}", round=round, size=size)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trace_page", description="A screenshot of a trace page.")
    p.add_argument("html", help="the page, FILE.html of generate.py --trace FILE")
    p.add_argument("png", help="the PNG to write")
    p.add_argument("--round", type=int, help="the round to show, from 1 (default: the largest tree)")
    args = p.parse_args(argv)
    try:
        screenshot(args.html, args.png, args.round)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


PAGE = r"""<!doctype html>
<html lang=en><meta charset=utf-8><title>speculation trace</title>
<style>
:root { --green: #1a7f37; --red: #cf222e; --blue: #0550ae; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 12px 16px; color: #222; }
#summary { display: flex; flex-wrap: wrap; gap: 2px 16px; }
#text { white-space: pre-wrap; font-family: monospace; max-height: 22vh; overflow: auto; border: 1px solid #ccc;
        padding: 4px 6px; margin: 8px 0; } #text span { cursor: pointer; } #text .on { background: #ffe58a; }
#text .prompt { color: #888; } #text .draft { color: var(--green); } #text .corrected { color: var(--red); }
#text .bonus { color: var(--blue); }
#strip { display: block; width: 100%; height: 24px; cursor: pointer; background: #f6f6f6; }
nav { margin: 6px 0; } nav button { font: inherit; }
.accepted { --fill: #aee8b8; --line: var(--green); } .rejected { --fill: #f8c4c4; --line: var(--red); }
.unjudged { --fill: #f2f2f2; --line: #ccc; --ink: #999; } .corrected { --line: var(--red); --width: 2.5; }
.bonus { --line: var(--blue); --width: 2.5; } .target { --line: #222; --width: 2.5; }
.key i { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; background: var(--fill, #fff);
         border: 1.5px solid var(--line, #888); }
#tree rect { fill: var(--fill, #fff); stroke: var(--line, #888); stroke-width: var(--width, 1.5); }
#tree text { font: 12px monospace; fill: var(--ink, #222); } #tree text.sub { font-size: 10px; fill: #555; }
#tree line { stroke: #bbb; } #tree line.path { stroke: var(--green); stroke-width: 2.5; }
</style>
<div id=summary></div>
<div id=text></div>
<svg id=strip preserveAspectRatio=none><title>a bar per round, as tall as the tokens it added: green where
a guess was accepted, red where every judged guess was rejected, grey a plain step (light: held by the fallback)
</title></svg>
<nav><button id=prev>&larr;</button> <button id=next>&rarr;</button> <span id=about></span></nav>
<div class=key><i class=accepted></i>accepted <i class=rejected></i>rejected <i class=unjudged></i>never judged
  <i class=corrected></i>the target's correction <i class=bonus></i>its bonus token <i class=target></i>plain step</div>
<svg id=tree></svg>
<script type="application/json" id=data>/*DATA*/</script>
<script>
const data = JSON.parse(document.getElementById('data').textContent), rounds = data.rounds, texts = data.texts;
const NS = document.getElementById('tree').namespaceURI;  // SVG's, taken from the markup: the page names no URL
const COLUMN = 128, BOX = 112, ROW = 34, HEIGHT = 30;
const SOURCE = {corrected: 'correction', bonus: 'bonus token', target: 'plain step'};
const visible = s => s === '' ? '∅' : s.replace(/ /g, '␣').replace(/\n/g, '↵').replace(/\t/g, '⇥')
  .replace(/[\x00-\x1f\x7f]/g, c => '\\x' + c.charCodeAt(0).toString(16).padStart(2, '0'));
const number = x => x >= 0.001 || x === 0 ? String(+x.toPrecision(2)) : x.toExponential(1);
const fixed = (x, digits = 2) => x == null ? '–' : x.toFixed(digits);
let current = 0;

function element(parent, name, attributes = {}, text = null) {
  const e = parent.appendChild(parent.namespaceURI === NS ? document.createElementNS(NS, name)
    : document.createElement(name));
  for (const [key, value] of Object.entries(attributes)) e.setAttribute(key, value);
  if (text !== null) e.textContent = text;
  return e;
}

const g = data.sampling, s = data.summary;
document.title = `trace: ${data.method} ${data.setting ?? ''}`;
for (const [label, value] of [
    ['method', [data.method, data.setting].filter(x => x != null).join(' ')], ['dtype', data.dtype],
    ['sampling', g.greedy ? 'greedy' : `temperature ${g.temperature}` + (g.top_k ? `, top-k ${g.top_k}` : '')
      + (g.top_p < 1 ? `, top-p ${g.top_p}` : '') + (g.lossy ? ', typical acceptance (LOSSY)' : '')],
    ['new tokens', s.new_tokens], ['rounds', s.rounds], ['held plain', `${Math.round(100 * s.held)}%`],
    ['tau', fixed(s.tau)], ['alpha', fixed(s.alpha)], ['alpha by depth', s.alpha_by_depth.map(a => fixed(a)).join(' ')],
    ['forwards', `${s.target_forwards} target, ${s.draft_forwards} draft`], ['tokens/s', fixed(s.tokens_per_s, 1)]]) {
  const item = element(document.getElementById('summary'), 'span');
  element(item, 'b', {}, label + ' ');
  item.append(value === '' ? '–' : value);
}

const text = document.getElementById('text');
element(text, 'span', {class: 'prompt'}, data.prompt);
const spans = rounds.map((r, i) => r.added.map(([token, source]) =>
  element(text, 'span', {class: source, 'data-round': i}, texts[token])));
text.onclick = e => e.target.dataset.round && select(+e.target.dataset.round);

const strip = document.getElementById('strip'), most = Math.max(1, ...rounds.map(r => r.added.length));
strip.setAttribute('viewBox', `0 0 ${rounds.length} 1`);
rounds.forEach((r, i) => element(strip, 'rect', {x: i, y: 1 - r.added.length / most, width: 1, height: 1,  // clipped
  fill: r.held ? '#bbb' : r.path.length ? '#1a7f37' : r.token.length ? '#e88' : '#888'}));
const marker = element(strip, 'rect', {width: Math.max(1, rounds.length / 300), height: 1, fill: '#f0a000'});
strip.onclick = e => {
  const box = strip.getBoundingClientRect();
  select(Math.floor((e.clientX - box.left) / box.width * rounds.length));
};

function select(i) {
  if (!rounds.length) return;
  current = i = Math.max(0, Math.min(rounds.length - 1, i)) || 0;  // a mistyped #round=N: the first
  document.querySelectorAll('#text .on').forEach(e => e.classList.remove('on'));
  spans[i].forEach(e => e.classList.add('on'));
  spans[i][0]?.scrollIntoView({block: 'nearest'});
  marker.setAttribute('x', i);
  history.replaceState(null, '', `#round=${i + 1}`);
  draw(rounds[i], i ? rounds[i - 1].added.at(-1)[0] : null);
  const r = rounds[i], last = r.added.at(-1)[1], n = r.token.length;
  document.getElementById('about').textContent = `round ${i + 1} of ${rounds.length}: ` + (r.held
    ? 'held plain by the fallback (plain rounds measured faster): the target alone added a token'
    : !n ? 'nothing proposed: the target alone added a token'
    : `${n} candidate${n > 1 ? 's' : ''}, a pass over ${r.width} tokens: ${r.path.length} accepted, then `
      + (last === 'draft' ? 'the end of the generation' : `the target's ${SOURCE[last]}`)) + (r.side.length
    ? `; lookahead's window, along unjudged: ${r.side.map(t => visible(texts[t])).join(' · ')}` : '');
}

function draw(r, root) {  // the round's tree, root (the last token before the round) on the left
  const tree = document.getElementById('tree'), [own, source] = r.added.at(-1);
  let judged = 0;
  // node 0 is the root; candidate c is node c + 1, as in the verifier
  const nodes = [{token: root, kind: 'root', sub: 'root'}].concat(r.token.map((token, c) => {
    const node = {token, kind: {a: 'accepted', r: 'rejected', '-': 'unjudged'}[r.verdict[c]], parent: r.parent[c] + 1};
    if (node.kind !== 'unjudged') {
      node.p = r.p[judged], node.q = r.q[judged++];
      if (!g.greedy) node.sub = `p ${number(node.p)}` + (node.q == null ? '' : ` q ${number(node.q)}`);
    }
    return node;
  }));
  const children = nodes.map(() => []), onPath = new Set(r.path.map(c => c + 1));
  nodes.forEach((n, k) => k && children[n.parent].push(k));
  if (source !== 'draft') {  // the target's own token, first after the path: path and token make one line
    const parent = r.path.length ? r.path.at(-1) + 1 : 0;
    children.push([]), children[parent].unshift(nodes.length), onPath.add(nodes.length);
    nodes.push({token: own, kind: source, parent, sub: SOURCE[source]});
  }
  let rows = 0, depth = 0;
  (function place(k, column) {  // a leaf per row, each parent level with its first child: a chain is a line
    children[k].forEach(c => place(c, column + 1));
    nodes[k].x = column * COLUMN, nodes[k].y = children[k].length ? nodes[children[k][0]].y : ROW * rows++;
    depth = Math.max(depth, column);
  })(0, 0);
  tree.replaceChildren();
  tree.setAttribute('width', (depth + 1) * COLUMN), tree.setAttribute('height', rows * ROW);
  nodes.forEach((n, k) => k && element(tree, 'line', {x1: nodes[n.parent].x + BOX, y1: nodes[n.parent].y + HEIGHT / 2,
    x2: n.x, y2: n.y + HEIGHT / 2, class: onPath.has(k) ? 'path' : ''}));
  for (const n of nodes) {
    const node = element(tree, 'g', {class: `node ${n.kind}`, transform: `translate(${n.x + 1},${n.y + 1})`});
    const shown = n.token === null ? '⟨prompt⟩' : visible(texts[n.token]);
    element(node, 'title', {}, `${shown} (${n.kind}` + (n.p == null ? ')' : `, p ${n.p}, q ${n.q ?? 'one-hot'})`));
    element(node, 'rect', {width: BOX - 2, height: HEIGHT - 2, rx: 4});
    element(node, 'text', {x: 6, y: 12}, shown.length > 14 ? shown.slice(0, 13) + '…' : shown);
    element(node, 'text', {x: 6, y: 24, class: 'sub'}, n.sub ?? '');
  }
}

document.getElementById('prev').onclick = () => select(current - 1);
document.getElementById('next').onclick = () => select(current + 1);
document.onkeydown = e => e.key === 'ArrowLeft' ? select(current - 1) : e.key === 'ArrowRight' && select(current + 1);
window.onhashchange = () => select(location.hash.slice('#round='.length) - 1);
// by default the largest speculative tree, so that a fresh page shows one
location.hash.startsWith('#round=') ? window.onhashchange()
  : select(rounds.reduce((best, r, i) => !r.held && r.token.length > rounds[best].token.length ? i : best, 0));
</script>
"""


if __name__ == "__main__":
    sys.exit(main())
