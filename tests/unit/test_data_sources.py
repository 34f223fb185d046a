"""Token files, datasets with a tokenizer trained here, the shuffled order, the
pre-launch data checks (each bad input: located, exit 2, with a fix) and
``jobctl data prepare`` (parallel, resumable)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from jobctl.engine.data import prepare as prep
from jobctl.engine.data.checks import data_violations
from jobctl.engine.data.dataset import Sharding, make_data, make_eval_data
from jobctl.engine.data.hf import Tokenizer, require
from jobctl.engine.data.order import SampleOrder
from jobctl.engine.data.packed import PackedData, Split
from jobctl.engine.data.prefetch import Prefetcher
from jobctl.engine.data.tokens import TokenFile
from jobctl.spec import load_spec

from ..corpus import corpus, train_tokenizer, write_parquet
from ..jobrun import JOBCTL


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A BPE tokenizer of at most 120 tokens trained on the test corpus."""
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    return write_parquet(tmp_path_factory.mktemp("pq") / "train.parquet")


def write_job(tmp_path: Path, data: str, *, B: int = 8, vocab: int = 256, extra: str = "") -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: tiny
        model: {{seq_len: 16, vocab: {vocab}}}
        data: {data}
        training:
          global_batch_size: {B}
          steps: 4
        {extra}""")
    )
    return spec


def validate(spec: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*JOBCTL, "validate", str(spec)], capture_output=True, text=True)


def test_order_is_a_fresh_permutation_each_epoch():
    order = SampleOrder(50, seed=3)
    e0 = [order.sequence(i) for i in range(50)]
    e1 = [order.sequence(i) for i in range(50, 100)]
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    assert order.epoch(49) == 0 and order.epoch(50) == 1
    assert [SampleOrder(50, seed=3).sequence(i) for i in range(50)] == e0
    assert [SampleOrder(50, shuffle=False).sequence(i) for i in range(60)][48:52] == [48, 49, 0, 1]


@pytest.mark.parametrize(("block", "window"), [(7, 1), (7, 2), (10, 3), (100, 4)])
def test_block_order_shuffles_blocks_then_within_windows(block, window):
    n = 53  # blocks of `block` sequences, the last one short
    order = SampleOrder(n, seed=5, block=block, window=window)
    epochs = [[order.sequence(i) for i in range(e * n, e * n + n)] for e in range(3)]
    assert all(sorted(e) == list(range(n)) for e in epochs)  # each epoch: all, once
    assert epochs[0] != epochs[1] != epochs[2]
    # a pure function of (seed, epoch, index): a fresh order asked out of sequence agrees
    fresh = SampleOrder(n, seed=5, block=block, window=window)
    assert [fresh.sequence(i) for i in (150, 3, 77, 52, 53)] == [
        epochs[i // n][i % n] for i in (150, 3, 77, 52, 53)
    ]
    assert [SampleOrder(n, seed=6, block=block, window=window).sequence(i) for i in range(n)] != (
        epochs[0]
    )
    # consecutive positions come from one window of `window` blocks, windows in turn
    pos = 0
    blocks_in_all = -(-n // block)
    for k in range(-(-blocks_in_all // window)):
        blocks = order.window_blocks(1, k)
        size = sum(min(n, b * block + block) - b * block for b in blocks)
        got = {s // block for s in epochs[1][pos : pos + size]}
        assert got == set(blocks) and order.window_of(n + pos) == (1, k)
        pos += size
    assert pos == n
    if window == 1 and block < n:  # the blocks themselves are visited shuffled
        assert order.window_blocks(0, 0) + order.window_blocks(0, 1) != [0, 1]


@pytest.mark.parametrize("suffix", [".bin", ".npy"])
def test_token_file_reads_sequences_by_range(tmp_path, suffix):
    ids = np.arange(1000, dtype=np.uint32) % 300
    path = tmp_path / f"t{suffix}"
    np.save(path, ids) if suffix == ".npy" else ids.tofile(path)
    tf = TokenFile(str(path), "uint32")
    assert len(tf) == 1000 and tf.dtype == np.uint32
    assert tf.read(298, 302).tolist() == [298, 299, 0, 1]
    data = f"{{source: tokens, path: {path.name}, shuffle: false, dtype: uint32}}"
    job = write_job(tmp_path, data, vocab=300)
    x, y = make_data(load_spec(job)).batch(2, 2)  # sequences 2 and 3: ids [32, 49)
    assert x[0].tolist() == list(range(32, 48)) and y[1].tolist() == list(range(49, 65))


def test_eval_path_is_read_in_file_order_and_checked(tmp_path):
    (np.arange(3000) % 256).astype(np.uint16).tofile(tmp_path / "train.bin")
    (np.arange(400) % 256).astype(np.uint16)[::-1].copy().tofile(tmp_path / "val.bin")
    data = "{source: tokens, path: train.bin, eval: val.bin}"
    job = write_job(tmp_path, data, extra="  eval_every: 2\n")
    held = make_eval_data(load_spec(job))
    assert held.size == (400 - 1) // 16
    x, _ = held.batch(1, 1)  # sequence 1 of val.bin, unshuffled
    assert x[0].tolist() == [(399 - k) % 256 for k in range(16, 32)]
    (tmp_path / "val.bin").unlink()
    r = validate(job)
    assert r.returncode == 2 and "job.yaml:3:" in r.stderr and "data.eval:" in r.stderr
    assert "val.bin: no such file" in r.stderr


def test_hf_parquet_is_tokenized_packed_and_split(tmp_path, tokenizer_dir, parquet):
    data = f"{{source: hf, path: {parquet}, tokenizer: {tokenizer_dir}, eval: 0.1}}"
    spec = load_spec(write_job(tmp_path, data, extra="  eval_every: 2\n"))
    assert data_violations(spec) == []
    train, held = make_data(spec), make_eval_data(spec)
    tok = Tokenizer(str(tokenizer_dir))
    stream = np.concatenate([tok.stream([t]) for t in corpus(400, seed=1)])
    total = (len(stream) - 1) // 16
    assert train.size + held.size == total and held.size == round(total * 0.1)
    x, y = held.batch(0, 1)  # the first held-out sequence, in file order
    first = train.size * 16
    assert x[0].tolist() == stream[first : first + 16].tolist()
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < tok.vocab


def test_saved_dataset_and_jsonl_read_the_same_stream(tmp_path, tokenizer_dir):
    import datasets

    texts = corpus(50, seed=2)
    datasets.Dataset.from_dict({"body": texts}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    got = []
    for path in ("saved", "c.jsonl"):
        data = f"{{source: hf, path: {path}, tokenizer: {tokenizer_dir}, text_column: body}}"
        spec = load_spec(write_job(tmp_path, data, B=2))
        got.append(make_data(spec).batch(0, 2)[0])
    assert torch.equal(got[0], got[1])


def test_prefetcher_reads_ahead_and_returns_what_the_source_gives(tmp_path):
    (np.arange(5000) % 256).astype(np.uint16).tofile(tmp_path / "t.bin")
    spec = load_spec(write_job(tmp_path, "{source: tokens, path: t.bin}", B=8))
    data, shard = make_data(spec), Sharding(8, 2, 2)
    fetch = Prefetcher(data, shard, replica=1, pin=False)
    for step in range(3):
        for i in range(shard.micro_batches):
            start = shard.first_sample(step, 1, i)
            got = fetch.batch(start, 2)
            assert all(torch.equal(a, b) for a, b in zip(got, data.batch(start, 2), strict=True))
            after = [shard.first_sample(step + (i + k) // 2, 1, (i + k) % 2) for k in (1, 2)]
            assert sorted(fetch.ahead) == [(a, 2) for a in after]  # on their way
    fetch.close()


class CountingFS:
    """A real fsspec filesystem that records each byte range it is asked for (one
    ranged GET apiece on s3fs)."""

    def __init__(self, fs):
        self.fs, self.ranges = fs, []

    def cat_ranges(self, paths, starts, ends, **kw):
        self.ranges += list(zip(starts, ends, strict=True))
        return self.fs.cat_ranges(paths, starts, ends, **kw)

    def __getattr__(self, name):
        return getattr(self.fs, name)


def test_remote_token_file_is_read_one_request_per_block(tmp_path):
    import fsspec

    L, n = 16, 125 * 16 + 1  # 125 sequences: 13 blocks of 10 (the last 5), windows of 2
    ids = (np.arange(n) * 7 % 251).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    url = f"memory://{tmp_path.name}/t.bin"
    with fsspec.open(url, "wb") as f:
        f.write(ids.tobytes())
    block_mb = 10 * L * 2 / 2**20
    remote_file = TokenFile(url)
    remote_file.fs = counting = CountingFS(remote_file.fs)
    remote = PackedData(Split(remote_file, L), seed=1, block_mb=block_mb, window=2)
    local = PackedData(Split(TokenFile(str(tmp_path / "t.bin")), L), 1, block_mb=block_mb, window=2)
    assert remote.order.block == 10 and remote.order.count == 13
    for start in range(0, 125, 5):  # one epoch in batches of 5, same samples as local
        assert all(
            torch.equal(a, b)
            for a, b in zip(remote.batch(start, 5), local.batch(start, 5), strict=True)
        )
    remote.close(wait=True)
    fetched = sorted(a // 2 // (10 * L) for a, _ in counting.ranges)
    extra = list(fetched)
    for block in range(13):  # every block once, not one request per sequence (125)
        extra.remove(block)
    ahead = remote.order.window_blocks(1, 0)  # the next epoch's first window, read ahead
    assert len(extra) <= len(ahead) and set(extra) <= set(ahead)
    spans = sorted({(b - a) // 2 for a, b in counting.ranges})
    assert spans == [5 * L + 1, 10 * L + 1]  # whole blocks: sequences and one target id


def test_a_failed_block_read_is_retried_not_cached(tmp_path):
    import fsspec

    ids = (np.arange(40 * 16 + 1) % 256).astype(np.uint16)
    url = f"memory://{tmp_path.name}/f.bin"
    with fsspec.open(url, "wb") as f:
        f.write(ids.tobytes())
    tf = TokenFile(url)
    tf.fs = flaky = CountingFS(tf.fs)
    real = flaky.cat_ranges

    def fail_once(paths, starts, ends, **kw):
        flaky.cat_ranges = real  # the next request goes through
        raise OSError("connection reset")

    flaky.cat_ranges = fail_once
    data = PackedData(Split(tf, 16), shuffle=False, window=1)
    # the read-ahead of the next window (the same, only block) may retry it first
    with contextlib.suppress(OSError):
        data.batch(0, 2)
    x, _ = data.batch(0, 2)
    assert x[1].tolist() == list(range(16, 32)) and len(flaky.ranges) == 1
    data.close(wait=True)


BAD = {
    "missing path": ("{source: tokens, path: nope.bin}", "no such file", 3),
    "too small": ("{source: tokens, path: small.bin}", "one global batch needs 8", 3),
    "ids beyond vocab": ("{source: tokens, path: big-ids.bin}", "token id 999, outside", 3),
    "npy too narrow": ("{source: tokens, path: narrow.npy}", "too narrow for model.vocab", 3),
    "text too small": ("{source: text, path: tiny.txt}", "needs at least seq_len + 2", 3),
    "missing tokenizer": ("{source: hf, path: d.parquet, tokenizer: none}", "no such file", 3),
    "tokenizer too big": ("{source: hf, path: d.parquet, tokenizer: TOK}", "more than", 3),
    "no text column": (
        "{source: hf, path: d.parquet, tokenizer: TOK, text_column: body}",
        "no column 'body'",
        3,
    ),
    "narrow dtype": ("{source: tokens, path: big-ids.bin, dtype: uint16}", "uint16 holds", 3),
    # #47: the fix was "raise model.vocab to at least 57985"
    "text as tokens": ("{source: tokens, path: notes.txt}", "looks like text, not token", 3),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_data_fails_validate_located_with_a_fix(tmp_path, tokenizer_dir, parquet, case):
    data, message, line = BAD[case]
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "small.bin")
    np.full(2000, 999, dtype=np.uint16).tofile(tmp_path / "big-ids.bin")
    np.save(tmp_path / "narrow.npy", np.zeros(2000, dtype=np.uint16))
    (tmp_path / "tiny.txt").write_text("hello")
    (tmp_path / "notes.txt").write_text("\n\n".join(corpus(400)) + "\nnaïve ✓\n")
    (tmp_path / "d.parquet").symlink_to(parquet)
    small = Tokenizer(str(tokenizer_dir)).vocab - 1
    vocab = {"tokenizer too big": small, "npy too narrow": 70000, "narrow dtype": 70000}
    job = write_job(
        tmp_path,
        data.replace("TOK", str(tokenizer_dir)),
        vocab=vocab.get(case, 256 if "hf" not in data else 128),
    )
    for command in ("validate", "plan"):
        r = subprocess.run([*JOBCTL, command, str(job)], capture_output=True, text=True)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and message in r.stderr, r.stderr
        assert f"job.yaml:{line}:" in r.stderr and "fix:" in r.stderr, r.stderr
    r = subprocess.run([*JOBCTL, "apply", str(job), "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_missing_extra_names_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"pip install 'jobctl\[hf\]'"):
        require("tokenizers")


def test_prepare_matches_a_plain_loop_and_resumes(tmp_path, tokenizer_dir, parquet):
    plain = prep.Job(str(parquet), str(tokenizer_dir), str(tmp_path / "plain.bin"))
    n = prep.single_process(plain)
    job = prep.Job(str(parquet), str(tokenizer_dir), str(tmp_path / "out.bin"), workers=2)
    # an interrupted run: one chunk of 1000 docs is all there is, so fake a stop after
    # writing it halfway (progress says 0 chunks done: the half is cut off and redone)
    job.partial.write_bytes(b"\x01\x00" * 77)
    job.progress.write_text(json.dumps({"chunks": 0, "bytes": 0}))
    seen = []
    assert prep.prepare(job, lambda done, total, k: seen.append((done, total))) == n
    assert (tmp_path / "out.bin").read_bytes() == (tmp_path / "plain.bin").read_bytes()
    assert seen[0] == (0, 1) and seen[-1] == (1, 1)
    assert not job.partial.exists() and not job.progress.exists()


def test_prepare_command_writes_a_token_file_that_trains(tmp_path, tokenizer_dir, parquet):
    out = tmp_path / "train.npy"
    r = subprocess.run(
        [
            *JOBCTL,
            "data",
            "prepare",
            str(parquet),
            "--tokenizer",
            str(tokenizer_dir),
            "--out",
            str(out),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    ids = np.load(out)
    assert ids.dtype == np.uint16 and f"{len(ids)} tokens" in r.stdout
    assert (
        validate(write_job(tmp_path, "{source: tokens, path: train.npy}", vocab=120)).returncode
        == 0
    )
    r = subprocess.run(
        [
            *JOBCTL,
            "data",
            "prepare",
            "nope.txt",
            "--tokenizer",
            str(tokenizer_dir),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no such file" in r.stderr


def test_text_is_told_from_token_ids(tmp_path):
    from jobctl.engine.data.checks import looks_like_text

    (tmp_path / "a.txt").write_text("\n\n".join(corpus(50)) + "\ncafé ✓\n")
    np.arange(3000, dtype=np.uint16).tofile(tmp_path / "ids.bin")
    np.random.default_rng(0).integers(0, 50000, 3000).astype(np.uint32).tofile(tmp_path / "w.bin")
    np.full(3000, 0x6161, dtype=np.uint16).tofile(tmp_path / "aa.bin")  # ids that read "aa"
    assert looks_like_text(str(tmp_path / "a.txt"))
    assert not looks_like_text(str(tmp_path / "ids.bin"))
    assert not looks_like_text(str(tmp_path / "w.bin"))
    assert looks_like_text(str(tmp_path / "aa.bin"))  # only where its ids exceed the vocab
    assert not looks_like_text(str(tmp_path / "missing.bin"))
