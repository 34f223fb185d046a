"""What can be known about an unmodified model before anything starts, checked at ``validate``.

``model_violations(spec)`` builds the model of a ``model.huggingface`` or
``model.import`` section the way a rank does (``source.build_model``: parameters on
the meta device, so no weights are allocated) and reports each problem as a
:class:`~jobctl.spec.base.Violation` on the field to fix: a class that is not a
``transformers`` model class, a ``config_path`` that is missing or not JSON, a
pretrained directory without ``config.json`` or ``*.safetensors`` or whose tensors do
not have the config's shapes (read from the safetensors headers, not the data), a
factory that cannot be imported, raises, or returns something that is neither an
``nn.Module`` nor a list of them. The builtin family has nothing to check here, and
this module imports torch only when a spec names such a model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from jobctl.spec.base import Violation

HF = "model.huggingface"


def model_violations(spec: Any) -> list[Violation]:
    """Every problem of ``spec.model``'s unmodified model (none for the builtin family)."""
    m = spec.model
    if m.huggingface is not None:
        found = _image_data(spec) or _first_problem(_hf_steps(m)) or _mask_token(spec)
    elif m.import_ is not None:
        found = _first_problem([("model.import", lambda: _check_factory(m))])
    else:
        return []
    return found or _tensor_parallel(spec)


def _tensor_parallel(spec: Any) -> list[Violation]:
    """T > 1: the model's family has a feature dict and T divides its heads and widths."""
    T = spec.parallelism.tensor_parallel
    if T in (1, "auto"):  # auto: the planner searches only the T that divide them
        return []
    from jobctl.engine.model.graph.source import FixableError, build_model
    from jobctl.engine.model.graph.tp_features import divisor_problems, features_for

    field = "parallelism.tensor_parallel"
    model = build_model(graph_config(spec.model))
    try:
        features = features_for(model)
    except FixableError as e:
        return [Violation(field, str(e).removeprefix(f"{field}: "), e.fix)]
    bad, fits = divisor_problems(model, T, features)
    if bad:
        return [
            Violation(
                field,
                f"T = {T} must divide the model's heads and widths, but not {', '.join(bad)}",
                f"set parallelism.tensor_parallel to one of {fits}",
            )
        ]
    return []


def _image_data(spec: Any) -> list[Violation]:
    """An image model needs images: only the synthetic source makes them so far."""
    from jobctl.engine.model.graph.batch import infer_task

    task = spec.model.task or infer_task(spec.model.huggingface.class_)
    if task != "image_classification" or spec.data.source == "synthetic":
        return []
    return [
        Violation(
            "data.source",
            f"{spec.model.huggingface.class_} trains on images; data.source "
            f"{spec.data.source!r} gives token ids",
            "use data.source: synthetic (seeded images) -- jobctl has no image file source yet",
        )
    ]


def _mask_token(spec: Any) -> list[Violation]:
    """A pretrained masked LM whose mask token nothing names (``graph.mask_token``):
    masking with any other id would train a different task, silently."""
    from jobctl.engine.model.graph.batch import infer_task
    from jobctl.engine.model.graph.mask_token import json_object, mask_id, tokenizer_mask_id
    from jobctl.engine.model.graph.remote import localized

    m = spec.model
    hf = m.huggingface
    if not hf.pretrained or (m.task or infer_task(hf.class_)) != "masked_lm":
        return []
    folder = localized(hf.pretrained)
    config = json_object(Path(folder) / "config.json")
    if mask_id(m.mask_token_id, config, folder) is not None:
        return []
    theirs = tokenizer_mask_id(spec.data.tokenizer)
    hint = f" (data.tokenizer's mask token is {theirs})" if theirs is not None else ""
    return [
        Violation(
            f"{HF}.pretrained",
            f"{hf.class_} from {hf.pretrained} masks tokens, but nothing names its mask "
            "token: its config has no mask_token_id and no tokenizer saved in the folder "
            "has one; masking with another id trains a different task",
            f"set model.mask_token_id to the tokenizer's mask token id{hint}, or save the "
            "tokenizer into the pretrained folder (tokenizer.save_pretrained)",
        )
    ]


def _first_problem(steps: list[tuple[str, Callable[[], None]]]) -> list[Violation]:
    """Run the checks in order; the first that fails is the violation (later ones
    depend on it: no config without a class, no shapes without a config)."""
    from jobctl.engine.model.graph.source import ModelSourceError

    for field, check in steps:
        try:
            check()
        except ModelSourceError as e:  # `field`: a key inside the section, where known
            return [Violation(getattr(e, "field", None) or field, str(e), e.fix)]
    return []


def _hf_steps(m: Any) -> list[tuple[str, Callable[[], None]]]:
    from jobctl.engine.model.graph.remote import localized
    from jobctl.engine.model.graph.source import hf_class

    hf = m.huggingface
    cfg = graph_config(m)
    given = next(k for k in ("config", "config_path", "pretrained") if getattr(hf, k))
    steps: list[tuple[str, Callable[[], None]]] = [(f"{HF}.class", lambda: hf_class(hf.class_))]
    local = {"cfg": cfg}

    def directory() -> None:  # a URL is copied to the state home first (remote.local_copy)
        local["cfg"] = replace(cfg, pretrained=localized(hf.pretrained))
        _check_directory(local["cfg"].pretrained)

    if hf.config_path:
        steps.append((f"{HF}.config_path", lambda: _check_regular(hf.config_path)))
    if hf.pretrained:
        steps.append((f"{HF}.pretrained", directory))
    steps.append((f"{HF}.{given}", lambda: _check_shapes(local["cfg"])))
    return steps


def graph_config(m: Any):
    """The ``source.GraphModelConfig`` of a spec's ``model`` section (huggingface or
    import; None for the builtin family)."""
    from jobctl.engine.model.graph.source import GraphModelConfig

    hf = m.huggingface
    if hf is None:
        if m.import_ is None:
            return None
        return GraphModelConfig(import_=m.import_, args=dict(m.import_args), task=m.task)
    return GraphModelConfig(
        hf_class=hf.class_,
        hf_config=dict(hf.config or {}) or None,
        hf_config_path=hf.config_path,
        pretrained=hf.pretrained,
        task=m.task,
    )


def _check_directory(directory: str) -> None:
    """A pretrained directory exists with a config.json and safetensors weights."""
    from jobctl.engine.model.graph.source import ModelSourceError
    from jobctl.engine.model.graph.weights import weight_files

    if not Path(directory).is_dir():
        raise ModelSourceError(
            f"{HF}.pretrained {directory!r}: no such directory",
            "point it at a local directory written by save_pretrained",
        )
    if not (Path(directory) / "config.json").is_file():
        raise ModelSourceError(
            f"{HF}.pretrained {directory!r} has no config.json",
            "point it at a directory written by save_pretrained (it writes config.json)",
        )
    weight_files(directory)


def _check_regular(path: str) -> None:
    """A ``config_path`` that is a FIFO or a device would block the build's read (#46)."""
    from jobctl.engine.model.graph.source import ModelSourceError
    from jobctl.spec.files import NotARegularFile, read_regular

    try:
        read_regular(path)
    except NotARegularFile as e:
        raise ModelSourceError(f"{HF}.config_path: {e}", e.fix) from None
    except OSError:
        pass  # a missing file: the build reports it as before


def _check_shapes(cfg: Any) -> None:
    """The model builds from its config (meta parameters), and a pretrained directory
    holds every parameter with the shape the config makes."""
    from jobctl.engine.model.graph.source import ModelSourceError, build_model

    try:
        model = build_model(cfg)
    except ModelSourceError:
        raise
    except Exception as e:  # noqa: BLE001 -- transformers' config classes raise their own kinds
        raise _config_rejected(cfg, e) from None
    if cfg.pretrained:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        from jobctl.engine.model.graph.weights import check_pretrained

        check_pretrained(cfg.pretrained, model, shapes, tied_names(model))


def _config_rejected(cfg: Any, error: Exception) -> Exception:
    """The config class's refusal of a value (huggingface_hub's strict dataclass
    errors, a TypeError or ValueError) as a ModelSourceError on the key it names (#46)."""
    from jobctl.engine.model.graph.source import ModelSourceError

    text = str(error)
    named = re.search(r"[Ff]ield '(\w+)'", text)
    key = named.group(1) if named else None
    body = text.split(":\n", 1)[-1] if "Validation error for field" in text else text
    message = " ".join(body.split(". Errors:")[0].split())[:400]
    kind = re.search(r"expected (\w+), got (\w+)", text)
    if key and kind:
        fix = f"set {key} to a value of type {kind.group(1)} (it is a {kind.group(2)})"
    else:
        fix = f"give {key or 'the config'} a value the {cfg.hf_class} config accepts"
    where = _json_key_at(cfg.hf_config_path, key) if key and cfg.hf_config_path else ""
    found = ModelSourceError(
        f"the {cfg.hf_class} config rejects {key or 'it'}{where}: {message}", fix
    )
    if key and key in (cfg.hf_config or {}):
        found.field = f"{HF}.config.{key}"  # located at the key's own line
    return found


def _json_key_at(path: str, key: str) -> str:
    """`` (at FILE:LINE:COL)`` of ``key`` in the config_path JSON file, so a wrong value
    there is found at its own line, not at the spec's config_path line (#46 item 3)."""
    from jobctl.spec.files import read_regular_text

    try:
        text = read_regular_text(path)
    except (OSError, ValueError):
        return ""
    found = re.search(rf'"{re.escape(key)}"\s*:', text)
    if found is None:
        return ""
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    return f" (at {path}:{line}:{column})"


def tied_names(model: Any) -> dict[str, list[str]]:
    """Each parameter's other names (a tied embedding is saved under one of them)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {n: [a for a in names if a != n] for names in by_id.values() for n in names}


def _check_factory(m: Any) -> None:
    """The factory imports, runs (meta parameters) and returns a module or a list of them."""
    from torch import nn

    from jobctl.engine.model.graph.source import ModelSourceError, factory_model, meta_parameters

    with meta_parameters():
        made = factory_model(graph_config(m))
    blocks = made if isinstance(made, (list, tuple)) else [made]
    if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
        raise ModelSourceError(
            f"model.import {m.import_!r} returned {_kind(made)}, not an nn.Module "
            "or a list of nn.Module blocks",
            "return the model itself (an nn.Module), or a non-empty list of blocks",
        )


def _kind(made: Any) -> str:
    if isinstance(made, (list, tuple)):
        inner = sorted({type(b).__name__ for b in made})
        return f"a {type(made).__name__} of {', '.join(inner) or 'nothing'}"
    return type(made).__name__
