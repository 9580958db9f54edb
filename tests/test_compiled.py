"""The static-shape path (model/compiled.py) says what the eager model says.
(Its caches after every round of speculation: tests/test_speculative.py.)

Attending over the whole cache under a mask, writing K/V at tensor positions: every pass must give
the reference's logits and leave the cache as the reference leaves it. The masking and writing are
checked for passes of every kind with the static pass run eagerly in float64; the compiled program,
in float32, against the same reference at several lengths.
"""
import pytest
import torch

from decode import generate, generate_batch
from decode.methods import make_proposer
from decode.sampling import Sampling
from model.compiled import ROOM, StaticGPT
from model.medusa import MedusaConfig, MedusaHeads
from tests.conftest import tiny_model
from tests.test_eagle import trained  # noqa: F401 (a fixture)

TARGET = tiny_model(seed=0)  # context 32
STATIC = StaticGPT(TARGET)


def random_tree_mask(n, generator):
    """A bool (n, n) tree mask: each node sees itself and its ancestors; parents come first."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = int(torch.randint(-1, i, (1,), generator=generator))
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask, mask.sum(1) - 1  # and each node's depth


def compare_pass(static, reference, prefix_tokens, n, tree, generator, atol):
    """One pass of n tokens after prefix_tokens, static against reference: logits, hidden states
    and, after committing a random subset, the cache."""
    caches = []
    for model in (static, reference):
        cache = model.new_cache(scratch=n)
        if prefix_tokens:
            reference(torch.tensor([prefix_tokens]), cache)
            cache.commit()
        caches.append(cache)
    idx = torch.randint(TARGET.config.vocab_size, (1, n), generator=generator)
    mask = pos = None
    if tree:
        mask, depths = random_tree_mask(n, generator)
        mask = torch.nn.functional.pad(mask, (0, 1, 0, 1))[:n, :n]  # a view with another row stride
        pos = len(prefix_tokens) + depths
    static_logits, static_hidden = static(idx, caches[0], pos=pos, mask=mask, return_hidden=True)
    logits, hidden = reference(idx, caches[1], pos=pos, mask=mask, return_hidden=True)
    torch.testing.assert_close(static_logits, logits, rtol=0, atol=atol)
    torch.testing.assert_close(static_hidden, hidden, rtol=0, atol=atol)
    assert caches[0].pending == n
    keep = sorted(torch.randperm(n, generator=generator)[:max(1, n // 2)].tolist())
    for cache in caches:
        cache.commit(keep)
    length = caches[1].length
    torch.testing.assert_close(caches[0].k[..., :length, :], caches[1].k[..., :length, :], rtol=0, atol=atol)
    torch.testing.assert_close(caches[0].v[..., :length, :], caches[1].v[..., :length, :], rtol=0, atol=atol)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 11, 16, 17, 31, 32])
@pytest.mark.parametrize("kind", ["prefill", "chain", "tree"])
def test_static_pass_equals_the_model(n, kind):
    gen = torch.Generator().manual_seed(n)
    prefix = [] if kind == "prefill" else torch.randint(64, (32 - n,), generator=gen).tolist()[:max(0, 31 - n)]
    compare_pass(STATIC, TARGET, prefix, n, kind == "tree", gen, atol=1e-10)


def test_static_caches_have_one_capacity_for_every_method():
    assert STATIC.new_cache(scratch=1).capacity == STATIC.new_cache(scratch=20).capacity == 32 + ROOM
    with pytest.raises(ValueError, match="positions"):
        STATIC(torch.tensor([[1, 2]]), STATIC.new_cache(scratch=0), pos=torch.tensor([31, 32]))


def every_method(target, draft, eagle):
    heads = MedusaHeads(target, MedusaConfig(n_heads=3))
    # heads that guess, some right, some wrong: noise on their residual blocks only (on their
    # projections, copies of the target's lm_head, it left every guess wrong)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    state = {"tree": [(0,), (1,), (0, 0), (0, 0, 0)], "accuracies": [[0.6, 0.2], [0.5, 0.1], [0.4, 0.1]]}
    return {"draft k=3": make_proposer("draft", "3", target, draft_model=draft),
            "jacobi": make_proposer("jacobi", "4", target),
            "lookahead": make_proposer("lookahead", "3,3,2", target, sizing="fixed"),
            "prompt lookup": make_proposer("prompt-lookup", None, target),
            "medusa": make_proposer("medusa", "saved", target, heads=(heads, state)),
            "eagle chain": make_proposer("eagle", "chain:3", target, eagle_head=eagle),
            "eagle tree": make_proposer("eagle", "tree:6", target, eagle_head=eagle)}


@pytest.mark.parametrize("method", ["draft k=3", "jacobi", "lookahead", "prompt lookup", "medusa", "eagle chain",
                                    "eagle tree"])
def test_every_method_on_the_static_path_is_token_identical_to_plain(method, trained):
    draft = StaticGPT(tiny_model(seed=5, n_layer=1))
    head, state, _ = trained  # an EAGLE head trained briefly on TARGET's text (its weights are TARGET's)
    proposer = every_method(STATIC, draft, (head, state))[method]
    accepted = 0
    for prompt in ([5], [1, 2, 3, 1, 2, 3, 1, 2], list(range(10, 40))):
        plain, _ = generate(TARGET, prompt, 50, Sampling())  # crosses the context window
        spec, stats = generate(STATIC, prompt, 50, Sampling(), proposer=proposer)
        assert spec == plain
        accepted += stats.accepted
    assert accepted > 0  # guesses were verified and some held: plain steps alone would say the same


def test_a_batch_on_the_static_path_runs_its_one_row_forwards_eagerly():
    """A batch's rows slide at their own rounds and re-prefill in a forward of their own, over a
    view of the batch's cache: the static pass, which holds a one-row cache whole, must not take it."""
    draft = StaticGPT(tiny_model(seed=5, n_layer=1))
    prompts = [[5], [1, 2, 3, 1, 2, 3, 1, 2], list(range(10, 40))]
    proposers = [make_proposer("draft", str(k), STATIC, draft_model=draft) for k in (1, 2, 3)]
    outputs, _ = generate_batch(STATIC, prompts, 50, Sampling(), proposers=proposers)
    assert outputs == [generate(TARGET, prompt, 50, Sampling())[0] for prompt in prompts]


def test_the_compiled_program_equals_the_model_at_every_length_and_is_reused(tmp_path):
    """The AOTInductor package of the tiny model in float32, one program for every pass length:
    a chain, a tree (whose mask is a slice of a larger one: the program trusts its inputs' layout),
    a decode step and a prefill of the whole context, each within 1e-5 of the eager model. Building
    it removes the packages of older code; a second instance loads it instead of compiling it."""
    model = tiny_model(dtype=torch.float32)
    (tmp_path / "pass4-capacity96-code0123456789ab.pt2").write_bytes(b"")  # built by older code
    compiled = []
    static = StaticGPT(model, tmp_path, on_compile=lambda seconds: seconds is None or compiled.append(seconds))
    gen = torch.Generator().manual_seed(0)
    compare_pass(static, model, list(range(9)), 4, False, gen, atol=1e-5)
    compare_pass(static, model, list(range(9)), 7, True, gen, atol=1e-5)
    compare_pass(static, model, list(range(9)), 1, False, gen, atol=1e-5)
    compare_pass(static, model, [], 32, False, gen, atol=1e-5)
    assert len(compiled) == 1 and len(list(tmp_path.iterdir())) == 1
    again = StaticGPT(model, tmp_path, on_compile=lambda seconds: seconds is None or compiled.append(seconds))
    compare_pass(again, model, list(range(20)), 2, True, gen, atol=1e-5)
    assert len(compiled) == 1
