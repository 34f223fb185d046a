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
from pathlib import Path

import torch

from jobctl.engine.model.blocks import block_seed
from jobctl.engine.model.graph import cache
from jobctl.engine.model.graph.batch import example_inputs, infer_task
from jobctl.engine.model.graph.mask_token import mask_id
from jobctl.engine.model.graph.shard import shards
from jobctl.engine.model.graph.source import (
    GraphModelConfig,
    build_model,
    factory_model,
    param_tensors,
    repeated_layers,
)
from jobctl.engine.model.graph.subgraph import Subgraph, repoint_devices
from jobctl.engine.model.graph.trace import PREFIX, trace_fake
from jobctl.engine.model.graph.weights import can_init, init_block, read_pretrained


@dataclass(frozen=True)
class GraphTie:
    """Names of one tensor in different subgraphs: (block, name) pairs, first canonical."""

    members: tuple[tuple[int, str], ...]


class GraphModel:
    """A traced, sharded model; blocks are its subgraphs."""

    def __init__(self, cfg: GraphModelConfig, micro_batch: int) -> None:
        self.cfg = cfg
        k = cache.key(describe(cfg, micro_batch)) if cacheable(cfg) else None
        traced = cache.load(k) if k else None
        if traced is None:
            traced = self._trace(micro_batch)
            if k:
                cache.save(k, traced)
        self.gm, self.shards, self.task = traced.gm, traced.shards, traced.task
        self.shapes, self.groups, self.config = traced.shapes, traced.groups, traced.config
        self.literals = traced.literals  # lifted tensors made from Python values in forward
        self.param_names = {n for n, (_, _, param) in self.shapes.items() if param}
        self.ties = self._ties()

    def _trace(self, micro_batch: int) -> cache.Traced:
        model = self.model
        task = self.cfg.task or infer_task(type(model).__name__) or "causal_lm"
        config = config_fields(model)
        labels = self.cfg.loss == "auto"  # a named loss: the model returns logits

        def inputs(device: str) -> dict:
            made = example_inputs(task, micro_batch, self.cfg.seq_len, device, config)
            return made if labels else {k: v for k, v in made.items() if k != "labels"}

        gm, literals = trace_fake(model, inputs)
        layers = repeated_layers(model)
        found = shards(gm, self.cfg.subgraphs or 2 * layers + 2, layers)
        params = set(dict(model.named_parameters(remove_duplicate=False)))
        shapes = {
            n: (tuple(t.shape), t.dtype, n in params) for n, t in param_tensors(model).items()
        }
        for target in {n.target for n in gm.graph.nodes if n.op == "get_attr"}:
            name = target.removeprefix(PREFIX)  # a lifted tensor: a buffer's entry
            if name not in shapes:
                value = literals[name] if name in literals else _attribute(model, name)
                shapes[name] = (tuple(value.shape), value.dtype, False)
        return cache.Traced(gm, found, shapes, _tie_groups(model), task, config, literals)

    @functools.cached_property
    def model(self) -> torch.nn.Module:
        """The user's model with meta parameters (built when weights are first needed)."""
        return build_model(self.cfg)

    def meta_tensor(self, name: str) -> torch.Tensor:
        """A parameter or buffer as a meta tensor (a parameter requires grad)."""
        shape, dtype, param = self.shapes[name]
        return torch.empty(shape, dtype=dtype, device="meta", requires_grad=param)

    def shape_of(self, stage_name: str) -> tuple:
        """The shape of a stage parameter ``layers.<block>.<name>``."""
        return self.shapes[stage_name.split(".", 2)[2]][0]

    def runner(self, block_ids: list[int]):
        """How a stage holding ``block_ids`` runs them (``runner.StageRunner``)."""
        from jobctl.engine.model.graph.runner import StageRunner

        return StageRunner(self, block_ids)

    @property
    def mask_id(self) -> int | None:
        """The masked-LM mask token (``mask_token.mask_id``: the spec's, the config's, the
        saved tokenizer's, or a from-scratch model's last id); None for another task."""
        if self.task != "masked_lm":
            return None
        found = mask_id(self.cfg.mask_token_id, self.config, self.cfg.pretrained)
        if found is None:  # validate refuses this model (checks.mask_violations)
            raise ValueError(f"{self.cfg.pretrained}: no mask token; set model.mask_token_id")
        return found

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
            else:  # a buffer or lifted tensor: real (source.meta_parameters keeps them)
                tensors[target] = self.literals.get(name)
                if tensors[target] is None:
                    tensors[target] = _attribute(self.model, name)
        sub = Subgraph(self.gm, shard, tensors, self.original)
        repoint_devices(sub, torch.device("cpu"))  # where its weights are; a stage moves it
        return sub

    def _values(self, i: int, params: list[str], seed: int) -> dict[str, torch.nn.Parameter]:
        """One ``nn.Parameter`` per distinct tensor, shared by its tied names."""
        if self.cfg.pretrained:
            wanted = {n: self._aliases(n) for n in params}
            shapes = {n: self.shapes[n][0] for n in params}
            raw = read_pretrained(self.cfg.pretrained, wanted, shapes, self.model)
        elif can_init(self.model, params):
            raw = init_block(self.model, params, block_seed(seed, i))
            for n in params:
                if n in self.groups:
                    raw[n] = self._tied_value(self.groups[n], seed)
        else:
            whole = self._whole_model(seed)  # shared by every block: copy out of it
            raw = {n: whole[n].detach().clone() for n in params}
        # Master weights are fp32 whatever the file's dtype; training.precision casts.
        # Each tensor here is fresh (nothing else holds it), so it becomes the
        # parameter without a copy: a stage's peak stays at its own weights.
        return {n: torch.nn.Parameter(raw[n].detach().float()) for n in params}

    def _aliases(self, name: str) -> list[str]:
        key = self.groups.get(name)
        return [n for n, k in self.groups.items() if k == key and n != name] if key else []

    def _tied_value(self, canonical: str, seed: int) -> torch.Tensor:
        tie_seed = block_seed(seed, 1_000_000 + zlib.crc32(canonical.encode()))
        return init_block(self.model, [canonical], tie_seed)[canonical]

    @functools.cache  # noqa: B019 -- one model per process
    def _whole_model(self, seed: int) -> dict[str, torch.Tensor]:
        """Parameters that cannot be initialised alone: build the model whole, once."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(block_seed(seed, 0))
            model = factory_model(self.cfg)
        return {n: p for n, p in model.named_parameters(remove_duplicate=False)}


def cacheable(cfg: GraphModelConfig) -> bool:
    """Only a Hugging Face class is cached: its code is pinned by the transformers
    version in the key; a user factory's code may change under the same name."""
    return cfg.hf_class is not None


def describe(cfg: GraphModelConfig, micro_batch: int) -> dict:
    """What the trace depends on (the config file's content, not its path)."""
    config = cfg.hf_config
    source = cfg.hf_config_path or (f"{cfg.pretrained}/config.json" if cfg.pretrained else None)
    if source:
        config = Path(source).read_text()
    return {
        "class": cfg.hf_class,
        "config": config,
        "task": cfg.task,
        "m": micro_batch,
        "seq_len": cfg.seq_len,
        "subgraphs": cfg.subgraphs,
        "loss": cfg.loss,
    }


def config_fields(model: torch.nn.Module) -> dict:
    """The model config's fields the batches need (image shape, vocabulary, mask id)."""
    config = getattr(model, "config", None)
    names = ("num_channels", "image_size", "vocab_size", "mask_token_id", "num_labels")
    return {n: getattr(config, n) for n in names if getattr(config, n, None) is not None}


def _tie_groups(model: torch.nn.Module) -> dict[str, str]:
    """Each tied parameter name -> its group's canonical (first) name."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {n: names[0] for names in by_id.values() if len(names) > 1 for n in names}


def _attribute(model: torch.nn.Module, name: str) -> torch.Tensor:
    """The tensor at the dotted ``name`` of ``model``: a buffer, or an attribute it
    computed at construction (GPT-J's sin/cos table) that the trace lifted."""
    owner, _, leaf = name.rpartition(".")
    return getattr(model.get_submodule(owner) if owner else model, leaf)
