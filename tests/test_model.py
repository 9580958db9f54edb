"""One forward for training, prefill, decode and verification: all must agree."""
import pytest
import torch

from model.checkpoint import load_model
from model.eagle import load_eagle
from model.gpt import GPT, GPTConfig, PRESETS
from model.medusa import load_medusa
from tests.conftest import tiny_model


def tree_mask_and_depths(parents):
    """Ancestor-or-self mask and depths of a tree given each node's parent (-1 for the root's
    children); parents come before children."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
        depth.append(0 if p < 0 else depth[p] + 1)
    return mask, torch.tensor(depth)


def path_to(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def random_parents(n, gen):
    return [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)]


@torch.no_grad()
def test_incremental_decoding_matches_full_forward():
    model = tiny_model()
    idx = torch.randint(64, (1, 32), generator=torch.Generator().manual_seed(1))
    full = model(idx)  # (1, 32, vocab), no cache
    cache = model.new_cache(scratch=0)
    for t in range(32):
        step = model(idx[:, t:t + 1], cache)
        cache.commit()
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-10)


@torch.no_grad()
@pytest.mark.parametrize("prefix,n", [(1, 1), (5, 4), (10, 8), (0, 16), (20, 12)])
def test_verify_pass_equals_single_steps(prefix, n):
    model = tiny_model(seed=prefix)
    idx = torch.randint(64, (2, prefix + n), generator=torch.Generator().manual_seed(n))  # batch of 2
    cache = model.new_cache(scratch=0, batch_size=2)
    if prefix:
        model(idx[:, :prefix], cache)
        cache.commit()
    verify = model(idx[:, prefix:], cache)  # n new positions in one pass, left as scratch
    cache.commit()
    steps_cache = model.new_cache(scratch=0, batch_size=2)
    if prefix:
        model(idx[:, :prefix], steps_cache)
        steps_cache.commit()
    for j in range(n):
        step = model(idx[:, prefix + j:prefix + j + 1], steps_cache)
        steps_cache.commit()
        torch.testing.assert_close(verify[:, j], step[:, 0], rtol=0, atol=1e-10)
    torch.testing.assert_close(cache.k[:, :, :, :cache.length], steps_cache.k[:, :, :, :steps_cache.length])


@torch.no_grad()
@pytest.mark.parametrize("seed", range(6))
def test_tree_node_logits_equal_their_path_as_a_sequence(seed):
    gen = torch.Generator().manual_seed(seed)
    model = tiny_model(seed=seed)
    prefix = int(torch.randint(1, 12, (1,), generator=gen))
    n = int(torch.randint(2, 14, (1,), generator=gen))
    parents = random_parents(n, gen)
    context = torch.randint(64, (1, prefix), generator=gen)
    nodes = torch.randint(64, (1, n), generator=gen)
    mask, depth = tree_mask_and_depths(parents)
    cache = model.new_cache(scratch=n)
    model(context, cache)
    cache.commit()
    tree_logits, hidden = model(nodes, cache, pos=prefix + depth, mask=mask, return_hidden=True)
    torch.testing.assert_close(model.lm_head(hidden), tree_logits)
    for node in range(n):
        sequence = torch.cat([context, nodes[:, path_to(parents, node)]], dim=1)
        torch.testing.assert_close(tree_logits[:, node], model(sequence)[:, -1], rtol=0, atol=1e-10)


def test_parameter_names_and_shapes_map_onto_gpt2():
    config = GPTConfig(**PRESETS["tiny"], vocab_size=300)
    state = GPT(config).state_dict()
    C, V, T = config.n_embd, config.vocab_size, config.block_size
    # GPT-2's names; its Conv1D weights are the transposes of our Linear weights
    expected = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C),
                "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,), "lm_head.weight": (V, C)}
    for i in range(config.n_layer):
        h = f"transformer.h.{i}."
        expected.update({
            h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
            h + "attn.c_attn.weight": (3 * C, C), h + "attn.c_attn.bias": (3 * C,),
            h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
            h + "mlp.c_fc.weight": (4 * C, C), h + "mlp.c_fc.bias": (4 * C,),
            h + "mlp.c_proj.weight": (C, 4 * C), h + "mlp.c_proj.bias": (C,)})
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()  # tied


def test_positions_past_the_context_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="positions"):
        model(torch.zeros(1, 33, dtype=torch.long))
    cache = model.new_cache(scratch=0)
    model(torch.zeros(1, 30, dtype=torch.long), cache)
    cache.commit()
    with pytest.raises(ValueError, match="positions"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)


def test_loading_draws_no_weights(tiny_checkpoint, monkeypatch):
    """The target and its heads are built on the meta device, uninitialised, for the checkpoint's weights
    to replace: what torch.nn.init calls are left (nn.Linear's constructor makes its own) draw nothing,
    and none is normal_, whose meta version imports torch._dynamo (docs/2026-12-06-epyc-u.md)."""
    calls = []

    def spy(name, init):
        def spied(tensor, *args, **kwargs):
            calls.append((name, tensor.is_meta))
            return init(tensor, *args, **kwargs)
        return spied
    for name in ("normal_", "uniform_", "zeros_", "ones_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_"):
        monkeypatch.setattr(torch.nn.init, name, spy(name, getattr(torch.nn.init, name)))
    model, tokenizer, _ = load_model(tiny_checkpoint / "target.pt")
    load_medusa(tiny_checkpoint / "medusa.pt", model, tokenizer)
    load_eagle(tiny_checkpoint / "eagle.pt", model, tokenizer)
    assert calls and all(is_meta and name != "normal_" for name, is_meta in calls), calls
