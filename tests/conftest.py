"""Shared pytest fixtures, and the CI rule: a test that skips for want of a system tool
the project installs itself (.ci/run) fails under ``CI=true`` instead."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

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


def ci_failure(reason: str) -> str | None:
    """The failure message a skip with ``reason`` becomes in CI, or None if it may skip."""
    if not in_ci() or not CI_TOOLS.search(reason):
        return None
    return f"CI=true: skipped for a tool .ci/run installs, so this is a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true, a skip for a missing project-installed tool becomes a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        message = ci_failure(str(report.longrepr[2]))
        if message:
            report.outcome, report.longrepr = "failed", message


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://bucket/ckpt`` on a fresh moto S3 server, with the AWS_* environment set."""
    server, endpoint = start_moto_server()
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    try:
        yield f"s3://{bucket}/ckpt"
    finally:
        server.stop()
