import torch

from decode.sampling import Sampling, next_token, token_probs

LOGITS = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64))


def test_greedy_is_one_hot_argmax():
    assert token_probs(LOGITS, Sampling()).tolist() == [0, 1, 0, 0]
    assert next_token(LOGITS, Sampling()) == 1


def test_temperature_one_is_softmax():
    torch.testing.assert_close(token_probs(LOGITS, Sampling(temperature=1.0)), LOGITS.exp())


def test_top_k_keeps_the_k_most_likely():
    probs = token_probs(LOGITS, Sampling(temperature=1.0, top_k=2))
    torch.testing.assert_close(probs, torch.tensor([0, 0.4, 0, 0.3], dtype=torch.float64) / 0.7)


def test_top_p_keeps_the_smallest_set_reaching_p():
    # sorted: 0.4, 0.3, 0.2, 0.1; 0.4 + 0.3 = 0.7 >= 0.65, so two tokens stay
    probs = token_probs(LOGITS, Sampling(temperature=1.0, top_p=0.65))
    torch.testing.assert_close(probs, torch.tensor([0, 0.4, 0, 0.3], dtype=torch.float64) / 0.7)
    # a tiny p still keeps the most likely token
    assert token_probs(LOGITS, Sampling(temperature=1.0, top_p=1e-9)).tolist() == [0, 1, 0, 0]


def test_sampling_follows_the_distribution():
    gen = torch.Generator().manual_seed(0)
    draws = [next_token(LOGITS, Sampling(temperature=1.0), gen) for _ in range(4000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4) / 4000
    torch.testing.assert_close(freq, LOGITS.exp().float(), rtol=0, atol=0.03)
