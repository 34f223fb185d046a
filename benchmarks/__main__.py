"""The benchmarks' one entry point: ``list`` them, ``run`` one.

    python -m benchmarks list [--markdown]
    python -m benchmarks run [--results DIR] NAME [ARGS...]

Every module of a subpackage (``planner``, ``runtime`` ...; not ``lib``, the shared
code) is a benchmark: it says at module level what it judges (``QUESTION``) and what
it is compared against in the same run (``BASELINE``), and has ``main(argv)``. They are
found by walking the subpackages and read without importing them (``ast``), so
``list`` is quick and needs none of their dependencies. NAME is ``name`` or
``group/name``; ARGS go to the benchmark (``run NAME --help`` shows its flags).

Every run's output is also written, as printed, to a dated file
``benchmarks/results/YYYY-MM-DD-NAME.txt`` (under ``--results DIR`` or
``$BENCHMARKS_RESULTS`` where given), unless the benchmark wrote its own result file.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import os
import pkgutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lib import results as results_lib  # stdlib only: list stays quick

HERE = Path(__file__).resolve().parent
SHARED = {"lib"}  # subpackages of shared code, not benchmarks
WIDTH = 80


@dataclass(frozen=True)
class Benchmark:
    """One benchmark module: where it is and what it says about itself."""

    group: str
    name: str
    question: str
    baseline: str

    @property
    def key(self) -> str:
        return f"{self.group}/{self.name}"


def _declared(path: Path) -> dict[str, str]:
    """The module-level string constants of a module's source, by name."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def discover() -> list[Benchmark]:
    """Every benchmark of every subpackage but the shared ones, by group and name."""
    out = []
    for group in pkgutil.iter_modules([str(HERE)]):
        if not group.ispkg or group.name in SHARED:
            continue
        for mod in pkgutil.iter_modules([str(HERE / group.name)]):
            if mod.ispkg:
                continue
            said = _declared(HERE / group.name / f"{mod.name}.py")
            q, b = said.get("QUESTION", ""), said.get("BASELINE", "")
            out.append(Benchmark(group.name, mod.name, q, b))
    return sorted(out, key=lambda b: b.key)


def _wrapped(label: str, text: str) -> list[str]:
    """``label`` and ``text`` wrapped to the terminal's 80 columns, continued aligned."""
    first = f"  {label:<9}"
    return textwrap.wrap(
        text or "(not stated)",
        WIDTH,
        initial_indent=first,
        subsequent_indent=" " * len(first),
        break_on_hyphens=False,
    )


def show(found: list[Benchmark], markdown: bool) -> None:
    """Print every benchmark with its question and baseline (or a markdown table)."""
    if markdown:
        print("| benchmark | question | baseline |\n| --- | --- | --- |")
        for b in found:
            print(f"| `{b.key}` | {b.question} | {b.baseline} |")
        return
    for b in found:
        print(b.key)
        print("\n".join(_wrapped("question", b.question) + _wrapped("baseline", b.baseline)))
    print(f"{len(found)} benchmarks; run one: python -m benchmarks run NAME [--help]")


def resolve(name: str, found: list[Benchmark]) -> Benchmark:
    """The benchmark ``name`` (``name`` or ``group/name``) means, or SystemExit(2) with
    one line naming the close matches."""
    hits = [b for b in found if name in (b.key, b.name)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        why = f"'{name}' is ambiguous: {', '.join(b.key for b in hits)}"
    else:
        names = [b.key for b in found] + [b.name for b in found]
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
        hint = f" (close: {', '.join(dict.fromkeys(close))})" if close else ""
        why = f"no benchmark '{name}'{hint}; python -m benchmarks list names them"
    print(f"benchmarks: {why}", file=sys.stderr)
    raise SystemExit(2)


def run(
    bench: Benchmark, args: list[str], results: str | None, typed: list[str] | None = None
) -> int:
    """Import the benchmark and call its ``main`` with ``args``; its exit status. What
    it prints is kept as a dated file (``results.kept``) headed by ``typed`` (the
    runner's arguments as given), unless it only shows --help."""
    if results:
        os.environ["BENCHMARKS_RESULTS"] = str(Path(results).resolve())
    module = importlib.import_module(f"benchmarks.{bench.group}.{bench.name}")
    sys.argv = [f"benchmarks run {bench.name}", *args]  # argparse's prog in --help
    if "-h" in args or "--help" in args:
        got = module.main(args)
        return got if isinstance(got, int) else 0
    typed = typed or ["run", bench.name, *args]
    with results_lib.kept(bench.name, typed) as state:
        got = module.main(args)
        got = got if isinstance(got, int) else 0
        state["status"] = f"exit {got}"
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    lister = sub.add_parser("list", help="every benchmark, its question and baseline")
    lister.add_argument("--markdown", action="store_true", help="as a markdown table")
    runner = sub.add_parser("run", help="run one benchmark: NAME [ARGS...]")
    runner.add_argument("--results", metavar="DIR", help="write result files here")
    runner.add_argument("name", help="name or group/name (see list)")
    runner.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    args = parser.parse_args(argv)
    found = discover()
    if args.command == "list":
        try:
            show(found, args.markdown)
        except BrokenPipeError:  # `list | head`: the reader has what it wanted
            sys.stderr.close()
        return 0
    typed = sys.argv[1:] if argv is None else argv  # the result file's first line
    return run(resolve(args.name, found), args.args, args.results, typed)


if __name__ == "__main__":
    raise SystemExit(main())
