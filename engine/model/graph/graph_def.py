"""An unmodified model as a sequence of blocks: the subgraphs of its traced graph.

``GraphModel`` builds the model on the meta device, traces it for one micro-batch
shape, shards the graph (Merak Alg. 1 and 2) and finds the parameters that several
subgraphs share (a tied embedding and LM head). ``block(i)`` materialises subgraph
``i`` alone: from the pretrained safetensors when given, else from a seed per block
(a tied group from its own seed), so no rank holds more than its own stage.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import torch

from jobctl.engine.model.graph import boundary
from jobctl.engine.model.graph.batch import example_inputs, infer_task
from jobctl.engine.model.graph.shard import Shard, shards
from jobctl.engine.model.graph.source import (
    GraphModelConfig,
    build_model,
    factory_model,
    param_tensors,
    repeated_layers,
)
from jobctl.engine.model.graph.subgraph import Subgraph
from jobctl.engine.model.graph.trace import trace
from jobctl.engine.model.graph.weights import can_init, init_block, read_pretrained

PREFIX = "model."  # the tracing wrapper's attribute holding the user's model


@dataclass(frozen=True)
class GraphTie:
    """Names of one tensor in different subgraphs: (block, name) pairs, first canonical."""

    members: tuple[tuple[int, str], ...]


class GraphModel:
    """A traced, sharded model; blocks are its subgraphs."""

    def __init__(self, cfg: GraphModelConfig, micro_batch: int) -> None:
        self.cfg = cfg
        self.model = build_model(cfg)
        self.task = cfg.task or infer_task(type(self.model).__name__) or "causal_lm"
        inputs = example_inputs(
            self.task, micro_batch, cfg.seq_len, config=getattr(self.model, "config", None)
        )
        self.gm = trace(self.model, inputs)
        layers = repeated_layers(self.model)
        self.shards: list[Shard] = shards(self.gm, cfg.subgraphs or layers + 2, layers)
        self.tensors = param_tensors(self.model)
        self.param_names = set(dict(self.model.named_parameters(remove_duplicate=False)))
        self.groups = _tie_groups(self.model)
        self.ties = self._ties()
        self.per_block = can_init(self.model, sorted(self.param_names))

    def shape_of(self, stage_name: str) -> tuple:
        """The shape of a stage parameter ``layers.<block>.<name>``."""
        return tuple(self.tensors[stage_name.split(".", 2)[2]].shape)

    def runner(self, block_ids: list[int]):
        """How a stage holding ``block_ids`` runs them (``runner.StageRunner``)."""
        from jobctl.engine.model.graph.runner import StageRunner

        return StageRunner(self, block_ids)

    @property
    def mask_id(self) -> int:
        """The masked-LM mask token: the config's ``mask_token_id``, else the last id."""
        config = getattr(self.model, "config", None)
        explicit = getattr(config, "mask_token_id", None)
        return int(explicit) if explicit is not None else int(getattr(config, "vocab_size", 1)) - 1

    @property
    def names(self) -> list[str]:
        """Each subgraph's name, from the model's module paths."""
        return [s.name for s in self.shards]

    def original(self, target: str) -> str:
        """The model's own name of a traced graph's attribute (a tied one's first name)."""
        name = target.removeprefix(PREFIX)
        return self.groups.get(name, name)

    def _ties(self) -> list[GraphTie]:
        users: dict[str, list[tuple[int, str]]] = {}
        for i, s in enumerate(self.shards):
            for target in s.params:
                name = self.original(target)
                users.setdefault(name, []).append((i, name))
        return [GraphTie(tuple(m)) for m in users.values() if len({b for b, _ in m}) > 1]

    def block(self, i: int, seed: int) -> Subgraph:
        """Subgraph ``i`` with its own weights only (CPU)."""
        shard = self.shards[i]
        names = [self.original(t) for t in shard.params]
        values = self._values(i, [n for n in names if n in self.param_names], seed)
        tensors = {}
        for target, name in zip(shard.params, names, strict=True):
            if name in self.param_names:
                tensors[target] = values[name]
            else:  # a buffer: real already (source.meta_parameters keeps buffers)
                tensors[target] = self.tensors[name]
        return Subgraph(self.gm, shard, tensors, self.original)

    def _values(self, i: int, params: list[str], seed: int) -> dict[str, torch.nn.Parameter]:
        """One ``nn.Parameter`` per distinct tensor, shared by its tied names."""
        if self.cfg.pretrained:
            wanted = {n: self._aliases(n) for n in params}
            shapes = {n: tuple(self.tensors[n].shape) for n in params}
            raw = read_pretrained(self.cfg.pretrained, wanted, shapes)
        elif self.per_block:
            raw = init_block(self.model, params, _block_seed(seed, i))
            for n in params:
                if n in self.groups:
                    raw[n] = self._tied_value(self.groups[n], seed)
        else:
            raw = self._whole_model(seed)
        # Master weights are fp32 whatever the file's dtype; training.precision casts.
        return {n: torch.nn.Parameter(raw[n].detach().clone().float()) for n in params}

    def _aliases(self, name: str) -> list[str]:
        key = self.groups.get(name)
        return [n for n, k in self.groups.items() if k == key and n != name] if key else []

    @functools.cache  # noqa: B019 -- one model per process; the cache lives with it
    def _tied_value(self, canonical: str, seed: int) -> torch.Tensor:
        tie_seed = _block_seed(seed, 1_000_000 + zlib.crc32(canonical.encode()))
        return init_block(self.model, [canonical], tie_seed)[canonical]

    @functools.cache  # noqa: B019 -- one model per process
    def _whole_model(self, seed: int) -> dict[str, torch.Tensor]:
        """Parameters that cannot be initialised alone: build the model whole, once."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_block_seed(seed, 0))
            model = factory_model(self.cfg)
        return {n: p for n, p in model.named_parameters(remove_duplicate=False)}

    def boundary_of(self, values: list[torch.Tensor]) -> boundary.Boundary:
        """The carrier layout of the values one subgraph hands the next."""
        return boundary.describe(values)


def _tie_groups(model: torch.nn.Module) -> dict[str, str]:
    """Each tied parameter name -> its group's canonical (first) name."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {n: names[0] for names in by_id.values() if len(names) > 1 for n in names}


def _block_seed(seed: int, i: int) -> int:
    return (seed * 1_000_003 + i * 7919 + 17) % (2**62)
