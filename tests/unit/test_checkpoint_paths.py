"""#46 item 8: checkpoint.local_dir and checkpoint.remote took newlines, U+2028, a
leading '-' and '$(...)' (inert, because every script value is quoted, but never
meant), and `remote: "x;touch MARK"` was taken as a relative local folder. Each is now
refused at validate, located, with a fix; real URLs and paths still validate."""

from __future__ import annotations

import pytest

from jobctl.spec.errors import SpecError

from ..jobrun import tiny_spec


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("remote", "x;touch MARK", "neither a URL nor an absolute path"),
        ("remote", "ckpt/here", "neither a URL nor an absolute path"),
        ("remote", "-rf", "neither a URL nor an absolute path"),
        ("remote", "s3://bucket/a\nb", "control character U+000A"),
        ("remote", "s3://bucket/a\u2028b", "control character U+2028"),
        ("local_dir", "ckpt\r", "control character U+000D"),
        ("local_dir", "-rf", "starts with '-'"),
        ("local_dir", "/tmp/a\x00b", "control character U+0000"),
    ],
)
def test_a_bad_checkpoint_path_is_refused_with_a_fix(field, value, says):
    with pytest.raises(SpecError) as err:
        tiny_spec(**{f"checkpoint.{field}": value})
    text = str(err.value)
    assert f"checkpoint.{field}" in text and says in text and "fix:" in text, text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("remote", "s3://bucket/runs/gpt"),
        ("remote", "file:///mnt/ckpt"),
        ("remote", "gs://b/p"),
        ("remote", "/mnt/shared/ckpt"),
        ("local_dir", "ckpt"),
        ("local_dir", "./-odd"),
        ("local_dir", "/scratch/$USER/ckpt"),  # a literal folder name, quoted in scripts
    ],
)
def test_real_checkpoint_paths_still_validate(field, value):
    assert getattr(tiny_spec(**{f"checkpoint.{field}": value}).checkpoint, field) == value
