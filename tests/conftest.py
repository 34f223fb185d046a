"""Shared pytest fixtures, and the CI rule: a test that skips for want of a system tool
the project installs itself (.ci/run), or of a Python package jobctl declares (its
dependencies and extras), fails under ``CI=true`` instead."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import tempfile
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import s3fs

from .s3server import TEST_ENV, start_moto_server

# Tests and checks shared by tests/unit and tests/integration: their asserts explain failures.
pytest.register_assert_rewrite("tests.ckpt_stores", "tests.report_pages")

# What .ci/run installs (apt: slurm-wlm, munge, openssh-server, shellcheck,
# kubernetes-client): a skip whose reason names one of these is a hole in CI's coverage.
CI_TOOLS = re.compile(r"\b(slurm\w*|munged?|sshd?|shellcheck|kubectl)\b", re.IGNORECASE)


def in_ci() -> bool:
    """Whether this is the CI run (``CI=true``, as CI services set it)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


# How pytest.importorskip and a bare ImportError name the module that was not there.
MISSING_MODULE = re.compile(r"(?:could not import|No module named) '([\w.]+)'")
# Import names that are not their distribution's name.
DISTRIBUTION_OF = {"yaml": "pyyaml", "jwt": "pyjwt"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def declared_distributions() -> frozenset[str]:
    """Every distribution jobctl's metadata requires, extras included (canonical names)."""
    reqs = md.requires("jobctl") or []
    return frozenset(_canonical(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs)


def declared_module(reason: str) -> str | None:
    """The module a skip ``reason`` says is missing, where jobctl declares its package."""
    found = MISSING_MODULE.search(reason)
    if found is None:
        return None
    top = found.group(1).split(".")[0]
    dists = md.packages_distributions().get(top, []) + [DISTRIBUTION_OF.get(top, top)]
    return top if any(_canonical(d) in declared_distributions() for d in dists) else None


def ci_failure(reason: str) -> str | None:
    """The failure message a skip with ``reason`` becomes in CI, or None if it may skip."""
    if not in_ci():
        return None
    if CI_TOOLS.search(reason):
        return f"CI=true: skipped for a tool .ci/run installs, so this is a failure: {reason}"
    module = declared_module(reason)
    if module is not None:
        why = f"skipped for {module!r}, which jobctl declares, so this is a failure"
        return f"CI=true: {why}: {reason}"
    return None


def pytest_configure(config) -> None:
    """The suite has a state home of its own: a user runs the README's first command
    (a quickstart run, its calibration and start-up times in ./.jobctl) before its
    second, and the tests must neither read that history (the planner adds the measured
    start-up to its predictions) nor write runs into it. A test that wants another home
    sets JOBCTL_HOME itself."""
    os.environ["JOBCTL_HOME"] = tempfile.mkdtemp(prefix="jobctl-tests-home-")
    os.environ.pop("JOBCTL_DB_URL", None)  # nor the user's own state database


INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items) -> None:
    """Every test in tests/integration is ``slow`` (real processes, servers, clusters:
    nearly all of the suite's time), so ``-m "not slow"`` is the developer loop: the
    unit tier, about 3 minutes on 2 cores. CI runs everything."""
    for item in items:
        if INTEGRATION in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true, a skip for a missing project-installed tool or declared package
    becomes a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        message = ci_failure(str(report.longrepr[2]))
        if message:
            report.outcome, report.longrepr = "failed", message


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """One moto S3 server for the whole session (its start and stop cost about a
    second each time); every test gets a bucket of its own on it (``s3_url``)."""
    server, endpoint = start_moto_server()
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> Iterator[str]:
    """``s3://bucket/ckpt`` in a new bucket of the session's moto S3 server, with the
    AWS_* environment set."""
    endpoint = s3_endpoint
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    yield f"s3://{bucket}/ckpt"
