"""Options, consoles and look-ups shared by the ``jobctl`` command modules.

Imports only typer and rich at module level: every command module imports this one, and
``--help``, ``validate``, ``status``, ``logs``, ``events`` and ``schema`` must start
without the planner (torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from jobctl.engine.views.markup import styled
from jobctl.engine.views.prose import ProseConsole

if TYPE_CHECKING:
    from jobctl.engine.core.plan import Plan
    from jobctl.engine.state.db import StateDB
    from jobctl.spec import JobSpec
    from jobctl.spec.base import Violation

# ProseConsole: at a terminal, a line of prose wraps between words at its width, never
# inside a word, a path or a `command`: what a user copies is exactly what runs (#47); in
# a pipe each line stays whole. A script or a log line prints as it is (soft_wrap=True).
# Tables keep their width. markup=False: text from a spec, a worker or the DB prints as
# it is; jobctl's own colours go through views.markup.styled (#46 item 4).
console = ProseConsole(soft_wrap=True, markup=False)
err = ProseConsole(stderr=True, soft_wrap=True, markup=False)

HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="state dir (default $JOBCTL_HOME or ./.jobctl)")
]
RunArg = Annotated[str, typer.Argument(help="run id or name")]
SpecArg = Annotated[Path, typer.Argument(help="job spec YAML file", show_default=False)]
DevicesOpt = Annotated[
    int | None, typer.Option("--devices", help="plan for N devices instead of the pool")
]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="override hardware.backend")]


def find_run(db: StateDB, ref: str) -> dict:
    """The run ``ref`` names (id, or the newest run of that name); exit 2 if none."""
    row = db.get_run(ref)
    if row is None:
        err.print(styled("[red]error:[/red] no run {!r}; `jobctl status` lists runs", ref))
        raise typer.Exit(2)
    return row


def load_or_exit(path: Path, overrides: dict | None = None, backend: str | None = None) -> JobSpec:
    """The job spec at ``path``; exit 2 with every issue when it is invalid or missing.
    ``backend`` is the command's ``--backend``, where it has one: it, not the spec's
    ``hardware.backend``, says whether the run starts on this machine."""
    from jobctl.spec import SpecError, load_spec

    try:
        spec = load_spec(path, overrides=overrides)
        check_data(spec, path, backend)
        return spec
    except SpecError as e:
        if _is_fleet_file(path):  # a newcomer's `jobctl plan jobs/fleet-sweep.yaml`
            err.print(styled("[red]error:[/red] {}: a fleet file, not a job spec", path))
            err.print(f"  fix: `jobctl fleet plan {path}`, then `jobctl fleet apply {path}`")
            raise typer.Exit(2) from None
        err.print(styled("[red]error:[/red] {}: invalid job spec", path), highlight=False)
        err.print(str(e), highlight=False, markup=False)
        raise typer.Exit(2) from None
    except FileNotFoundError:
        err.print(styled("[red]error:[/red] {}: no such file", path))
        raise typer.Exit(2) from None


def _is_fleet_file(path: Path) -> bool:
    """Whether ``path`` holds a fleet (a ``template`` and its members) rather than a
    job spec: the job spec's own errors would list a dozen keys it does not know."""
    import yaml

    try:  # a regular file only: a FIFO given as the spec must not block here (#46 6)
        doc = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, ValueError, RecursionError, yaml.YAMLError):  # as the spec's loader
        return False
    keys = set(doc) if isinstance(doc, dict) else set()
    return "template" in keys and bool(keys & {"matrix", "runs", "params", "member_name"})


def check_data(spec: JobSpec, path: Path, backend: str | None = None) -> None:
    """Raise a SpecError, located in ``path``, for what the data files, the model
    source (an import factory, a Hugging Face class or directory), the ssh key and,
    for a run started here, the CUDA device, which live on this machine, show is
    wrong. ``backend`` overrides ``hardware.backend`` (``--backend``)."""
    from jobctl.engine.data.checks import data_violations
    from jobctl.spec import SpecError
    from jobctl.spec.data import located
    from jobctl.spec.hosts import ssh_violations

    hw = spec.hardware
    found = data_violations(spec) + ssh_violations(hw.ssh, hw.backend)
    found += cuda_violations(hw.device, backend or hw.backend)
    if spec.model.huggingface is not None or spec.model.import_ is not None:
        from jobctl.engine.model.graph.checks import model_violations

        found += model_violations(spec)  # builds it with meta parameters: no weights
    issues = located(str(path), found)
    if issues:
        raise SpecError(issues)


def cuda_violations(device: str, backend: str) -> list[Violation]:
    """``hardware.device: cuda`` on the local backend where this machine cannot run
    CUDA: a torch built without it, or no device visible. Checked where the CLI loads a
    spec, not in the spec's validators: the nodes load the spec too, and a remote
    backend's devices are on its nodes, not here."""
    if device != "cuda" or backend != "local":
        return []  # torch loads only here: `validate` of any other spec stays light
    from jobctl.spec.base import Violation

    try:
        import torch
    except ImportError:
        why = "torch is not installed on this machine"
    else:
        if torch.version.cuda is None:
            why = f"torch {torch.__version__} has no CUDA (a CPU build)"
        elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            why = f"no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda})"
        else:
            return []
    # Without this the local backend starts every worker and each fails in NCCL's init,
    # after the run was recorded as the job's latest one.
    fix = (
        "set hardware.device: cpu, or run on a machine with a CUDA device, or use a remote backend"
    )
    return [Violation("hardware.device", f"cuda on the local backend, but {why}", fix)]


def for_devices(spec: JobSpec, devices: int | None) -> JobSpec:
    """``spec`` to plan on ``devices`` (``--devices``): P and D that the spec fixes to
    another device count are re-planned for ``devices``, as a morph does (same global
    batch), and the command says so."""
    par = spec.parallelism
    P, D = par.pipeline_stages, par.data_parallel
    pool = spec.hardware.devices
    if devices is not None and devices > pool:  # #47: it was planned without a word
        err.print(
            f"--devices {devices}: more than the pool's {pool} (hardware.nodes x "
            f"processes_per_node); planned for {devices} as asked",
            highlight=False,
        )
    if devices is None or not (isinstance(P, int) and isinstance(D, int)) or devices == P * D:
        return spec
    err.print(
        f"--devices {devices}: the spec fixes P x D = {P} x {D} = {P * D} devices; "
        f"P and D re-planned for {devices} device(s) with the same global batch "
        "(as a morph does)",
        highlight=False,
    )
    par = par.model_copy(update={"pipeline_stages": "auto", "data_parallel": "auto"})
    return spec.model_copy(update={"parallelism": par})


def plan_or_exit(spec: JobSpec, path: Path, devices: int | None, home: Path | None = None) -> Plan:
    """The plan of ``spec`` for ``devices`` (see ``for_devices``), priced by the measured
    calibration under ``home`` where one matches; exit 2 when none fits."""
    from jobctl.engine.planner.resolver import PlanError, make_plan

    try:
        return make_plan(for_devices(spec, devices), devices, home=home)
    except (PlanError, ValueError) as e:
        cannot_plan(path, e)


def cannot_plan(path: Path, e: Exception, doing: str = "plan") -> NoReturn:
    """Exit 2 with ``e`` (a PlanError, a model that cannot be built or traced) and its
    fix where it carries one (``FixableError.fix``)."""
    err.print(styled("[red]error:[/red] {}: cannot {}: {}", path, doing, e), highlight=False)
    fix = getattr(e, "fix", None)
    if fix:
        err.print(f"  fix: {fix}", highlight=False)
    raise typer.Exit(2) from None


def tuned_or_exit(spec: JobSpec, path: Path, home: Path | None, show: bool = True) -> JobSpec:
    """``spec`` with AvgPipe's ``auto`` (M, N) resolved (``averaging.tuning``: one
    profile, then every setting predicted), the table printed; exit 2 when none fits."""
    from jobctl.engine.averaging.tuning import resolve
    from jobctl.engine.views.averaging_tuning import print_tuning

    par = spec.parallelism
    if par.averaging != "elastic" or "auto" not in (par.micro_batches, par.parallel_pipelines):
        return resolve(spec, home)[0]  # a fixed M written out as the micro-batch size
    err.print("profiling AvgPipe's (M, N) for 20 batches ...", highlight=False)
    try:
        spec, tuning = resolve(spec, home)
    except (ValueError, RuntimeError) as e:
        err.print(styled("[red]error:[/red] {}: cannot tune (M, N): {}", path, e), highlight=False)
        raise typer.Exit(2) from None
    if show and tuning is not None:
        print_tuning(console, tuning)
    return spec
