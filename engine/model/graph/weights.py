"""Where a subgraph's weights come from: a layout-independent init, or safetensors.

``init_block`` materialises only the modules that own a subgraph's parameters, then
runs the model's own initialisation on them (a Hugging Face model's ``_init_weights``
over the owners and their ancestors, children first as ``post_init`` does; an
ordinary module's ``reset_parameters``) under the block's seed, so the weights do not
depend on which stage builds them. A tied group is initialised once from its own
seed and every member takes that value. ``read_pretrained`` reads only the named
tensors from a local directory of ``*.safetensors`` (sharded index included), in the
layout transformers converts from (``conversion``); ``check_pretrained`` checks their
shapes from the headers alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from jobctl.engine.model.graph.conversion import DiskLayout
from jobctl.engine.model.graph.source import ModelSourceError


def owners(names: list[str]) -> list[str]:
    """The modules that own ``names`` directly."""
    return sorted({n.rpartition(".")[0] for n in names})


def ancestry(module_names: list[str]) -> list[str]:
    """The modules and all their ancestors, children before parents."""
    found: set[str] = set()
    for name in module_names:
        parts = name.split(".") if name else []
        for k in range(len(parts), -1, -1):
            found.add(".".join(parts[:k]))
    return sorted(found, key=lambda n: (-n.count(".") if n else 1, n))


def can_init(model: nn.Module, params: list[str]) -> bool:
    """Whether each owner of ``params`` can be initialised on its own."""
    if hasattr(model, "_init_weights"):
        return True
    return all(hasattr(model.get_submodule(o), "reset_parameters") for o in owners(params))


def init_block(model: nn.Module, params: list[str], seed: int) -> dict[str, torch.Tensor]:
    """Fresh values of ``params`` (meta in ``model``), from ``seed``."""
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    for owner in owners(params):
        mod = model.get_submodule(owner)
        for leaf, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                swapped.append((mod, leaf, p))
                fresh = torch.empty_like(p, device="cpu")
                mod._parameters[leaf] = nn.Parameter(fresh, requires_grad=p.requires_grad)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _run_init(model, owners(params))
        return {n: model.get_parameter(n).detach() for n in params}
    finally:
        for mod, leaf, p in swapped:
            mod._parameters[leaf] = p


def _run_init(model: nn.Module, owner_names: list[str]) -> None:
    hf_init = getattr(model, "_init_weights", None)
    for name in ancestry(owner_names) if hf_init else owner_names:
        mod = model.get_submodule(name)
        with torch.no_grad():
            if hf_init is not None:
                hf_init(mod)
            elif hasattr(mod, "reset_parameters"):
                mod.reset_parameters()


def weight_files(directory: str) -> dict[str, Path]:
    """Tensor name -> safetensors file of a local pretrained directory."""
    root = Path(directory)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: root / file for name, file in weight_map.items()}
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelSourceError(
            f"model.huggingface.pretrained {directory!r} has no *.safetensors files",
            "point it at a directory written by save_pretrained (safetensors format)",
        )
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            out.update(dict.fromkeys(handle.keys(), f))
    return out


def read_pretrained(
    directory: str, wanted: dict[str, list[str]], shapes: dict[str, tuple], model: nn.Module
) -> dict[str, torch.Tensor]:
    """Read each wanted tensor (by any of its tied names) from the directory, converted
    from its disk layout as ``from_pretrained`` converts it (``conversion``)."""
    from safetensors import safe_open

    files = weight_files(directory)
    layout = DiskLayout(model, list(files))
    sources = {n: _source(directory, layout, n, aliases) for n, aliases in wanted.items()}

    def load(key: str) -> torch.Tensor:
        with safe_open(str(files[key]), framework="pt") as handle:
            return handle.get_tensor(key)

    values = layout.tensors(list(dict.fromkeys(sources.values())), load)
    for name, source in sources.items():
        _same_shape(layout, source, tuple(values[source].shape), shapes[name])
    return {name: values[source] for name, source in sources.items()}


def check_pretrained(
    directory: str, model: nn.Module, shapes: dict[str, tuple], aliases: dict
) -> None:
    """Every parameter is in the directory (by any tied name, in the disk layout the
    class converts from) with the shape the config makes; reads headers only."""
    files = weight_files(directory)
    layout = DiskLayout(model, list(files))
    sources = {n: _source(directory, layout, n, aliases.get(n, [])) for n in shapes}
    found = layout.shapes(list(dict.fromkeys(sources.values())), files)
    for name, source in sources.items():
        _same_shape(layout, source, found[source], shapes[name])


def _source(directory: str, layout: DiskLayout, name: str, aliases: list[str]) -> str:
    """The name (``name`` or a tied alias) that the directory's tensors make."""
    source = next((a for a in [name, *aliases] if a in layout.made_by), None)
    if source is None:
        also = " (nor the disk names this class converts from)" if layout.converts else ""
        raise ModelSourceError(
            f"pretrained {directory!r} has no tensor {name!r}{also}",
            "check that the directory was saved from this model class and config",
        )
    return source


def _same_shape(layout: DiskLayout, source: str, found: tuple, want: tuple) -> None:
    if tuple(found) == tuple(want):
        return
    disk = layout.disk_names(source)
    made = "" if disk == [source] else f" (made from {disk[0]!r} and {len(disk) - 1} more)"
    raise ModelSourceError(
        f"pretrained tensor {source!r}{made} has shape {tuple(found)}, "
        f"the config makes {tuple(want)}",
        "use the config.json saved with these weights",
    )
