"""The trace cache is data, not code (#46 item 10).

Before, ``cache/graphs/<key>.pkl`` was read with ``pickle.load``: a file planted there
ran its code at the next ``jobctl plan`` of a Hugging Face spec. Now the cache is JSON
checked before fx generates code from it; an old ``.pkl`` is named in a warning and
never opened, and the cache still saves the trace on a second load.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.model.graph import cache, graph_def
from jobctl.engine.model.graph.graph_def import GraphModel
from jobctl.engine.model.graph.source import GraphModelConfig

HF_LLAMA = Path(__file__).resolve().parents[2] / "jobs" / "hf-llama.yaml"
LLAMA = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 97,
}


class Planted:
    """A pickle whose loading creates ``path``: what a planted cache file could do."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(folder: Path, name: str, marker: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(pickle.dumps(Planted(marker)))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def traces(monkeypatch):
    """The number of traces done (graph_def.trace_fake calls) since the test began."""
    calls: list[int] = []
    real = graph_def.trace_fake

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(graph_def, "trace_fake", counted)
    return calls


def test_a_planted_pickle_at_the_key_is_never_loaded(home, tmp_path, traces):
    cfg = GraphModelConfig(hf_class="LlamaForCausalLM", hf_config=LLAMA, seq_len=16)
    k = cache.key(graph_def.describe(cfg, 2))
    marker = tmp_path / "MARK"
    _plant(home / "cache" / "graphs", f"{k}.pkl", marker)
    with pytest.warns(cache.StaleCacheWarning, match=r"never loaded.*delete them"):
        assert cache.load(k) is None
    assert not marker.exists()
    first = GraphModel(cfg, 2)
    saved = cache.path_of(k)
    assert json.loads(saved.read_text())["format"] == cache.FORMAT
    written = saved.stat().st_mtime_ns
    second = GraphModel(cfg, 2)  # a hit: no new trace, the file is reused as it is
    assert len(traces) == 1 and saved.stat().st_mtime_ns == written
    assert second.shards == first.shards and second.shapes == first.shapes
    assert [n.name for n in second.gm.graph.nodes] == [n.name for n in first.gm.graph.nodes]
    assert not marker.exists()


def test_plan_of_hf_llama_never_runs_a_planted_pickle(home, tmp_path, traces):
    marker = tmp_path / "MARK"
    _plant(home / "cache" / "graphs", "0123456789abcdef01234567.pkl", marker)
    first = CliRunner().invoke(app, ["plan", str(HF_LLAMA)])
    assert first.exit_code == 0, first.output
    (entry,) = (home / "cache" / "graphs").glob("*.json")
    _plant(entry.parent, entry.with_suffix(".pkl").name, marker)  # at the entry's own key
    written = entry.stat().st_mtime_ns
    second = CliRunner().invoke(app, ["plan", str(HF_LLAMA)])
    assert second.exit_code == 0, second.output
    assert not marker.exists()
    assert len(traces) == 1 and entry.stat().st_mtime_ns == written


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d["nodes"][0].__setitem__(2, "x=__import__('os').system('touch MARK')"),
        lambda d: d["nodes"][0].__setitem__(1, "a;b"),
        lambda d: d["nodes"][3].__setitem__(0, "exec"),
        lambda d: d.__setitem__("version", 1),
        lambda d: d["nodes"].__setitem__(5, ["call_function", "f", ["op", "os::system", ""]]),
    ],
)
def test_a_tampered_json_entry_is_traced_anew(home, damage, traces):
    cfg = GraphModelConfig(hf_class="LlamaForCausalLM", hf_config=LLAMA, seq_len=16)
    k = cache.key(graph_def.describe(cfg, 2))
    GraphModel(cfg, 2)
    data = json.loads(cache.path_of(k).read_text())
    damage(data)
    cache.path_of(k).write_text(json.dumps(data))
    assert cache.load(k) is None
