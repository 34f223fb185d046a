"""Models as sequences of blocks: the builtin GPT family and user factories.

A model is a list of blocks; the boundaries between blocks are the cut-points (Varuna
sec. 5.1). A pipeline stage owns a contiguous run of blocks and keeps the unsplit
model's parameter names (``layers.<block>.<...>``) so checkpoints are independent of
the partition. Every block is initialised from its own seed, so a stage builds only
its own blocks and still gets exactly the weights a single process would.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint


class Embedding(nn.Module):
    """Token + position embedding (block 0 of the GPT family)."""

    def __init__(self, vocab: int, hidden: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.drop = nn.Dropout(dropout)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.drop(self.wte(tokens) + self.wpe(pos))


class Attention(nn.Module):
    """Causal multi-head self-attention."""

    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(x)
        # sized by q/k/v's own width: a tensor-parallel rank holds heads / T of them
        c = qkv.shape[2] // 3
        q, k, v = qkv.split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    """Position-wise feed-forward network (4x expansion, GELU)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = Mlp(hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class Head(nn.Module):
    """Final norm + language-model head; its weight may be tied to the embedding."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(hidden)
        self.weight = nn.Parameter(torch.empty(vocab, hidden))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.weight)


@dataclass(frozen=True)
class Tie:
    """Two parameters that are one: ``alias`` (on a later block) mirrors ``canonical``."""

    canonical: str
    alias: str


@dataclass
class ModelDef:
    """How to build any block of a model, and what ties its blocks together."""

    num_blocks: int
    build: Callable[[int], nn.Module]
    ties: list[Tie] = field(default_factory=list)
    seed: int = 0
    names: list[str] = field(default_factory=list)
    graph: object | None = None  # a traced model's GraphModel (model/graph), if any

    def tie_shapes(self) -> dict[str, tuple]:
        """Each tie's shape by canonical name (a traced model's; the builtin GPT's tie is
        held by every rank of its group, which needs none)."""
        if self.graph is None:
            return {}
        return {t.canonical: self.graph.shape_of(t.canonical) for t in self.ties}

    def block(self, i: int) -> nn.Module:
        """Block ``i`` initialised from its own seed (independent of the partition)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(block_seed(self.seed, i))
            return self.build(i)


def block_seed(seed: int, i: int) -> int:
    """Seed of block ``i``: a fixed mix so stages agree without talking."""
    return (seed * 1_000_003 + i * 7919 + 17) % (2**62)


def gpt_def(
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    vocab: int,
    dropout: float = 0.0,
    tie_embeddings: bool = True,
    seed: int = 0,
) -> ModelDef:
    """The builtin GPT family: embedding, ``layers`` transformer blocks, head."""
    last = layers + 1

    def build(i: int) -> nn.Module:
        if i == 0:
            return Embedding(vocab, hidden, seq_len, dropout)
        if i == last:
            head = Head(vocab, hidden)
            if tie_embeddings:  # same init as the embedding it mirrors
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(block_seed(seed, 0))
                    head.weight.data.copy_(Embedding(vocab, hidden, seq_len, 0.0).wte.weight)
            return head
        return Block(hidden, heads, dropout)

    ties = [Tie("layers.0.wte.weight", f"layers.{last}.weight")] if tie_embeddings else []
    names = ["embed"] + [f"block{i}" for i in range(1, last)] + ["head"]
    return ModelDef(layers + 2, build, ties, seed, names)


def import_def(target: str, args: dict, seed: int = 0, micro_batch: int = 1, **graph) -> ModelDef:
    """A user model: ``pkg.module:factory`` returning a list of blocks or one ``nn.Module``.

    A list is the hand-cut form (each block takes and returns one tensor); a module is
    traced and sharded into subgraphs (``model.graph``).
    """
    from jobctl.engine.model.graph.source import GraphModelConfig, build_model

    cfg = GraphModelConfig(import_=target, args=dict(args), seed=seed, **graph)
    probe = build_model(cfg) if not returns_list(target, args) else None
    if probe is not None:
        return graph_model_def(cfg, micro_batch)
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(block_seed(seed, 0))
        blocks = list(factory(**args))
    if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
        raise ValueError(f"model.import {target!r} must return a non-empty list of nn.Module")
    names = [type(b).__name__.lower() for b in blocks]
    return ModelDef(len(blocks), lambda i: blocks[i], [], seed, names)


def returns_list(target: str, args: dict) -> bool:
    """Whether the factory returns the hand-cut form (a list or tuple of blocks)."""
    from jobctl.engine.model.graph.source import GraphModelConfig, factory_model, meta_parameters

    with meta_parameters():
        made = factory_model(GraphModelConfig(import_=target, args=dict(args)))
    return isinstance(made, (list, tuple))


def graph_model_def(cfg, micro_batch: int) -> ModelDef:
    """A traced model's ModelDef: block ``i`` is subgraph ``i`` (``model.graph``)."""
    from jobctl.engine.model.graph.graph_def import GraphModel

    g = GraphModel(cfg, micro_batch)
    ties = [
        Tie(f"layers.{t.members[0][0]}.{t.members[0][1]}", f"layers.{b}.{name}")
        for t in g.ties
        for b, name in t.members[1:]
    ]
    return ModelDef(len(g.shards), lambda i: g.block(i, cfg.seed), ties, cfg.seed, g.names, g)


def model_def(spec_model, seed: int, micro_batch: int = 1) -> ModelDef:
    """ModelDef for a spec's ``model`` section (a traced one for ``micro_batch``)."""
    m = spec_model
    hf = getattr(m, "huggingface", None)
    if hf is not None:
        from jobctl.engine.model.graph.remote import localized
        from jobctl.engine.model.graph.source import GraphModelConfig

        cfg = GraphModelConfig(
            hf_class=hf.class_,
            hf_config=dict(hf.config or {}) or None,
            hf_config_path=hf.config_path,
            pretrained=localized(hf.pretrained),
            task=m.task,
            loss=m.loss,
            mask_token_id=getattr(m, "mask_token_id", None),
            seq_len=m.seq_len,
            subgraphs=m.subgraphs,
            seed=seed,
        )
        return graph_model_def(cfg, micro_batch)
    if m.import_:
        extra = {"task": m.task, "seq_len": m.seq_len, "subgraphs": m.subgraphs, "loss": m.loss}
        extra["mask_token_id"] = getattr(m, "mask_token_id", None)
        return import_def(m.import_, dict(m.import_args), seed, micro_batch, **extra)
    shape = (m.layers, m.hidden, m.heads, m.seq_len, m.vocab, m.dropout, m.tie_embeddings)
    return gpt_def(*shape, seed)


class Stage(nn.Module):
    """The blocks one pipeline stage owns, under the unsplit model's names."""

    def __init__(self, mdef: ModelDef, blocks: Iterable[int], keep: int | None = None) -> None:
        super().__init__()
        self.block_ids = list(blocks)
        # Stage-aware recomputation (Merak sec. 5.2): blocks past the first ``keep`` run
        # under activation checkpointing (their input kept, recomputed in backward).
        self.keep = keep
        self.layers = nn.ModuleDict({str(i): mdef.block(i) for i in self.block_ids})
        # A traced model's runner (model/graph/runner); plain attribute, not a submodule.
        self.graph = None if mdef.graph is None else mdef.graph.runner(self.block_ids)
        for tie in mdef.ties:  # co-located ties share one Parameter, as in a single process
            if self.has_param(tie.canonical) and self.has_param(tie.alias):
                self._set_param(tie.alias, self.get_parameter(tie.canonical))

    def has_param(self, name: str) -> bool:
        return name in dict(self.named_parameters(remove_duplicate=False))

    def _set_param(self, name: str, param: nn.Parameter) -> None:
        owner, _, leaf = name.rpartition(".")
        setattr(self.get_submodule(owner), leaf, param)

    def forward(self, x: torch.Tensor | None, batch: dict | None = None) -> torch.Tensor:
        """This stage's output: the next stage's input, or (last stage) the logits or,
        for a traced model that computes its own, the loss."""
        if self.graph is not None:
            return self.graph.forward(self, x, batch)
        kept, rest = self.split_kept()
        for i in kept:
            x = self.layers[str(i)](x)
        if rest:
            x = checkpoint(self._run, rest, x, use_reentrant=False)
        return x

    def split_kept(self) -> tuple[list[int], list[int]]:
        """The blocks that keep activations, and those recomputed in backward."""
        k = len(self.block_ids) if self.keep is None else self.keep
        return self.block_ids[:k], self.block_ids[k:]

    def _run(self, blocks: list[int], x: torch.Tensor) -> torch.Tensor:
        for i in blocks:
            x = self.layers[str(i)](x)
        return x

    def batch(self, x: torch.Tensor, y: torch.Tensor, first: int) -> dict | None:
        """A traced model's keyword arguments for tokens ``x`` -> ``y`` (None: builtin)."""
        return None if self.graph is None else self.graph.batch(x, y, first)

    def loss(self, out: torch.Tensor, y: torch.Tensor, batch: dict | None = None) -> torch.Tensor:
        """The last stage's micro-batch loss."""
        return self.graph.loss(out, y, batch) if self.graph is not None else lm_loss(out, y)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over one micro-batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def param_count(module: nn.Module) -> int:
    """Number of distinct parameter elements."""
    return sum(p.numel() for p in module.parameters())
