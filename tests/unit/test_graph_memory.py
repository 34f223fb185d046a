"""A traced model's stage holds only its own parameters (issue 21, Merak sec. 4.2): a
2-stage split of a GPT-2 config with GPT-2's real vocabulary (50257), so the
embedding and the LM head dominate. ``Stage(model_def(...), blocks)`` has exactly the
parameters of its subgraphs (counted from the traced graph's meta shapes, not the
model's), and building it in a fresh process grows the resident memory by its own
bytes, not the model's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from ..jobrun import ROOT, tiny_spec

VOCAB = 50257
MiB = 1 << 20
SLACK = 8 * MiB  # Python objects of the stage: subgraph modules, the runner


def gpt2_spec(tied: bool):
    config = {
        "n_layer": 8,
        "n_embd": 128,
        "n_head": 4,
        "vocab_size": VOCAB,
        "n_positions": 64,
        "tie_word_embeddings": tied,
    }
    return tiny_spec(
        **{
            "model.family": None,
            "model.vocab": VOCAB,
            "model.seq_len": 16,
            "model.huggingface": {"class": "GPT2LMHeadModel", "config": config},
        }
    )


def split(graph) -> list[list[int]]:
    """The 2-stage split with the most even parameter counts."""
    n = len(graph.shards)
    cuts = [([*range(k)], [*range(k, n)]) for k in range(1, n)]
    best = min(cuts, key=lambda c: max(subgraph_numel(graph, c[0]), subgraph_numel(graph, c[1])))
    return list(best)


def subgraph_numel(graph, blocks: list[int]) -> int:
    """Elements of the distinct parameters the traced graph says ``blocks`` use."""
    names = {graph.original(t) for b in blocks for t in graph.shards[b].params}
    return sum(math.prod(graph.shapes[n][0]) for n in names & graph.param_names)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_stage_parameters_are_its_subgraphs_only(tied):
    import torch

    from jobctl.engine.model.blocks import Stage, model_def

    torch.set_num_threads(1)
    mdef = model_def(gpt2_spec(tied).model, 0, 2)
    graph = mdef.graph
    model_numel = sum(p.numel() for p in graph.model.parameters())
    counts = []
    for blocks in split(graph):
        stage = Stage(mdef, blocks)
        counts.append(sum(p.numel() for p in stage.parameters()))
        assert counts[-1] == subgraph_numel(graph, blocks)
        assert counts[-1] < model_numel
    embedding = VOCAB * 128
    # Untied, the stages partition the model; tied, the last stage holds the
    # embedding again as its LM head (one tensor in the model, one copy per stage).
    assert sum(counts) == model_numel + (embedding if tied else 0)


# Builds one stage in a fresh process and reports its resident growth (statm) and
# peak while building (VmHWM, reset just before: tracing, or the trace cache, and the
# meta model come first and must not count).
PROBE = """
import json, os, re, sys
import torch
torch.set_num_threads(1)
from jobctl.engine.model.blocks import Stage, model_def
from tests.unit.test_graph_memory import gpt2_spec, split

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def high_water():
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) * 1024

mdef = model_def(gpt2_spec(False).model, 0, 2)
blocks = split(mdef.graph)[int(sys.argv[1])]
mdef.graph.model  # the meta model (and transformers' modules): built before reading
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts again from the resident size
before = resident()
stage = Stage(mdef, blocks)
after = resident()
print(json.dumps({
    "own": sum(p.numel() * p.element_size() for p in stage.parameters()),
    "model": sum(p.numel() * 4 for p in mdef.graph.model.parameters()),
    "resident": after - before, "peak": high_water() - before}))
"""


def measure(stage: int, home) -> dict:
    # A fixed mmap threshold: every large tensor is its own mapping, returned to the
    # system when freed, so the resident growth is what stays allocated (glibc's
    # dynamic threshold would keep freed temporaries on the heap and hide it).
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "PYTHONPATH": str(ROOT),
        "JOBCTL_HOME": str(home),
    }  # its own trace cache: cold for stage 0, warm for 1
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(stage)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_building_a_stage_allocates_its_own_bytes_not_the_models(tmp_path):
    first, rest = measure(0, tmp_path), measure(1, tmp_path)
    assert first["model"] == rest["model"] == first["own"] + rest["own"]  # untied
    for mine, other in ((first, rest), (rest, first)):
        # what stays: its own parameters plus the subgraphs' code (a few MiB, not
        # weights; measured 5.7 MiB for 9 layers' nodes), none of the other's
        # (RSS is counted in pages, and the interpreter's own heap moves a little)
        assert mine["own"] - SLACK <= mine["resident"] <= mine["own"] + SLACK, (mine, other)
        assert mine["resident"] < mine["own"] + other["own"] / 2
        # while building too: each fresh tensor becomes the parameter, never copied
        assert mine["peak"] <= mine["own"] + SLACK, mine
