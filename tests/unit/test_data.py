"""Samples are a pure function of their index; sharding covers each batch once."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.data.dataset import Sharding, TokenData


def test_samples_are_deterministic_and_shifted():
    d = TokenData("synthetic", seq_len=16, vocab=64, seed=3)
    x1, y1 = d.batch(10, 4)
    x2, y2 = TokenData("synthetic", seq_len=16, vocab=64, seed=3).batch(10, 4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (4, 16) and x1.dtype == torch.long
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(TokenData("synthetic", 16, 64, seed=4).batch(10, 4)[0], x1)
    assert int(x1.max()) < 64


@pytest.mark.parametrize(("B", "D", "m"), [(16, 1, 16), (16, 2, 2), (16, 4, 1), (12, 3, 2)])
def test_sharding_covers_each_sample_once(B, D, m):
    s = Sharding(B, D, m)
    for step in (0, 5):
        seen = sorted(
            s.first_sample(step, d, i) + k
            for d in range(D)
            for i in range(s.micro_batches)
            for k in range(m)
        )
        assert seen == list(range(step * B, (step + 1) * B))
    assert s.loss_scale * s.micro_batches * D == pytest.approx(1.0)


@pytest.mark.parametrize(("B", "D", "m"), [(16, 3, 1), (16, 3, 2), (8192, 7, 1), (10, 4, 1)])
def test_any_d_deals_whole_micro_batches_once(B, D, m):
    s = Sharding(B, D, m)
    counts = [s.count(d) for d in range(D)]
    assert sum(counts) * m == B and max(counts) - min(counts) <= 1
    assert s.micro_batches == max(counts)
    seen = sorted(
        s.first_sample(2, d, i) + k for d in range(D) for i in range(counts[d]) for k in range(m)
    )
    assert seen == list(range(2 * B, 3 * B))
    assert s.loss_scale * sum(counts) == pytest.approx(1.0)


def test_text_source_reads_bytes(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_bytes(bytes(range(256)) * 4)
    d = TokenData("text", seq_len=8, vocab=256, path=str(p))
    x, y = d.batch(0, 2)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="vocab must be >= 256"):
        TokenData("text", seq_len=8, vocab=100, path=str(p))
