"""A plain PyTorch reference of a job spec's training, written from jobctl's documentation.

``engine/worker/reference.py`` trains one process with jobctl's own data sharding,
optimizer builder, LR schedule and model blocks, so a bug in any of those passes every
parity test that compares against it. This module re-implements the documented
semantics instead (``docs/training.md`` states them) and imports nothing from jobctl:

* data (``docs/data.md``, ``spec/data.py``): ``data.source: tokens`` with ``data.shuffle:
  false`` -- a flat ``.bin`` token file; sequence ``k`` is the ``seq_len`` tokens from
  offset ``k * seq_len``, predicting the tokens one position later (nanoGPT's cut, which
  is what "as GPT training scripts write it" means: a sequence holds ``seq_len`` tokens
  and borrows its last target from the next one, so a file of ``n`` tokens holds
  ``(n - 1) // seq_len`` sequences); global sample ``i`` is sequence ``i mod N`` and
  step ``s`` reads samples ``[s B, (s + 1) B)``. The shuffled order's RNG is not
  documented precisely enough to re-implement, so the reference requires no shuffle.
* loss: the mean token cross-entropy over the whole global batch, computed here in one
  forward of all B samples -- the micro-batch size m, P and D must not change it.
* optimizer: ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` with the spec's lr, betas,
  weight decay (on every parameter: the spec documents one coefficient, no exemptions)
  and momentum; torch's defaults for what the spec does not name (eps 1e-8).
* LR schedule (``training.lr_schedule`` / ``warmup_steps``: "Peak learning rate",
  "Linear warmup steps", "schedule after warmup"): step ``s`` (0-based) of ``T`` trains
  at ``lr (s + 1) / W`` while ``s < W``, then ``lr`` (constant) or
  ``lr (1 + cos(pi (s - W) / (T - W))) / 2`` (cosine from the peak towards 0 at T).
* model: the builtin GPT family as a nanoGPT module written here (learned token and
  position embeddings, pre-LayerNorm blocks of causal multi-head self-attention and a
  4x GELU MLP, a final LayerNorm, the head tied to the token embedding); a Hugging Face
  model is ``transformers``' own class trained on its own loss (``labels = input_ids``).

Shared with jobctl: the spec's fields (read off the loaded spec object) and the
initial weights. For the builtin GPT the caller passes jobctl's initial weights from
``training.seed`` under jobctl's parameter names (:func:`gpt_name` maps them to this
module's); for a Hugging Face model both sides start from one ``save_pretrained``
directory that transformers wrote, so not even the initialisation is jobctl's.
Readings of the documentation that it leaves open (the sequence cut, the warmup's
``s + 1``, the cosine's end at 0, decay on every parameter, AdamW's eps) are stated
above: where jobctl differs from them, the comparison says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ReferenceRun:
    """What a plain run produced: the loss of every step (before its update) and the
    final weights under jobctl's parameter names."""

    losses: list[float]
    weights: dict[str, torch.Tensor]


# ---------------------------------------------------------------- data


class TokenSequences:
    """A flat token file cut into ``seq_len`` sequences with next-token targets."""

    def __init__(self, path: str | Path, seq_len: int, dtype: str = "uint16") -> None:
        self.ids = torch.from_numpy(np.fromfile(path, dtype=dtype).astype(np.int64))
        self.seq_len = seq_len
        self.count = (len(self.ids) - 1) // seq_len

    def batch(self, first: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of global samples ``[first, first + size)``: sample ``i`` is
        sequence ``i mod N`` (an epoch re-reads the unshuffled file from its start)."""
        starts = [(i % self.count) * self.seq_len for i in range(first, first + size)]
        x = torch.stack([self.ids[s : s + self.seq_len] for s in starts])
        y = torch.stack([self.ids[s + 1 : s + 1 + self.seq_len] for s in starts])
        return x, y


# ---------------------------------------------------------------- schedule and optimizer


def lr_at(step: int, training) -> float:
    """The learning rate of 0-based ``step``: linear warmup to the peak, then constant or
    a cosine from the peak down to 0 at the last step's end."""
    peak, warmup, total = training.lr, training.warmup_steps, training.steps
    if step < warmup:
        return peak * (step + 1) / warmup
    if training.lr_schedule == "constant":
        return peak
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(params, training) -> torch.optim.Optimizer:
    """torch's optimizer named by ``training.optimizer`` with the spec's settings."""
    if training.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=training.lr, momentum=training.momentum, weight_decay=training.weight_decay
        )
    kind = torch.optim.AdamW if training.optimizer == "adamw" else torch.optim.Adam
    return kind(
        params, lr=training.lr, betas=tuple(training.betas), weight_decay=training.weight_decay
    )


# ---------------------------------------------------------------- the builtin GPT


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        # Written out rather than F.scaled_dot_product_attention: the reference should not
        # depend on any fused kernel jobctl might also use.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.c_proj(out.transpose(1, 2).reshape(n, t, c))


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.c_proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    """nanoGPT with a tied head: tokens (n, t) -> logits (n, t, vocab)."""

    def __init__(self, model) -> None:
        super().__init__()
        if model.dropout or not model.tie_embeddings:
            raise ValueError("the plain GPT reference covers dropout 0 with tied embeddings")
        self.wte = nn.Embedding(model.vocab, model.hidden)
        self.wpe = nn.Embedding(model.seq_len, model.hidden)
        self.h = nn.ModuleList(Block(model.hidden, model.heads) for _ in range(model.layers))
        self.ln_f = nn.LayerNorm(model.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


JOBCTL_PARTS = {
    "ln_1": "ln1",
    "ln_2": "ln2",
    "attn.c_attn": "attn.qkv",
    "attn.c_proj": "attn.proj",
    "mlp.c_fc": "mlp.fc",
    "mlp.c_proj": "mlp.proj",
}


def gpt_name(name: str, layers: int) -> str:
    """jobctl's name of :class:`PlainGPT`'s parameter ``name``: blocks are numbered
    embedding 0, transformer layers 1..L, final norm L + 1 (``layers.<i>.*``)."""
    if name.startswith(("wte.", "wpe.")):
        return f"layers.0.{name}"
    if name.startswith("ln_f."):
        return f"layers.{layers + 1}.{name}"
    _, index, rest = name.split(".", 2)
    part, leaf = rest.rsplit(".", 1)
    return f"layers.{int(index) + 1}.{JOBCTL_PARTS[part]}.{leaf}"


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def own_causal_lm_loss(model: nn.Module, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    # A Hugging Face causal LM's own loss: labels are the inputs, shifted inside the model.
    return model(input_ids=x, labels=x).loss


# ---------------------------------------------------------------- training


def train(
    model: nn.Module, loss_fn: LossFn, data: TokenSequences, training, name: Callable[[str], str]
) -> ReferenceRun:
    """``training.steps`` plain steps of ``model`` on ``data``; ``name`` maps a parameter's
    name here to jobctl's."""
    torch.set_num_threads(1)  # the host's 2 cores run jobctl's workers too
    optimizer = make_optimizer(model.parameters(), training)
    B, losses = training.global_batch_size, []
    for step in range(training.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, training)
        x, y = data.batch(step * B, B)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, x, y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    weights = {name(n): p.detach().clone() for n, p in model.named_parameters()}
    return ReferenceRun(losses, weights)


def check_spec(spec) -> None:
    """Refuse what this reference does not model rather than silently differ."""
    t, d = spec.training, spec.data
    if d.source != "tokens" or d.shuffle:
        raise ValueError("the reference reads unshuffled token files (data.shuffle: false)")
    if t.precision != "fp32":
        raise ValueError("the reference trains in fp32")


def token_file(spec) -> TokenSequences:
    """The spec's token file, of the spec's ``data.dtype``; ``auto`` as documented: uint32
    above 65,536 ids, uint16 when the file is not whole uint32 ids or its uint32 ids leave
    the vocabulary, else refused (here: the reference refuses every undecided file)."""
    dtype, vocab, path = spec.data.dtype, spec.model.vocab, spec.data.path
    if dtype == "auto":
        size = Path(path).stat().st_size
        wide = vocab > 65536 or (size % 4 == 0 and np.fromfile(path, np.uint32).max() < vocab)
        if wide and vocab <= 65536:
            raise ValueError(f"{path}: dtype auto is ambiguous; the reference refuses it too")
        dtype = "uint32" if wide else "uint16"
    return TokenSequences(path, spec.model.seq_len, dtype)


def train_gpt(spec, initial: dict[str, torch.Tensor]) -> ReferenceRun:
    """The builtin GPT of ``spec`` from ``initial`` (jobctl's names), trained plainly."""
    check_spec(spec)
    torch.set_num_threads(1)
    model = PlainGPT(spec.model)
    layers = spec.model.layers
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(initial[gpt_name(n, layers)])
    data = token_file(spec)
    return train(model, next_token_loss, data, spec.training, lambda n: gpt_name(n, layers))


def train_hf_causal_lm(spec, pretrained: str | Path) -> ReferenceRun:
    """``spec``'s Hugging Face causal LM, loaded by ``transformers`` from the
    ``save_pretrained`` directory the run starts from, trained on its own loss."""
    import transformers

    check_spec(spec)
    torch.set_num_threads(1)
    cls = getattr(transformers, spec.model.huggingface.class_)
    model = cls.from_pretrained(pretrained).train()
    data = token_file(spec)
    return train(model, own_causal_lm_loss, data, spec.training, lambda n: n)
