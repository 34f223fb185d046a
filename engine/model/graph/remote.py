"""A pretrained directory at an fsspec URL (``s3://bucket/llama``), copied to local disk.

``model.huggingface.pretrained`` may name any fsspec URL. Its ``config.json``, JSON
side files (the sharded index) and ``*.safetensors`` are copied once into the state
home's ``cache/pretrained/<hash of the URL>/`` (each file written to a temporary name
and renamed, so processes of one node may race); a file already there with the same
size is kept. Each rank then reads only its own tensors from the local copy
(``weights.read_pretrained``), so memory stays per stage.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from jobctl.engine.core.home import default_home
from jobctl.engine.model.graph.source import ModelSourceError

WANTED = (".json", ".safetensors")


def is_url(path: str | None) -> bool:
    """Whether ``path`` is an fsspec URL rather than a local path."""
    return bool(path) and "://" in str(path) and not str(path).startswith("file://")


def local_copy(url: str) -> str:
    """The local directory holding ``url``'s files (copied when missing or changed)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError as exc:
        raise ModelSourceError(
            f"model.huggingface.pretrained {url!r}: no such directory",
            "check the URL and the credentials (AWS_* for s3://)",
        ) from exc
    files = [e for e in entries if e.get("type") == "file" and e["name"].endswith(WANTED)]
    target = default_home() / "cache" / "pretrained" / hashlib.sha256(url.encode()).hexdigest()[:16]
    target.mkdir(parents=True, exist_ok=True)
    for entry in files:
        dest = target / Path(entry["name"]).name
        if dest.is_file() and dest.stat().st_size == entry.get("size"):
            continue
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        fs.get_file(entry["name"], str(tmp))
        tmp.replace(dest)
    return str(target)


def localized(path: str | None) -> str | None:
    """``path`` itself, or the local copy of a URL."""
    return local_copy(path) if is_url(path) else path
