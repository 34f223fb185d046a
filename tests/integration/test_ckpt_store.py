"""Checkpoint storage tier on S3 (a local moto server): the storage contract of
tests/ckpt_stores.py; tests/unit/test_ckpt_store.py runs it on local paths and memory."""

from __future__ import annotations

import pytest

from ..ckpt_stores import (  # noqa: F401  the storage contract, run here on S3
    store_url_fixture,
    test_corrupted_file_is_skipped_with_warning_and_download_raises,
    test_no_manifest_means_incomplete_and_previous_stays_latest,
    test_retention_keeps_policy_and_newest_complete,
    test_write_part_commit_latest_and_download,
)

store_url = store_url_fixture(pytest.param("s3", marks=pytest.mark.s3))
