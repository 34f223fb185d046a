"""Real data sources in real runs: token files (local and S3), Hugging Face datasets
with a tokenizer trained here, and the exact sample order across stop/resume and a
2x2 -> 1x2 morph (every global sample index reads the sequence an uninterrupted run
read)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import s3fs

from jobctl.engine.core import env
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train

from ..corpus import corpus, train_tokenizer, write_parquet
from ..jobrun import JOBCTL, cli_env, events, run_job, step_losses, tiny_spec

B, STEPS = 16, 4
# blocks of 19 sequences (64 bytes each), windows of 2 blocks: 124 sequences make 7
# blocks and 4 windows, and a resume at sample 32 lands inside window 0
BLOCKS = {"data.block_mb": 1258 / 2**20, "data.shuffle_window": 2}


def write_tokens(path: Path, n: int = 4000, vocab: int = 256, seed: int = 0) -> Path:
    """A learnable stream: each id mostly followed by (id * 7 + 3) mod vocab."""
    rng = np.random.default_rng(seed)
    ids = np.empty(n, dtype=np.uint16)
    ids[0] = 1
    noise = rng.random(n) < 0.1
    rand = rng.integers(0, vocab, n)
    for t in range(1, n):
        ids[t] = rand[t] if noise[t] else (int(ids[t - 1]) * 7 + 3) % vocab
    ids.tofile(path)
    return path


def data_spec(path: str, steps: int, P: int, D: int, **extra):
    return tiny_spec(
        **{
            "data.source": "tokens",
            "data.path": path,
            "training.steps": steps,
            "checkpoint.interval": 1,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            **extra,
        }
    )


def read_trace(folder: Path) -> dict[int, int]:
    """Global sample index -> sequence id over every process's trace file; an index
    read as two different sequences fails."""
    seen: dict[int, int] = {}
    for f in folder.glob("*.txt"):
        for line in f.read_text().split("\n"):
            if line:
                index, seq = map(int, line.split())
                assert seen.setdefault(index, seq) == seq, f"index {index} read twice differently"
    return seen


def traced_run(spec, home: Path, trace: Path, monkeypatch, **options):
    trace.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(env.DATA_TRACE, str(trace))
    run, outcome = run_job(spec, home, **options)
    assert outcome.ok, outcome.message
    return run


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    return write_tokens(tmp_path_factory.mktemp("data") / "train.bin")


@pytest.mark.multiproc
def test_tokens_run_matches_one_process_and_resumes_at_the_next_sample(
    tmp_path, tokens, monkeypatch
):
    full = traced_run(
        data_spec(str(tokens), STEPS, 2, 2, **BLOCKS), tmp_path / "a", tmp_path / "t0", monkeypatch
    )
    whole = read_trace(tmp_path / "t0")
    assert sorted(whole) == list(range(STEPS * B))
    ids = [whole[i] for i in range(STEPS * B)]
    assert ids != sorted(ids) and len(set(ids)) == len(ids)  # shuffled, no repeats in epoch
    ref_losses, _ = reference_train(data_spec(str(tokens), STEPS, 1, 1, **BLOCKS))
    assert step_losses(full.dir) == pytest.approx(ref_losses, abs=1e-5)

    first = traced_run(
        data_spec(str(tokens), 2, 2, 2, **BLOCKS), tmp_path / "b", tmp_path / "t1", monkeypatch
    )
    ckpt = first.dir / "checkpoints" / "step-00000002"
    for name, (P, D) in {"same": (2, 2), "morph": (1, 2)}.items():
        trace = tmp_path / f"t-{name}"
        run = traced_run(
            data_spec(str(tokens), STEPS, P, D, **BLOCKS),
            tmp_path / name,
            trace,
            monkeypatch,
            resume_dir=ckpt,
        )
        after = read_trace(trace)
        assert sorted(after) == list(range(2 * B, STEPS * B)), name
        assert {i: whole[i] for i in after} == after, name
        assert step_losses(run.dir) == pytest.approx(ref_losses[2:], abs=1e-5), name


@pytest.mark.multiproc
def test_epochs_are_counted_and_eval_loss_is_reported(tmp_path, monkeypatch):
    # 33 * 32 + 1 tokens: 33 sequences, 3 held out for eval, 30 to train: a new
    # epoch every 30 samples, so steps 3 and 4 start in epoch 1 and step 4 ends in 2.
    path = write_tokens(tmp_path / "small.bin", n=33 * 32 + 1)
    spec = data_spec(
        str(path), STEPS, 2, 1, **{"data.eval": 0.1, "training.eval_every": 2, "hardware.nodes": 1}
    )
    run = traced_run(spec, tmp_path / "h", tmp_path / "t", monkeypatch)
    recs = events(run.dir)
    assert [r["epoch"] for r in recs if r["kind"] == "step"] == [0, 0, 1, 1]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(0.0 < r["eval_loss"] < 10.0 for r in evals)
    seen = read_trace(tmp_path / "t")
    for epoch in (0, 1):  # each epoch reads every training sequence once, reshuffled
        assert sorted(seen[i] for i in range(30 * epoch, 30 * epoch + 30)) == list(range(30))
    first, second = ([seen[i] for i in range(30 * e, 30 * e + 30)] for e in (0, 1))
    assert first != second
    kinds = [e["kind"] for e in StateDB(tmp_path / "h").events(run.id)]
    assert kinds.count("eval") == 2 and kinds.count("epoch") == 1  # epoch 1 began at step 3
    home_env = cli_env(tmp_path / "h")
    status = subprocess.run(
        [*JOBCTL, "status", run.id], capture_output=True, text=True, env=home_env
    )
    assert status.returncode == 0, status.stderr
    assert f"{evals[-1]['eval_loss']:.4f} (step 4)" in status.stdout
    assert re.search(r"epoch\s+1\b", status.stdout), status.stdout


@pytest.mark.multiproc
@pytest.mark.s3
def test_token_file_on_s3_trains_like_the_local_file(tmp_path, tokens, s3_url, monkeypatch):
    url = s3_url.rsplit("/", 1)[0] + "/data/train.bin"
    s3fs.S3FileSystem(skip_instance_cache=True).put(str(tokens), url)
    spec = data_spec(url, 2, 2, 1, **{"hardware.nodes": 1, **BLOCKS})
    run = traced_run(spec, tmp_path / "s3", tmp_path / "t", monkeypatch)
    ref_losses, _ = reference_train(data_spec(str(tokens), 2, 1, 1, **BLOCKS))
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)


@pytest.mark.multiproc
def test_hf_parquet_with_a_trained_tokenizer_trains(tmp_path, monkeypatch):
    tok = train_tokenizer(tmp_path)
    parquet = write_parquet(tmp_path / "train.parquet")
    extra = {"data.tokenizer": str(tok), "model.vocab": 128, "hardware.nodes": 1}
    spec = data_spec(str(parquet), 2, 2, 1, **{**extra, "data.source": "hf"})
    run = traced_run(spec, tmp_path / "hf", tmp_path / "t", monkeypatch)
    ref_losses, _ = reference_train(spec)
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    assert sorted(read_trace(tmp_path / "t")) == list(range(2 * B))


@pytest.mark.multiproc
def test_own_text_with_a_tokenizer_trained_by_data_prepare_trains(tmp_path):
    """A newcomer's path (#47): raw text, `jobctl data prepare --vocab-size` (a BPE
    trained here, offline), then a real run on the token file equal to one process."""
    text = tmp_path / "notes.txt"
    text.write_text("\n\n".join(corpus(600, seed=5)))
    out = tmp_path / "train.bin"
    done = subprocess.run(
        [*JOBCTL, "data", "prepare", str(text), "--vocab-size", "300", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    one = {"hardware.nodes": 1, "hardware.processes_per_node": 1, "model.vocab": 300}
    spec = data_spec(str(out), 3, 1, 1, **one)
    run, outcome = run_job(spec, tmp_path / "home")
    assert outcome.ok, outcome.message
    ref_losses, _ = reference_train(spec)
    losses = step_losses(run.dir)
    assert losses == pytest.approx(ref_losses, abs=1e-5) and losses[-1] < losses[0]
