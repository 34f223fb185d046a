"""Shared pytest fixtures."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import s3fs

from .s3server import TEST_ENV, start_moto_server

# Tests and checks shared by tests/unit and tests/integration: their asserts explain failures.
pytest.register_assert_rewrite("tests.ckpt_stores", "tests.report_pages")


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
