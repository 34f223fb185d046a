"""#54: a token file is never read wrong. ``data.dtype: auto`` takes only what a
``.bin`` file proves and refuses a file both readings fit, naming both; a length that is
not a whole number of ids is refused; an id outside the vocabulary anywhere in the file
stops training at its place in the file, not with an IndexError in a worker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jobctl.engine.data.checks import data_violations
from jobctl.engine.data.dataset import make_data
from jobctl.engine.data.tokens import TokenError, TokenFile
from jobctl.spec import load_spec

from .test_data_sources import validate, write_job


def _ids(n: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n)


def _violations(tmp_path: Path, name: str, vocab: int, dtype: str = "auto") -> list:
    data = f"{{source: tokens, path: {name}, dtype: {dtype}}}"
    return data_violations(load_spec(write_job(tmp_path, data, vocab=vocab)))


def test_a_uint32_file_under_a_small_vocab_is_refused_with_both_readings(tmp_path):
    """The #54 probe: uint32 ids of a 384-token vocab were read as uint16, ids
    interleaved with zeros, and validate said ok."""
    _ids(4001, 384).astype(np.uint32).tofile(tmp_path / "t.bin")
    (v,) = _violations(tmp_path, "t.bin", 384)
    assert v.path == "data.dtype"
    assert "read as uint32 it is 4001 ids" in v.message
    assert "read as uint16 it is 8002 ids, every second one 0" in v.message
    assert "data.dtype: uint32" in v.fix
    assert _violations(tmp_path, "t.bin", 384, dtype="uint32") == []
    out = validate(write_job(tmp_path, "{source: tokens, path: t.bin}", vocab=384))
    assert out.returncode != 0 and "Traceback" not in out.stdout + out.stderr
    assert "cannot tell this file's id type" in out.stdout + out.stderr


@pytest.mark.parametrize("n", [4000, 4001])  # a whole number of uint32 ids, and not
def test_auto_proves_uint16_and_reads_it(tmp_path, n):
    ids = _ids(n, 384, seed=n).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    tf = TokenFile(str(tmp_path / "t.bin"), "auto", vocab=384)
    assert tf.dtype == np.uint16 and len(tf) == n
    assert tf.read(0, n).tolist() == ids.tolist()
    assert _violations(tmp_path, "t.bin", 384) == []


def test_auto_above_65536_ids_is_uint32(tmp_path):
    ids = np.array([70_000, 3, 69_999, 0] * 300, dtype=np.uint32)
    ids.tofile(tmp_path / "t.bin")
    tf = TokenFile(str(tmp_path / "t.bin"), "auto", vocab=70_001)
    assert tf.dtype == np.uint32 and tf.read(0, 4).tolist() == [70_000, 3, 69_999, 0]


def test_a_length_that_is_not_whole_ids_is_refused(tmp_path):
    (tmp_path / "t.bin").write_bytes(_ids(3001, 256).astype(np.uint16).tobytes() + b"\x07")
    (v,) = _violations(tmp_path, "t.bin", 256)
    assert v.path == "data.path" and "6003 bytes is not a whole number of uint16" in v.message
    _ids(3002, 256).astype(np.uint16).tofile(tmp_path / "u.bin")  # 6004 bytes: 1501 x 4
    assert _violations(tmp_path, "u.bin", 256, dtype="uint16") == []
    (w,) = _violations(tmp_path, "t.bin", 256, dtype="uint32")
    assert "not a whole number of uint32 ids" in w.message


def test_an_id_outside_the_vocab_where_validate_does_not_sample_stops_at_its_offset(tmp_path):
    """validate samples the start, middle and end of a file; training checks every id it
    reads and names the first one outside the vocabulary by id and byte."""
    n = 400_000  # past the three 65,536-id samples
    ids = _ids(n, 256).astype(np.uint16)
    ids[100_000] = 300
    ids.tofile(tmp_path / "t.bin")
    assert _violations(tmp_path, "t.bin", 256) == []
    tf = TokenFile(str(tmp_path / "t.bin"), "auto", vocab=256)
    assert tf.read(0, 100_000).max() < 256
    with pytest.raises(TokenError, match=r"token id 300 at id 100000 \(byte 200000"):
        tf.read(99_000, 101_000)
    job = write_job(tmp_path, "{source: tokens, path: t.bin, shuffle: false}")
    data = make_data(load_spec(job))
    with pytest.raises(TokenError, match="outside model.vocab 256"):
        for first in range(0, n // 16, 8):
            data.batch(first, 8)
