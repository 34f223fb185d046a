"""Training data addressed by a global sample index.

Every sample is a pure function of its index, so any rank can fetch exactly the
samples of its micro-batches without talking to anyone, and a resumed run continues
from the next sample index whatever the new layout is (Varuna's morphing keeps the
global batch and the sample order fixed).

Sample order: step ``t`` trains on samples ``[t*B, (t+1)*B)``. Data-parallel replica
``d`` of ``D`` takes the ``d``-th contiguous run of whole micro-batches of ``m``:
``(B/m) // D`` of them, one more for the first ``(B/m) % D`` replicas (any D). File
sources (``tokens``, ``hf``) map a global index to a sequence through a seeded
per-epoch block-structured shuffle (``order``); ``synthetic`` and ``text`` compute
the sample from the index itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from jobctl.engine.data.packed import PackedData, Split, split
from jobctl.engine.data.tokens import TokenFile, is_url
from jobctl.spec import JobSpec


class TokenData:
    """Next-token samples: ``(input[seq_len], target[seq_len])`` for any index."""

    def __init__(
        self, source: str, seq_len: int, vocab: int, seed: int = 0, path: str | None = None
    ):
        self.source = source
        self.seq_len = seq_len
        self.vocab = vocab
        self.seed = seed
        self._bytes: torch.Tensor | None = None
        self._successor: list[int] | None = None
        if source == "text":
            raw = Path(path or "").read_bytes()
            if len(raw) < seq_len + 2:
                raise ValueError(
                    f"data.path {path}: needs at least {seq_len + 2} bytes, has {len(raw)}"
                )
            if vocab < 256:
                raise ValueError("data.source text uses byte tokens: model.vocab must be >= 256")
            self._bytes = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()

    size = None  # no epochs: every index is a fresh sample

    def epoch(self, index: int) -> int:
        """Always 0: these sources never run out."""
        return 0

    def sequence(self, index: int) -> torch.Tensor:
        """``seq_len + 1`` tokens of sample ``index``."""
        n = self.seq_len + 1
        if self._bytes is not None:
            span = len(self._bytes) - n
            start = (index * 7919 * self.seq_len) % (span + 1)
            return self._bytes[start : start + n]
        return self._synthetic(index, n)

    def _synthetic(self, index: int, n: int) -> torch.Tensor:
        # A sparse Markov chain (a fixed random successor per token, 10 % noise): a
        # learnable structure, so the loss visibly falls within a few dozen steps.
        # The chain walks in Python ints (a tensor index per token costs ten times more):
        # the same tokens, fetched on the pipeline's critical path every micro-batch.
        if self._successor is None:
            g0 = torch.Generator().manual_seed(self.seed)
            self._successor = torch.randperm(self.vocab, generator=g0).tolist()
        succ = self._successor
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        noise = (torch.rand(n, generator=g) < 0.1).tolist()
        tok = torch.randint(0, self.vocab, (n,), generator=g).tolist()
        for t in range(1, n):
            if not noise[t]:
                tok[t] = succ[tok[t - 1]]
        return torch.tensor(tok, dtype=torch.long)

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of samples ``[start, start + count)``."""
        seqs = torch.stack([self.sequence(start + k) for k in range(count)])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


@dataclass(frozen=True)
class Sharding:
    """Which samples a replica's micro-batches hold at a step."""

    global_batch: int
    replicas: int
    micro_batch: int

    @property
    def micro_batches(self) -> int:
        """Micro-batches of the busiest replica per step (the schedule's M).

        Any D: the global batch is N = B / m whole micro-batches, dealt so replica d
        takes N // D of them, one more for d < N % D (``count``). Every micro-batch's
        mean loss is weighted by its share of the global batch (``loss_scale``) and
        gradients are summed over replicas, so any D trains as one process does.
        """
        return -(-self.global_batch // self.micro_batch // self.replicas)

    def count(self, replica: int) -> int:
        """Micro-batches replica ``replica`` runs per step (N // D, or one more)."""
        n, D = self.global_batch // self.micro_batch, self.replicas
        return n // D + (replica < n % D)

    def first_sample(self, step: int, replica: int, micro: int) -> int:
        """Global index of the first sample of micro-batch ``micro`` of ``replica``."""
        n, D = self.global_batch // self.micro_batch, self.replicas
        before = replica * (n // D) + min(replica, n % D)  # micro-batches of replicas < d
        return step * self.global_batch + (before + micro) * self.micro_batch

    @property
    def loss_scale(self) -> float:
        """Weight of one micro-batch's mean loss in the global-batch mean."""
        return self.micro_batch / self.global_batch


Samples = TokenData | PackedData


def make_data(spec: JobSpec) -> Samples:
    """The training samples of a JobSpec."""
    d, m = spec.data, spec.model
    if d.source in ("synthetic", "text"):
        return TokenData(d.source, m.seq_len, m.vocab, d.seed, d.path)
    fraction = d.eval if isinstance(d.eval, float) else None
    remote = d.source == "tokens" and is_url(d.path or "")
    return PackedData(
        lambda: split(open_stream(spec, d.path), m.seq_len, fraction)[0],
        d.seed,
        d.shuffle,
        remote=remote,
        block_mb=d.block_mb,
        window=d.shuffle_window,
    )


def make_eval_data(spec: JobSpec) -> PackedData | None:
    """The validation samples (``data.eval``) in file order, or None without a split."""
    d, m = spec.data, spec.model
    if d.eval is None:
        return None

    def held() -> Split:
        if isinstance(d.eval, float):
            return split(open_stream(spec, d.path), m.seq_len, d.eval)[1]
        return Split(open_stream(spec, str(d.eval)), m.seq_len)

    return PackedData(held, d.seed, shuffle=False, traced=False, remote=False)


def open_stream(spec: JobSpec, path: str | None):
    """The token ids at ``path`` for the spec's source: a token file, or a tokenized
    dataset (``hf``)."""
    d = spec.data
    if d.source == "hf":
        from jobctl.engine.data.hf import tokenize_dataset

        return tokenize_dataset(path or "", d.tokenizer or "", d.text_column)
    return TokenFile(path or "", d.dtype, spec.model.vocab)
