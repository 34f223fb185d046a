"""Fuzzing every input boundary (#24, Done when): the shipped specs in jobs/ with hostile
values put in place of each of their values, hostile bytes put into their text, hostile
JSON at the event channel and in checkpoint manifests. Each must end in a result or the
boundary's own error (a SpecError whose every issue is located file:line; a ValueError),
never another exception and never a hang (hypothesis' deadline bounds every example).
A few `jobctl validate` runs check the same from the command line: exit 2, no traceback,
file:line on every error line.
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from jobctl.engine.channel.server import read_batch
from jobctl.engine.checkpoint.store.format import Manifest
from jobctl.engine.cli.app import app
from jobctl.engine.core.event_schema import SCHEMAS, problem
from jobctl.engine.fleet.loader import load_fleet
from jobctl.engine.state.db import StateDB
from jobctl.spec import SpecError, load_spec_text

from ..jobrun import ROOT

JOBS = ROOT / "jobs"
SPECS = {
    path.name: path.read_text()
    for path in sorted(JOBS.glob("*.yaml"))
    if "template:" not in path.read_text()  # fleet files: test_fleet_files_fuzzed
}
FUZZ = settings(
    max_examples=40,
    deadline=3000,  # ms per example: a hang (an alias bomb, a planner spin) fails it
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same examples every run: a failure reproduces
)

HOSTILE_SCALARS = st.one_of(
    st.sampled_from(
        [
            10**30,
            2**63,
            -(2**63),
            1e30,
            1e400,
            -1e400,
            float("nan"),
            0,
            -1,
            True,
            None,
            "",
            "a\nb",
            "$(touch /tmp/x)",
            "`id`",
            "[/x]",
            "[bold]",
            "../../..",
            "\x00",
            "\u202e",
            "x" * 10_000,
            "1e30",
            "auto",
            ".inf",
            "{{ 7*7 }}",
            "-oProxyCommand=x",
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=50),
)
HOSTILE = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def leaf_paths(data, path=()):
    """Every key path to a value in ``data`` (mappings and lists), leaves and sections."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*path, key)
            yield from leaf_paths(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield (*path, index)
            yield from leaf_paths(value, (*path, index))


def replaced(data, path, value):
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


def check_spec(text: str, filename: str = "job.yaml") -> None:
    """Loading ``text`` gives a spec or a SpecError whose every issue has a line."""
    try:
        load_spec_text(text, filename)
    except SpecError as e:
        assert e.errors
        unlocated = [str(issue) for issue in e.errors if issue.line is None]
        assert not unlocated, unlocated


@pytest.mark.parametrize("name", sorted(SPECS))
@FUZZ
@given(data=st.data())
def test_shipped_specs_with_a_hostile_value_anywhere(name, data):
    parsed = yaml.safe_load(SPECS[name])
    path = data.draw(st.sampled_from(sorted(leaf_paths(parsed), key=str)), label="path")
    value = data.draw(HOSTILE, label="value")
    text = yaml.safe_dump(replaced(parsed, path, value), allow_unicode=True, width=10_000)
    check_spec(text)


@pytest.mark.parametrize("name", sorted(SPECS))
@FUZZ
@given(data=st.data())
def test_shipped_specs_with_hostile_bytes_anywhere(name, data):
    text = SPECS[name]
    where = data.draw(st.integers(0, len(text)), label="offset")
    insert = data.draw(
        st.one_of(
            st.sampled_from(
                ["\x07", "\x1b[31m", "\t", ": : :", "&a [*a, *a]", "[" * 1000, "\ufeff"]
            ),
            st.text(max_size=10),
        ),
        label="insert",
    )
    check_spec(text[:where] + insert + text[where:])


def test_fleet_files_fuzzed(tmp_path):
    text = (JOBS / "fleet-sweep.yaml").read_text()
    for index, hostile in enumerate(
        ["{{ cycler.__init__.__globals__ }}", "{{ ''.__class__.__mro__ }}", "\x07", "[" * 200]
    ):
        path = tmp_path / f"fleet-{index}.yaml"
        path.write_text(text.replace("sweep-{{ lr }}", "sweep-{{ lr }}" + hostile, 1))
        try:
            load_fleet(path)
        except SpecError as e:
            assert all(issue.line is not None for issue in e.errors), str(e)
        else:
            assert hostile == "[" * 200  # in a quoted name: text, sanitised away


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
EVENT = st.fixed_dictionaries({"kind": st.sampled_from(sorted(SCHEMAS))}).flatmap(
    lambda base: st.dictionaries(
        st.sampled_from(
            [
                "step",
                "loss",
                "samples_per_s",
                "node",
                "rank",
                "stage",
                "ts",
                "compute_s",
                "error",
                "moves",
                "blocks",
                "replica",
            ]
        ),
        JSON,
    ).map(lambda extra: {**extra, **base})
)


@FUZZ
@given(
    body=st.one_of(
        JSON,
        st.fixed_dictionaries(
            {"src": JSON, "seq": JSON, "events": st.lists(EVENT | JSON, max_size=3)}
        ),
    )
)
def test_channel_batches_are_read_or_refused(body):
    data = json.dumps(body).encode()
    try:
        src, seq, events, invalid = read_batch(data)
    except ValueError:
        return
    assert isinstance(src, str) and isinstance(seq, int) and seq >= 0
    assert all(problem(event) is None for event in events)
    assert len(events) + len(invalid) == len(body["events"]) and (events or not invalid)


@FUZZ
@given(event=EVENT)
def test_an_event_that_passes_its_schema_has_what_its_handler_reads(event):
    if problem(event) is None:
        for field, kind in SCHEMAS[event["kind"]].items():
            value = event[field]
            assert value is not None or kind == "loss?"
            assert not (isinstance(value, float) and math.isinf(value)) or kind.startswith("loss")


@FUZZ
@given(
    body=st.one_of(
        JSON,
        st.fixed_dictionaries({"format": st.just(1), "step": JSON, "parts": JSON, "files": JSON}),
    )
)
def test_manifests_are_read_or_refused(body):
    try:
        manifest = Manifest.from_json(json.dumps(body))
    except ValueError:
        return
    assert isinstance(manifest.step, int) and manifest.step >= 0


LOCATED = re.compile(r"^\S+\.yaml:\d+:\d+: ")
BOMB = b"a0: &a0 [1,1,1,1,1,1,1,1,1]\n" + b"".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n".encode() for i in range(1, 10)
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            b"a0: &a0 [1,1,1,1,1,1,1,1,1]\n"
            + b"".join(
                f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n".encode() for i in range(1, 10)
            ),
            id="alias-bomb",
        ),
        pytest.param(b"name: x\nmodel: " + b"[" * 600 + b"]" * 600 + b"\n", id="deep"),
        pytest.param(b"name: x\nmodel: {layers: 1.0e+30}\n\x07\n", id="control-char"),
        pytest.param(b"name: x\n# caf\xe9\n", id="not-utf8"),
        pytest.param(
            b"name: x\nmodel: {}\ntraining: {global_batch_size: 1000000000000000000000000000000,"
            b" steps: 1}\nhardware: {processes_per_node: 9223372036854775808}\n",
            id="huge-counts",
        ),
    ],
)
def test_validate_exits_2_located(tmp_path: Path, text: bytes):
    path = tmp_path / "job.yaml"
    path.write_bytes(text)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert_located(result.output, tmp_path)


def assert_located(output: str, folder: Path) -> None:
    """After the ``error: ... invalid job spec`` line, every issue line starts file:line:col."""
    issues = [line for line in output.splitlines() if "job.yaml" in line][1:]
    assert issues and all(LOCATED.match(line.replace(f"{folder}/", "")) for line in issues), output


def test_the_command_line_exits_2_located_without_a_traceback(tmp_path: Path):
    for index, text in enumerate((BOMB, b"name: x\n# caf\xe9\n")):
        folder = tmp_path / str(index)
        folder.mkdir()
        (folder / "job.yaml").write_bytes(text)
        done = subprocess.run(
            ["jobctl", "validate", str(folder / "job.yaml")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert_located(done.stderr, folder)


RUN_COLUMNS = [
    "step",
    "total_steps",
    "loss",
    "samples_per_s",
    "devices",
    "plan",
    "message",
    "stragglers",
    "last_checkpoint",
    "last_upload",
    "updated_at",
    "pids",
]
DB_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(["[/x]", "nan", "abc", "1e400", "\x00"]),
)


@settings(FUZZ, max_examples=25, deadline=5000)
@given(values=st.dictionaries(st.sampled_from(RUN_COLUMNS), DB_VALUES, min_size=1))
def test_status_shows_whatever_the_state_db_holds(tmp_path_factory, values):
    home = tmp_path_factory.mktemp("home")
    db = StateDB(home)
    db.create_run("r-1", "r", home / "r", total_steps=4)
    values = {k: v for k, v in values.items() if v is not None or k != "updated_at"}  # NOT NULL
    sets = ", ".join(f"{name} = :{name}" for name in values) or "step = 0"
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE runs SET {sets}"), values)
    for argv in (["status"], ["status", "r-1"], ["status", "--json"]):
        result = CliRunner().invoke(app, [*argv, "--home", str(home)])
        assert result.exit_code == 0, (argv, result.output, result.exception)
