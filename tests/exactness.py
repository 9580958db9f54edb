"""How the tests show that sampled speculation keeps the target's distribution, and that they would
notice if it did not.

The target is a toy bigram model: its next-token distribution depends only on the current token, so
every token a decoder writes, however it was proposed and verified, must be a draw from the row of
the target's transition matrix P at the token before it. A decoder's output is then a Markov chain
with transitions P, and the counts N[i, j] of transitions i -> j, pooled over positions and runs,
are tested against P with the likelihood-ratio (G) statistic

    G = 2 * sum_ij N[i, j] * log(N[i, j] / (N[i] * P[i, j])),

chi-square with sum_i (|support of P[i]| - 1) degrees of freedom for a chain with transitions P
(Anderson and Goodman 1957). Unlike a test over whole continuations, every cell expects hundreds of
counts, so one rare draw cannot move it. A transition that P forbids (top-k, top-p) fails at once.

P is written out here with numpy from the definitions of temperature, top-k and top-p, not taken
from decode.sampling, so that a decoder sampling from a wrongly processed distribution fails too.

The controls are verifiers with one deliberate flaw each (FLAWS), put in the loop's place: a test
that passes the real verifier must fail them. Their power, and the real verifier's pass rate, were
measured over many seeds by `python -m tests.sampling_power` (docs/2026-12-06-xeon-s.md).
"""
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

import decode.verify
from decode import DraftModel, Eagle, Jacobi, Lookahead, Medusa, PromptLookup, Proposer, generate, generate_batch
from decode.medusa import build_tree
from decode.sampling import Sampling, token_probs
from decode.sizing import Costs
from decode.tree import Candidates
from decode.verify import walk
from model.kv_cache import KVCache

SIGNIFICANCE = 0.001  # a test fails when its p-value is below this
VOCAB = 4


class ToyBigram(torch.nn.Module):
    """Logits (B, n, V) = table[idx]. Writes placeholder K/V so every cache commit and rollback runs
    exactly as with a real model. A short context window makes every long run slide."""

    def __init__(self, table, block_size=24):
        super().__init__()
        self.table = table.double()  # (V, V): row = current token, columns = next-token logits
        self.config = SimpleNamespace(block_size=block_size, vocab_size=table.size(0))
        self.lm_head = torch.nn.Identity()  # its "hidden states" are already logits

    def new_cache(self, scratch, batch_size=1):
        return KVCache(1, batch_size, 1, 1, self.config.block_size + scratch, dtype=torch.float64)

    def forward(self, idx, cache=None, pos=None, mask=None, return_hidden=False):
        if cache is not None:
            placeholder = torch.zeros(idx.size(0), 1, idx.size(1), 1, dtype=torch.float64)
            cache.write(0, placeholder, placeholder)
        logits = self.table[idx]  # (B, n, V)
        return (logits, logits) if return_hidden else logits  # the logits stand in for hidden states


def random_table(seed, vocab=VOCAB, scale=1.5):
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def reference_probs(logits, temperature, top_k=None, top_p=1.0):
    """What sampling at `temperature` with top-k and top-p draws from, given logits (..., V), by the
    definitions: keep the top_k largest logits, softmax of logits / temperature over them, then keep
    the fewest most likely tokens whose probability adds up to top_p and renormalise."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim > 1:
        return np.stack([reference_probs(row, temperature, top_k, top_p) for row in logits])
    kept = np.argsort(-logits, kind="stable")[:top_k or len(logits)]
    weights = np.zeros_like(logits)
    weights[kept] = np.exp((logits[kept] - logits[kept].max()) / temperature)
    probs = weights / weights.sum()
    nucleus, mass = [], 0.0
    for token in np.argsort(-probs, kind="stable"):
        if mass >= top_p:
            break
        nucleus.append(token)
        mass += probs[token]
    out = np.zeros_like(probs)
    out[nucleus] = probs[nucleus] / mass
    return out


def transition_counts(outputs, first):
    """N (V, V): N[i, j] counts the written tokens j that followed token i, over every output, each
    written after the token `first`."""
    counts = np.zeros((VOCAB, VOCAB))
    for output in outputs:
        text = [first, *output]
        np.add.at(counts, (text[:-1], text[1:]), 1)
    return counts


def g_test(counts, probs):
    """(G, degrees of freedom, p-value) of transition counts against the transition matrix probs."""
    statistic, df = 0.0, 0
    for row, p in zip(counts, probs):
        if row.sum() == 0:
            continue
        if row[p == 0].any():
            return math.inf, 1, 0.0
        seen = row > 0
        statistic += 2 * float((row[seen] * np.log(row[seen] / (row.sum() * p[seen]))).sum())
        df += int((p > 0).sum()) - 1
    if df == 0:
        return statistic, df, 1.0
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, df, p_value


# ---- the controls: the recursive rejection rule, written out again, with one flaw at a time --------

FLAWS = {
    "residual is p": "after a rejection, the next child is judged and the last token drawn from p "
                     "itself, not from the residual max(0, p - q)",
    "q of the parent": "a sampled candidate is judged with the draft distribution its parent was "
                       "drawn from, one depth up",
    "bonus from the residual": "after a fully accepted path, the bonus token is drawn from the residual "
                               "of p against the last candidate's q, as after a rejection",
    "acceptance 0.04 high": "a candidate x is accepted with probability min(1, p(x) / q(x) + 0.04), 4 points "
                            "more than it should be",
}
STOCHASTIC_ONLY = {"q of the parent"}  # no effect where every candidate is a deterministic guess


def flawed_verifier(flaw):
    """verify_sampling(probs, candidates, generator) with `flaw` (a key of FLAWS)."""

    def verify(probs, candidates, generator=None):
        def q_of(node, like):
            """The distribution candidate `node` (a pass position) was drawn from: one-hot for a guess."""
            if candidates.draft_probs is None:
                return torch.nn.functional.one_hot(torch.tensor(candidates.tokens[node - 1]), like.size(-1)).to(like)
            parent = candidates.parents[node - 1]
            drawn_from = parent if flaw == "q of the parent" and parent >= 0 else node - 1
            return candidates.draft_probs[drawn_from].to(like)

        def rule_at(node):
            left = probs[node]

            def accept(child):
                nonlocal left
                x, q = candidates.tokens[child - 1], q_of(child, left)
                bias = 0.04 * q[x] if flaw == "acceptance 0.04 high" else 0.0
                if torch.rand((), generator=generator, dtype=left.dtype) * q[x] < left[x] + bias:
                    return True
                if flaw != "residual is p":
                    left = residual(left, q)
                return False

            def after():
                last = left
                if flaw == "bonus from the residual" and node > 0 and not candidates.children()[node]:
                    last = residual(left, q_of(node, left))
                return int(torch.multinomial(last, 1, generator=generator))

            return accept, after

        return walk(candidates, rule_at)

    return verify


def residual(p, q):
    """normalize(max(0, p - q)), written out again for the controls' rule."""
    left = (p - q).clamp_min(0)
    return left / left.sum() if left.sum() > 0 else p


def with_flaw(monkeypatch, flaw):
    """Put the verifier with `flaw` where the decoding loop calls the shared one."""
    monkeypatch.setattr(decode.verify, "verify_sampling", flawed_verifier(flaw))


# ---- toy drafters for the bigram target ------------------------------------------------------------

class ToyTree(Proposer):
    """Proposes a tree mixing sampled candidates (draws from the draft table, with their q) and
    deterministic guesses (q one-hot): at the root two draws and the guess 3; under the first draw,
    one draw and the guess 0."""
    max_candidates = 5

    def __init__(self, table):
        self.table = table

    def propose(self, tokens, max_depth, sampling, generator):
        one_hot = torch.eye(VOCAB, dtype=torch.float64)
        q_root = token_probs(self.table[tokens[-1]], sampling)
        a, b = torch.multinomial(q_root, 2, replacement=True, generator=generator).tolist()
        if max_depth == 1:
            return Candidates([a, b, 3], [-1, -1, -1], torch.stack([q_root, q_root, one_hot[3]]))
        q_a = token_probs(self.table[a], sampling)
        c = int(torch.multinomial(q_a, 1, generator=generator))
        return Candidates([a, b, 3, c, 0], [-1, -1, -1, 0, 0], torch.stack([q_root, q_root, one_hot[3], q_a, one_hot[0]]))


class ToyMedusaHeads:
    """Medusa heads for the bigram toy, whose "hidden state" is its logits row at the current token:
    head j's logits are the log of the exact distribution of the token j+2 places ahead,
    softmax(hidden) P^(j+1), P the transition matrix: perfect heads, which still miss."""

    def __init__(self, table, n_heads):
        self.transition = torch.softmax(table, -1)  # (V, V)
        self.n_heads = n_heads

    def __call__(self, hidden):  # (B, T, V) -> (K, B, T, V)
        p, out = torch.softmax(hidden, -1), []
        for _ in range(self.n_heads):
            p = p @ self.transition
            out.append(p.log())
        return torch.stack(out)

    def decoder(self):
        return lambda hidden: self(hidden[None, None])[:, 0, 0]


class ToyEagleHead:
    """An EAGLE head for the bigram toy: it ignores the features and says the draft table's logits
    for the token it is given."""

    def __init__(self, table):
        self.table = table

    def new_cache(self, scratch):
        return KVCache(1, 1, 1, 1, 64 + scratch, dtype=torch.float64)

    def __call__(self, features, tokens, cache=None, mask=None):
        if cache is not None:
            placeholder = torch.zeros(1, 1, tokens.size(1), 1, dtype=torch.float64)
            cache.write(0, placeholder, placeholder)
        logits = self.table[tokens]
        return logits, logits


class HeldAfterLongPaths:
    """A fallback whose choice depends on what was sampled: it holds the round after one that gained
    two tokens or more. Choosing by the past never biases what comes next."""
    gained = 0

    def speculate(self):
        return self.gained < 2

    def record(self, speculated, gained, seconds, left_apart):
        self.gained = gained


# ---- every method, sampled -------------------------------------------------------------------------

TARGET_TABLE, DRAFT_TABLE = random_table(seed=11), random_table(seed=12)
TOKENS = 4800  # written per test: 100 runs of LENGTH
LENGTH = 48  # tokens a run writes: past the toy's 24-token window at least once, from any prompt here
# a prompt that seeds the pool and the lookups with n-grams of every token, so that nearly every
# round has candidates to judge; a bigram model forgets all but its last token
SEEDING_PROMPT = (1, 2, 3, 0, 2, 1, 0, 3, 3, 1, 1, 2, 2, 0, 0, 1, 3, 2, 0)
# costs for the methods that size themselves, (r, c, seconds) or r: cheap passes and drafting whose
# timed steps cost nothing against an infinite bare time, so that no choice depends on this machine
CHEAP_DRAFT = ([1.0 + 0.1 * n for n in range(9)], 0.1, math.inf)
CHEAP_PASSES = [1 + 0.05 * n for n in range(64)]
CHEAP_HEAD = ([1.0 + 0.1 * n for n in range(32)], 0.1, math.inf)
MEDUSA_TREE = build_tree([[0.5, 0.3, 0.15], [0.4, 0.3], [0.3]], 6)  # [(0,), (1,), (2,), (0,0), (1,0), (0,1)]
T1 = Sampling(temperature=1.0)
TRUNCATED = Sampling(temperature=0.7, top_k=3, top_p=0.9)


@dataclass(frozen=True)
class Setting:
    """A method sampled on the bigram toy. sampled: its candidates are draws with a q of their own
    (not only deterministic guesses), which some flaws need to show."""
    make_proposer: object
    sampling: Sampling
    sampled: bool
    prompt: tuple = (0,)
    make_fallback: object = lambda: None

    def flaws(self):
        return [flaw for flaw in FLAWS if self.sampled or flaw not in STOCHASTIC_ONLY]


SETTINGS = {
    "draft k=3": Setting(lambda: DraftModel(ToyBigram(DRAFT_TABLE), 3), T1, True),
    "draft k=2, top-k top-p": Setting(lambda: DraftModel(ToyBigram(DRAFT_TABLE), 2), TRUNCATED, True),
    "draft auto": Setting(lambda: DraftModel(ToyBigram(DRAFT_TABLE), 4, "auto", costs=CHEAP_DRAFT), T1, True),
    "draft heuristic": Setting(lambda: DraftModel(ToyBigram(DRAFT_TABLE), 4, "heuristic"), T1, True),
    "draft k=3, held by what was sampled": Setting(lambda: DraftModel(ToyBigram(DRAFT_TABLE), 3), T1, True,
                                                   make_fallback=HeldAfterLongPaths),
    "tree of draws and guesses": Setting(lambda: ToyTree(DRAFT_TABLE), Sampling(temperature=1.2), True),
    "jacobi": Setting(lambda: Jacobi(4), T1, False),
    "lookahead": Setting(lambda: Lookahead(2, 3, 3, pool_from_prompt=True), T1, False, SEEDING_PROMPT),
    "lookahead sized": Setting(lambda: Lookahead(2, 3, 3, pool_from_prompt=True, costs=Costs(CHEAP_PASSES)), T1, False,
                               SEEDING_PROMPT),
    "prompt lookup": Setting(lambda: PromptLookup(2, 3, 2), T1, False, SEEDING_PROMPT),
    "medusa chain": Setting(lambda: Medusa(ToyMedusaHeads(TARGET_TABLE, 3), "chain"), T1, False),
    "medusa tree, top-k top-p": Setting(lambda: Medusa(ToyMedusaHeads(TARGET_TABLE, 3), MEDUSA_TREE), TRUNCATED, False),
    "eagle chain": Setting(lambda: Eagle(ToyEagleHead(DRAFT_TABLE), "chain", 3), T1, True),
    "eagle chain auto": Setting(lambda: Eagle(ToyEagleHead(DRAFT_TABLE), "chain", "auto", CHEAP_HEAD), T1, True),
    "eagle tree, top-k top-p": Setting(lambda: Eagle(ToyEagleHead(DRAFT_TABLE), "tree", 3), TRUNCATED, False),
    "eagle tree auto": Setting(lambda: Eagle(ToyEagleHead(DRAFT_TABLE), "tree", "auto", CHEAP_HEAD), T1, False),
}
def sampled_counts(setting, tokens, seed, batch_size=1):
    """Transition counts of at least `tokens` tokens written by runs of LENGTH from setting.prompt,
    each alone (generate; generate_batch for a setting with a fallback) or batch_size runs at a time
    in one batch (generate_batch)."""
    target, generator = ToyBigram(TARGET_TABLE), torch.Generator().manual_seed(seed)
    outputs = []
    while len(outputs) * LENGTH < tokens:
        prompts = [list(setting.prompt)] * batch_size
        proposers = [setting.make_proposer() for _ in prompts]
        fallback = setting.make_fallback()
        if batch_size == 1 and fallback is None:
            outputs.append(generate(target, prompts[0], LENGTH, setting.sampling, generator, proposer=proposers[0])[0])
        else:
            outputs += generate_batch(target, prompts, LENGTH, setting.sampling, generator, proposers=proposers,
                                      fallback=fallback)[0]
    return transition_counts(outputs, setting.prompt[-1])


def target_transitions(sampling):
    """P (V, V): what sampling the toy target directly draws after each token."""
    return reference_probs(TARGET_TABLE.numpy(), sampling.temperature, sampling.top_k, sampling.top_p)


def sampled_fit(setting, tokens, seed, batch_size=1):
    """(G, df, p-value) of the tokens the setting writes against the target's transitions."""
    return g_test(sampled_counts(setting, tokens, seed, batch_size), target_transitions(setting.sampling))
