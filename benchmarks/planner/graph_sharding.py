"""Tracing and sharding time of a GPT-2 1.5B-sized model on the meta device (Merak Table 2).

Merak reports 6.25 min to trace and shard a 1.4B GPT without its cache and 0.19 min
with it. Here a ``GPT2LMHeadModel`` config of 1.56B parameters (48 layers, hidden
1600, 25 heads, vocabulary 50257, sequence 1024) is traced with ``torch.export`` on
the meta device and cut into subgraphs with Merak's Alg. 1 and 2, in a fresh process
each time, with an empty cache (uncached) and again with the entry the first run wrote
(cached). Each child prints the construction time of ``GraphModel`` alone (imports
excluded; they are printed beside it) and its peak resident memory, which shows that no
weights were allocated. Targets: under 10 s uncached, under 1 s cached.

    python -m benchmarks run graph_sharding [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

QUESTION = (
    "How long does tracing and sharding a GPT-2 1.5B model on the meta device take, "
    "uncached and cached?"
)
BASELINE = "Its targets (10 s uncached, 1 s cached) and Merak Table 2's published 375 s / 11.4 s."

CHILD = r"""
import json, resource, time
t0 = time.perf_counter()
import transformers  # noqa: F401
from jobctl.engine.model.graph.graph_def import GraphModel
from jobctl.engine.model.graph.source import GraphModelConfig
t1 = time.perf_counter()
config = dict(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024)
g = GraphModel(GraphModelConfig(hf_class="GPT2LMHeadModel", hf_config=config, seq_len=1024), 1)
t2 = time.perf_counter()
import math
params = sum(math.prod(s[0]) for n, s in g.shapes.items() if s[2] and g.groups.get(n, n) == n)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"imports": t1 - t0, "build": t2 - t1, "subgraphs": len(g.shards),
                  "params": params, "rss_mb": rss}))
"""


def _child(home: str) -> dict:
    env = {**os.environ, "JOBCTL_HOME": home}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    cold, warm = [], []
    for _ in range(args.repeat):  # interleaved: an empty cache, then the entry it wrote
        with tempfile.TemporaryDirectory() as home:
            cold.append(_child(home))
            warm.append(_child(home))
    first = cold[0]
    print(f"GPT-2 config: {first['params'] / 1e9:.2f}B parameters, {first['subgraphs']} subgraphs")
    print(f"{'':10}{'median s':>10}{'min s':>8}{'imports s':>11}{'peak RSS MB':>13}{'target':>9}")
    for name, rows, target in (("uncached", cold, 10.0), ("cached", warm, 1.0)):
        build = [r["build"] for r in rows]
        imports = statistics.median(r["imports"] for r in rows)
        rss = max(r["rss_mb"] for r in rows)
        med = statistics.median(build)
        print(
            f"{name:10}{med:>10.2f}{min(build):>8.2f}{imports:>11.2f}{rss:>13.0f}"
            f"{'<' + str(target):>9}"
        )
    print(
        "Merak Table 2 (1.4B): 375 s uncached, 11.4 s cached; "
        f"here {statistics.median(r['build'] for r in cold):.1f} s / "
        f"{statistics.median(r['build'] for r in warm):.2f} s"
    )


if __name__ == "__main__":
    main()
