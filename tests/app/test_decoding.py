"""Decoding (`app/decoding.py`): the sampling rule that `generate`, `serve` and the decode
benchmark share, greedy at temperature zero, restricted by top_k, seeded, and the same for a
row of a batch as for that request alone."""

from __future__ import annotations

import torch

from sru_lightning.app.decoding import sample, sample_rows


def test_sampling_is_greedy_at_temperature_zero_restricted_by_top_k_and_seeded():
    logits = torch.randn(4, 50)
    best = logits.argmax(-1)
    generator = torch.Generator()
    assert torch.equal(sample(logits, 0.0, 0, generator), best)
    assert torch.equal(sample(logits, 5.0, 1, generator), best)
    top3 = logits.topk(3, dim=-1).indices
    draws = torch.stack([sample(logits, 10.0, 3, generator) for _ in range(50)], dim=1)
    assert all(set(row.tolist()) <= set(allowed.tolist()) for row, allowed in zip(draws, top3))
    first = [sample(logits, 1.0, 0, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(first[0], first[1])


def test_sampling_rows_together_draws_what_each_row_draws_alone():
    logits = torch.randn(7, 50, generator=torch.Generator().manual_seed(3)) * 3
    temperatures = [0.8, 0, 1.3, 0.8, 0.5, 0, 1.0]
    top_ks = [0, 0, 5, 0, 0, 3, 49]
    for seed in range(20):
        alone = [
            int(sample(logits[r : r + 1], temperatures[r], top_ks[r], torch.Generator().manual_seed(seed + r))[0])
            for r in range(7)
        ]
        generators = [torch.Generator().manual_seed(seed + r) for r in range(7)]
        together = sample_rows(logits, temperatures, top_ks, generators).tolist()
        assert together == alone, seed


def test_top_p_draws_only_from_the_smallest_set_of_likeliest_tokens_reaching_it():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.7 keeps the first two (0.5 < 0.7 <= 0.8)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    generator = torch.Generator().manual_seed(0)
    draws = {int(sample(logits, 1.0, 0, generator, top_p=0.7)) for _ in range(300)}
    assert draws == {0, 1}
    assert {int(sample(logits, 1.0, 0, generator, top_p=0.5)) for _ in range(100)} == {0}
    assert {int(sample(logits, 1.0, 0, generator, top_p=0.01)) for _ in range(100)} == {0}
    assert {int(sample(logits, 1.0, 0, generator, top_p=0.81)) for _ in range(500)} == {0, 1, 2}
    # with top_k, the nucleus is taken among the top_k tokens' renormalised probabilities
    assert {int(sample(logits, 1.0, 3, generator, top_p=0.99)) for _ in range(500)} == {0, 1, 2}
    # top_p=1 draws what sampling without it draws
    one = [int(sample(logits, 1.0, 0, torch.Generator().manual_seed(s), top_p=1.0)) for s in range(20)]
    assert one == [int(sample(logits, 1.0, 0, torch.Generator().manual_seed(s))) for s in range(20)]


def test_rows_with_top_p_draw_together_what_they_draw_alone():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(4)) * 3
    temperatures, top_ks, top_ps = [0.8, 1.0, 1.2, 0, 1.0], [0, 0, 5, 0, 0], [0.9, 1.0, 0.5, 0.3, 0.2]
    for seed in range(10):
        alone = [
            int(
                sample(
                    logits[r : r + 1], temperatures[r], top_ks[r], torch.Generator().manual_seed(seed + r), top_ps[r]
                )
            )
            for r in range(5)
        ]
        generators = [torch.Generator().manual_seed(seed + r) for r in range(5)]
        assert sample_rows(logits, temperatures, top_ks, generators, top_ps).tolist() == alone, seed
