"""Plain decoding with the cache says what a cacheless, recompute-everything loop says."""
import torch

from decode import generate
from decode.sampling import Sampling
from tests.conftest import tiny_model
from tests.exactness import reference_probs


@torch.no_grad()
def reference_generate(model, prompt, max_new_tokens, sampling, generator=None):
    """No cache: rerun the whole visible context for every token, and draw it from the reference
    distribution (tests/exactness.py), not decode.sampling's. The context slides the way
    decode/window.py documents: once it would exceed the window, keep its last half window."""
    block_size = model.config.block_size
    tokens, start = list(prompt), 0
    for _ in range(max_new_tokens):
        if len(tokens) - start > block_size:
            start = len(tokens) - block_size // 2
        logits = model(torch.tensor([tokens[start:]]))[0, -1]
        if sampling.greedy:
            tokens.append(int(logits.argmax()))
        else:
            probs = reference_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
            tokens.append(int(torch.multinomial(torch.from_numpy(probs), 1, generator=generator)))
    return tokens[len(prompt):]


def test_greedy_matches_reference_well_past_the_window():
    model = tiny_model()  # context 32
    prompt = [5, 17, 3, 60, 2]
    new, stats = generate(model, prompt, 100, Sampling())
    assert new == reference_generate(model, prompt, 100, Sampling())
    assert stats.new_tokens == 100
    assert stats.target_forwards == 100  # a re-prefill stands in for the step it replaces
    assert stats.alpha is None


def test_sampling_matches_reference_draw_for_draw():
    model = tiny_model(seed=3)
    sampling = Sampling(temperature=0.9, top_k=20, top_p=0.9)
    new, _ = generate(model, [1, 2, 3], 70, sampling, torch.Generator().manual_seed(7))
    assert new == reference_generate(model, [1, 2, 3], 70, sampling, torch.Generator().manual_seed(7))


def test_streams_each_token_as_it_comes():
    seen = []
    new, stats = generate(tiny_model(), [1], 10, Sampling(), on_token=lambda t, source: seen.append((t, source)))
    assert seen == [(t, "target") for t in new] and stats.tau == 1.0 and stats.target_forwards == 10
