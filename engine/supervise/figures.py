"""What ``jobctl status`` derives for a run: ETA, dollars so far, upload lag, recoveries.

The state DB holds the newest values (step, loss, last checkpoint, last upload) and the
run's events; the run folder's ``metrics.jsonl`` holds every worker record. From them:

* **ETA**: steps left over the recent rate, in steps per second over the newest step
  records of the current attempt (a resume trains some steps again: the rate restarts
  there), else the newest samples/s over the global batch. None once the run ended.
  **samples/s** is that rate times the global batch: one window, one way.
* **$ so far**: device-seconds times ``hardware.price_per_hour`` (the price the planner
  puts in every plan's $ per 1k samples), counted while the run trains: from each phase
  event entering a training phase (training, pruning, rebalancing, checkpointing,
  uploading) to the next leaving it (morphing, launching in a queue, stopped, ...),
  with the devices of the attempt then running (``data["devices"]`` of the phase event if
  present, else P x D of the plan the launching event names, else the row's devices).
  Queue waits and re-planning are not billed; devices a packing frees mid-attempt are.
  The price is the one the run pays (``spec.cost.run_price``: the spot price on spot).
* **$ per step** now: the row's devices at that price over the recent rate; **$ to
  finish**: the steps left at it (what the ETA's steps will cost at the current rate).
* **Upload lag**: local checkpoints not yet committed remotely, in steps, and in seconds
  how long the oldest of them has waited (until now, or until the run ended); and the
  age of the newest remote checkpoint (since its upload event).
* **Recoveries**: seconds from losing nodes to training again, per ``recovery`` event
  (``data["recovery_s"]`` or ``data["seconds"]``), else the row's ``recovery_s``.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from jobctl.engine.core.event_schema import Bounds, timed
from jobctl.engine.core.events import Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.supervise.stragglers import per_micro_batch_s
from jobctl.spec.cost import run_price

# Phases that hold the devices (a stopping run still writes its checkpoint on them).
TRAINING = {"training", "pruning", "rebalancing", "checkpointing", "uploading", "stopping"}
ENDED = {"completed", "failed", "stopped"}
TAIL_BYTES = 512 * 1024  # of metrics.jsonl: enough for the recent steps and heartbeats
RATE_WINDOW = 20  # step records the recent rate is measured over

_STEP = re.compile(r"step (\d+)")
_LAYOUT = re.compile(r"\bP=(\d+) D=(\d+)\b")


@dataclass
class RunFigures:
    """Derived figures of one run (None: unknown)."""

    steps_per_s: float | None = None
    samples_per_s: float | None = None  # steps_per_s x the global batch: the same window
    eta_s: float | None = None
    device_hours: float | None = None
    cost_usd: float | None = None
    usd_per_step: float | None = None  # now: the devices running, at the recent rate
    usd_to_finish: float | None = None  # the steps left at usd_per_step
    uploaded_at: float | None = None
    lag_steps: int | None = None
    lag_s: float | None = None
    recoveries: list[float] = field(default_factory=list)
    steps_lost: list[int | None] = field(default_factory=list)  # per recovery (None: unknown)
    straggler_nodes: list[int] = field(default_factory=list)  # of the newest flagging
    epoch: int | None = None  # of the newest step (file data sources)
    eval_loss: tuple[int, float] | None = None  # (step, loss) of the newest eval
    # AvgPipe: (step, each parallel model's distance from the reference) at the newest
    # step every stage reported
    avg_distance: tuple[int, list[float]] | None = None


def run_bounds(row: dict) -> Bounds | None:
    """What the run's plan (its ``plan.json``) allows its records; None without one."""
    try:
        plan = Plan.model_validate_json((Path(row["run_dir"]) / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    steps = row.get("total_steps")
    return Bounds.of(plan, steps) if steps else None


def tail_records(
    run_dir: Path | str, nbytes: int = TAIL_BYTES, bounds: Bounds | None = None
) -> list[dict]:
    """The complete JSON lines in the last ``nbytes`` of the run's ``metrics.jsonl``,
    without those beyond ``bounds`` (a rank 999 heartbeat is no row of ``status``)."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - nbytes))
            chunk = f.read()
    except OSError:
        return []
    lines = chunk.decode(errors="replace").split("\n")
    if len(chunk) >= nbytes:
        lines = lines[1:]  # the first line is cut
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # empty, or a line still being written
        wanted = isinstance(rec, dict) and "kind" in rec
        if wanted and (bounds is None or bounds.problem(rec) is None):
            out.append(rec)
    return out


def recent_rate(records: list[dict]) -> float | None:
    """Steps per second over the newest step records of the current attempt."""
    # A step without a time or an integer step (appended past the channel) tells no rate
    steps = [
        r for r in records if r["kind"] == Kind.STEP and timed(r) and type(r.get("step")) is int
    ]
    run = steps[-1:]
    for r in reversed(steps[:-1]):
        if r["step"] >= run[0]["step"] or len(run) >= RATE_WINDOW:
            break  # an earlier attempt trained this step again
        run.insert(0, r)
    if len(run) < 2 or run[-1]["ts"] <= run[0]["ts"]:
        return None
    return (run[-1]["step"] - run[0]["step"]) / (run[-1]["ts"] - run[0]["ts"])


def eta_s(row: dict, rate: float | None) -> float | None:
    """Seconds to the last step at ``rate`` steps/s; None once ended or unknown."""
    total, step = row.get("total_steps"), row.get("step") or 0
    if row["phase"] in ENDED or not total or not rate or step >= total:
        return None
    return (total - step) / rate


def usd_per_step(price: float | None, devices: int | None, rate: float | None) -> float | None:
    """USD one step costs now: ``devices`` at ``price`` per device-hour, ``rate`` steps/s."""
    if price is None or not devices or not rate:
        return None
    return devices * price / 3600.0 / rate


def _event_step(e: dict) -> int | None:
    data = _data(e)
    if isinstance(data.get("step"), int):
        return data["step"]
    m = _STEP.search(e.get("message") or "")
    return int(m.group(1)) if m else None


def _data(e: dict) -> dict:
    raw = e.get("data")
    if isinstance(raw, dict):
        return raw
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def _phase(e: dict) -> str:
    return (e.get("message") or "").split(":", 1)[0].strip()


def _devices_named(e: dict) -> int | None:
    data = _data(e)
    if isinstance(data.get("devices"), int):
        return data["devices"]
    m = _LAYOUT.search(e.get("message") or "")
    return int(m.group(1)) * int(m.group(2)) if m else None


def device_seconds(events: list[dict], devices_now: int | None, now: float) -> float:
    """Device-seconds spent in training phases (see the module doc)."""
    total, since, devices, running = 0.0, None, None, None
    for e in events:
        if e["kind"] != "phase":
            continue
        devices = _devices_named(e) or devices
        if _phase(e) in TRAINING:
            if since is None:
                since, running = e["ts"], devices or devices_now or 0
        elif since is not None:
            total += (e["ts"] - since) * running
            since = None
    if since is not None:
        total += max(0.0, now - since) * running
    return total


def upload_figures(row: dict, events: list[dict], now: float, remote: bool) -> dict:
    """``uploaded_at``, ``lag_steps`` and ``lag_s`` (see the module doc)."""
    last_ckpt, last_up = row.get("last_checkpoint"), row.get("last_upload")
    if last_up is None and not (remote and last_ckpt is not None):
        return {}
    # A commit, not a progress report (``bytes_done``) of one part, says it is uploaded.
    uploaded = [
        e["ts"]
        for e in events
        if e["kind"] == "upload" and _event_step(e) == last_up and "bytes_done" not in _data(e)
    ]
    through = -1 if last_up is None else last_up
    waiting = [
        e["ts"]
        for e in events
        if e["kind"] == "checkpoint" and (s := _event_step(e)) is not None and s > through
    ]
    end = now
    if row["phase"] in ENDED:
        end = max((e["ts"] for e in events if e["kind"] == "phase"), default=now)
    lag = max(0, (last_ckpt or 0) - max(through, 0))
    return {
        "uploaded_at": uploaded[0] if uploaded else None,
        "lag_steps": lag,
        "lag_s": max(0.0, end - min(waiting)) if lag and waiting else 0.0,
    }


def recoveries(events: list[dict], row: dict | None = None) -> list[float]:
    """Seconds from losing nodes to training again, one per recovery event (else the
    row's ``recovery_s``: the newest only)."""
    out = []
    for e in events:
        if e["kind"] != "recovery":
            continue
        data = _data(e)
        value = data.get("recovery_s", data.get("seconds"))
        if value is None:
            m = re.search(r"([\d.]+) s\b", e.get("message") or "")
            value = float(m.group(1)) if m else None
        if value is not None:
            out.append(float(value))
    if not out and row is not None and row.get("recovery_s") is not None:
        out.append(float(row["recovery_s"]))
    return out


def steps_lost(events: list[dict]) -> list[int | None]:
    """Completed steps trained again after each recovery (the ``recovery`` events'
    ``steps_lost``; None where an older event does not say)."""
    return [_data(e).get("steps_lost") for e in events if e["kind"] == "recovery"]


def _spec(run_dir: Path):
    from jobctl.spec import SpecError, load_spec

    try:
        return load_spec(Path(run_dir) / "spec.yaml")
    except (OSError, SpecError):
        return None


def run_figures(
    row: dict, events: list[dict], now: float, records: list[dict] | None = None
) -> RunFigures:
    """Every derived figure of the run in ``row`` with its (chronological) events and
    the newest records of its archive (read here unless given)."""
    spec = _spec(Path(row["run_dir"]))
    records = tail_records(row["run_dir"]) if records is None else records
    rate = recent_rate(records)
    if rate is None and spec is not None and row.get("samples_per_s"):
        rate = row["samples_per_s"] / spec.training.global_batch_size
    dev_s = device_seconds(events, row.get("devices"), now)
    price = (run_price(spec.hardware) or None) if spec is not None else None  # 0: no price
    remote = bool(spec is not None and spec.checkpoint.remote)
    per_step = usd_per_step(price, row.get("devices"), rate)
    eta = eta_s(row, rate)
    batch = spec.training.global_batch_size if spec is not None else None
    return RunFigures(
        steps_per_s=rate,
        samples_per_s=rate * batch if rate and batch else row.get("samples_per_s"),
        eta_s=eta,
        device_hours=dev_s / 3600.0,
        cost_usd=None if price is None else price * dev_s / 3600.0,
        usd_per_step=per_step,
        usd_to_finish=None if per_step is None or eta is None else per_step * eta * rate,
        recoveries=recoveries(events, row),
        steps_lost=steps_lost(events),
        straggler_nodes=next(
            (_data(e).get("nodes", []) for e in reversed(events) if e["kind"] == "straggler"), []
        ),
        **upload_figures(row, events, now, remote),
        **data_figures(records),
    )


def data_figures(records: list[dict]) -> dict:
    """The newest step's epoch and the newest eval loss among ``records``."""
    step = next((r for r in reversed(records) if r["kind"] == Kind.STEP), {})
    ev = next((r for r in reversed(records) if r["kind"] == Kind.EVAL), None)
    got = None if ev is None else (ev["step"], ev["eval_loss"])
    return {"epoch": step.get("epoch"), "eval_loss": got, "avg_distance": avg_distance(records)}


def avg_distance(records: list[dict]) -> tuple[int, list[float]] | None:
    """AvgPipe: each parallel model's distance from the reference at the newest step
    for which every stage reported (see :func:`distance_series`)."""
    series = distance_series(records)
    return series[-1] if series else None


def distance_series(records: list[dict]) -> list[tuple[int, list[float]]]:
    """AvgPipe: (step, each parallel model's distance from the reference), the square
    root of its stages' ``avg_dist2`` (heartbeats; a stage's replicas hold the same
    value), for every step that every stage seen reported, in step order."""
    by_step: dict[int, dict[int, list[float]]] = {}
    for r in records:
        if r["kind"] == Kind.HEARTBEAT and isinstance(r.get("avg_dist2"), list):
            by_step.setdefault(r["step"], {})[r["stage"]] = r["avg_dist2"]
    stages = {s for parts in by_step.values() for s in parts}
    out = []
    for step in sorted(k for k, parts in by_step.items() if set(parts) == stages):
        sums = [sum(d) for d in zip(*by_step[step].values(), strict=True)]
        out.append((step, [math.sqrt(x) for x in sums]))
    return out


def rank_compute(records: list[dict]) -> list[dict]:
    """Each rank's newest heartbeat, with its slowdown over its stage peers' median at
    that step (per-micro-batch forward+backward; None without a peer)."""
    newest: dict[int, dict] = {}
    by_step: dict[int, dict[int, dict]] = {}
    for r in records:
        if r["kind"] == Kind.HEARTBEAT and "rank" in r:
            newest[r["rank"]] = r
            by_step.setdefault(r["step"], {})[r["rank"]] = r
    out = []
    for rank in sorted(newest):
        hb = newest[rank]
        peers = [
            per_micro_batch_s(p)
            for k, p in by_step[hb["step"]].items()
            if k != rank and p.get("stage") == hb.get("stage")
        ]
        med = statistics.median(peers) if peers else None
        out.append({**hb, "slowdown": per_micro_batch_s(hb) / med - 1 if med else None})
    return out
