"""Where calibrations live: fingerprints, the on-disk cache, and choosing a record.

Measured records are JSON files ``<home>/calibration/<fingerprint key>.json`` under the
state home (``$JOBCTL_HOME`` or ./.jobctl). A record is reused when its fingerprint
(model hash, device, torch version, threads) matches the job's; anything else means
the costs may have changed and the planner falls back to the analytic calibration. A
change of ``data`` fields keeps the record (``model_hash``).
Values a measured record took from the hardware spec (inter-node links, which one
machine cannot measure) are re-derived from the current spec on every use.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from jobctl.engine.calibration.analytic import (
    allreduce_from_spec,
    analytic_calibration,
    analytic_fingerprint,
    link_from_spec,
)
from jobctl.engine.calibration.record import CALIBRATION_VERSION, Calibration, Fingerprint
from jobctl.engine.core.env import STATE_HOME
from jobctl.engine.core.home import default_home
from jobctl.spec import HardwareSpec, JobSpec
from jobctl.spec.files import read_regular_text

DEFAULT_THREADS = 1  # worker processes run with one intra-op thread (JOBCTL_THREADS)


class CalibrationError(ValueError):
    """A calibration file that cannot be used (unreadable, or another format version)."""


def model_hash(spec: JobSpec) -> str:
    """sha256 of everything that changes per-block costs: model and numerics. Not the
    data source: it changes only the fetch time, which the record keeps with the source
    it was measured with (``Calibration.data_source``); a job reading another source
    keeps the measured compute and its plan says the fetch times are from another
    source (``resolver.describe``)."""
    key = {
        "model": spec.model.model_dump(mode="json"),
        "precision": spec.training.precision,
        "optimizer": spec.training.optimizer,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def device_name(kind: str) -> str:
    """``cpu:<model name> x<cores>`` or ``cuda:<GPU name>`` of this machine."""
    if kind == "cuda":
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "unavailable"
        return f"cuda:{name}"
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"cpu:{name} x{len(os.sched_getaffinity(0))}"


def fingerprint(spec: JobSpec, threads: int = DEFAULT_THREADS) -> Fingerprint:
    """This machine's fingerprint for the spec's model and device."""
    return Fingerprint(
        model=model_hash(spec),
        device=device_name(spec.hardware.device),
        torch=torch.__version__,
        threads=threads,
    )


def cache_path(home: Path | None, fp: Fingerprint) -> Path:
    return Path(home or default_home()) / "calibration" / f"{fp.key}.json"


def save(cal: Calibration, home: Path | None = None) -> Path:
    """Write ``cal`` to the cache (atomically: a reader never sees half a file);
    CalibrationError, one line with the fix, when the cache's folder cannot be written
    (a home that is a file gave NotADirectoryError after a whole measurement)."""
    path = cache_path(home, cal.fingerprint)
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(cal.model_dump_json(indent=1))
        tmp.replace(path)
    except OSError as e:
        raise CalibrationError(
            f"calibration cache {path.parent}: cannot write it ({e.strerror or e}); point "
            f"{STATE_HOME} (or --home) at a folder jobctl may write"
        ) from None
    return path


def load(path: Path) -> Calibration:
    """Read a calibration file; CalibrationError if it is not a usable record."""
    try:  # a regular file only: a FIFO planted in the cache hung `plan` (#46 item 6)
        raw = json.loads(read_regular_text(path))
    except (OSError, ValueError) as e:  # also not UTF-8
        raise CalibrationError(f"{path}: cannot read calibration: {e}") from None
    if not isinstance(raw, dict):
        raise CalibrationError(f"{path}: not a calibration record: run `jobctl calibrate` again")
    if raw.get("version") != CALIBRATION_VERSION:
        raise CalibrationError(
            f"{path}: calibration format version {raw.get('version')}, "
            f"this jobctl reads version {CALIBRATION_VERSION}: run `jobctl calibrate` again"
        )
    try:
        return Calibration.model_validate(raw)
    except ValueError as e:  # pydantic's ValidationError: a damaged or edited record
        first = str(e).splitlines()[0]
        raise CalibrationError(
            f"{path}: damaged calibration ({first}): run `jobctl calibrate` again"
        ) from None


def find_cached(
    spec: JobSpec, home: Path | None = None, threads: int = DEFAULT_THREADS
) -> tuple[Calibration, Path] | None:
    """The cached measured calibration matching this spec and machine, if any."""
    fp = fingerprint(spec, threads)
    path = cache_path(home, fp)
    if not path.exists():
        return None
    try:
        cal = load(path)
    except CalibrationError:
        return None
    return (with_spec_links(cal, spec.hardware), path) if cal.fingerprint == fp else None


def with_spec_links(cal: Calibration, hardware: HardwareSpec) -> Calibration:
    """``cal`` with every analytic link and allreduce re-derived from the current spec."""
    update = {}
    for name, same_node in (("p2p_intra", True), ("p2p_inter", False)):
        if getattr(cal, name).source == "analytic":
            update[name] = link_from_spec(hardware, same_node)
    for name, same_node in (("allreduce_intra", True), ("allreduce_inter", False)):
        if getattr(cal, name).source == "analytic":
            update[name] = allreduce_from_spec(hardware, same_node)
    return cal.model_copy(update=update)


def calibration_for(spec: JobSpec, home: Path | None = None) -> Calibration:
    """The cached measured calibration for this spec if one matches, else analytic."""
    found = find_cached(spec, home)
    if found is not None:
        return found[0]
    return analytic_for(spec)


def analytic_for(spec: JobSpec) -> Calibration:
    """The analytic calibration of ``spec``, fingerprinted with its model's hash."""
    return analytic_calibration(spec, analytic_fingerprint(spec.hardware, model_hash(spec)))
