"""One simulated step of a Mobius pipeline: compute and swaps, rank by rank (sec. 3.1).

``simulate_mobius(stages, cfg)`` plays the step the way ``engine.mobius.runtime``'s
``MobiusRunner`` runs it: the stages in one global order ``F0 .. F(S-2), FB(S-1),
B(S-2) .. B0``, each rank its own ones. A rank is two sequential resources, its
training thread (compute) and its I/O queue (the link to its tier, FIFO in issue
order, one transfer at a time: at most one prefetch in flight, into the reserved
buffer). Per stage, in the runtime's order:

* the upload of its parameters (for a forward, with the update on upload, its
  gradients and optimizer slots too, then the update and the store of parameters and
  slots back down), issued while the rank's previous stage computes (``prefetch``),
  else where the previous stage has finished, and waited for before the stage runs;
* a backward's upload also issues the reload of its offloaded inputs, one per
  micro-batch (stage 0's inputs are the tokens, kept);
* forward: per micro-batch, the input from stage j - 1 (``boundary / link`` seconds
  across ranks, none on one rank), its offload, the compute, the output on;
* the last stage runs forward and backward per micro-batch while resident;
* backward: per micro-batch, the gradient from stage j + 1 and the reload, the compute
  (recompute included in ``backward_s``), the input's gradient back;
* after a backward, the gradients go down.

Without prefetch every transfer is waited for where it is issued, the runtime's
no-overlap baseline: on one rank the step is then the serial sum of its parts.

Root-complex contention (eq. 12-13's premise): ranks under one PCIe root complex
share its bandwidth while their transfers overlap; each active transfer moves at
``min(tier_Bps, complex_Bps / k)`` with k the complex's active transfers, re-rated at
every start and end (processor sharing). Costs are deterministic; the step ends when
every rank's compute and I/O queue are done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MobiusSimConfig", "MobiusSimResult", "SwapEvent", "SwapStage", "simulate_mobius"]

EPS = 1e-12
#: Transfer kinds (bars in the Gantt, beside the compute kinds F, B and FB).
SWAPS = ("upload", "prefetch", "offload", "reload", "download", "update")


@dataclass(frozen=True)
class SwapStage:
    """One stage's costs: times per micro-batch, bytes per transfer."""

    forward_s: float
    backward_s: float  # the recompute of the forward included
    param_bytes: float
    grad_bytes: float | None = None  # None: param_bytes
    optim_bytes: float = 0.0  # optimizer slots (read and written by the update)
    update_s: float = 0.0  # the optimizer update's compute, on the I/O side
    input_bytes: float = 0.0  # one micro-batch's input: offloaded, reloaded, its gradient back
    boundary_bytes: float = 0.0  # one micro-batch's output sent to the next stage

    @property
    def grads(self) -> float:
        return self.param_bytes if self.grad_bytes is None else self.grad_bytes


class MobiusSimConfig(BaseModel):
    """The machine and the run the step is simulated on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    devices: int = Field(ge=1, description="N: ranks (one device each)")
    micro_batches: int = Field(ge=1, description="M: micro-batches per step")
    tier_Bps: float = Field(gt=0, description="B: one rank's bandwidth to its tier, B/s")  # noqa: N815
    link_Bps: float | None = Field(  # noqa: N815
        None, gt=0, description="activation bandwidth between ranks, B/s (None: tier_Bps)"
    )
    prefetch: bool = Field(True, description="upload the next stage while this one computes")
    update_on_upload: bool = Field(
        True, description="a forward upload reads gradients and slots and runs the update"
    )
    placement: tuple[int, ...] | None = Field(
        None, description="the rank of each stage (None: stage j on rank j % N)"
    )
    root_complexes: list[list[int]] | None = Field(
        None, description="ranks under each PCIe root complex (None: one complex per rank)"
    )
    complex_Bps: float | None = Field(  # noqa: N815
        None, gt=0, description="a root complex's bandwidth, B/s (None: tier_Bps)"
    )

    @model_validator(mode="after")
    def _complexes(self) -> MobiusSimConfig:
        if self.root_complexes is not None:
            flat = sorted(r for rc in self.root_complexes for r in rc)
            if flat != list(range(self.devices)):
                raise ValueError(
                    f"root_complexes: {self.root_complexes} must list each rank "
                    f"0..{self.devices - 1} exactly once"
                )
        return self

    def ranks(self, S: int) -> tuple[int, ...]:
        got = self.placement or tuple(j % self.devices for j in range(S))
        if len(got) != S or set(got) != set(range(self.devices)):
            raise ValueError(
                f"placement: {got} must give each of the {S} stages a rank 0..{self.devices - 1},"
                " every rank at least one stage"
            )
        return tuple(got)

    def complex_of(self) -> list[int]:
        if self.root_complexes is None:
            return list(range(self.devices))
        return [
            next(k for k, rc in enumerate(self.root_complexes) if r in rc)
            for r in range(self.devices)
        ]


@dataclass(frozen=True)
class SwapEvent:
    """One bar: ``kind`` (F, B, FB or one of ``SWAPS``) of ``stage`` on ``rank``."""

    rank: int
    kind: str
    stage: int
    micro_batch: int | None
    start: float
    end: float


@dataclass
class MobiusSimResult:
    """The step's time, each rank's compute and transfer time, and every bar."""

    step_time: float
    busy: list[float]  # compute seconds per rank
    moving: list[float]  # seconds per rank its I/O queue was moving or updating
    events: list[SwapEvent]

    @property
    def idle_share(self) -> float:
        """As ``SimResult.idle_share``: here the ranks' mean (``bubble_ratio``)."""
        return self.bubble_ratio

    @property
    def bubble_ratio(self) -> float:
        """The share of rank-seconds not computing."""
        if self.step_time <= 0:
            return 0.0
        return 1 - sum(self.busy) / (self.step_time * len(self.busy))


@dataclass(eq=False)
class _Handle:
    """A transfer, an update or a message: ``done`` once finished (or arrived)."""

    done: float | None = None


@dataclass(eq=False)
class _Job:
    """An entry of a rank's I/O queue: bytes to move, or seconds of update."""

    kind: str
    stage: int
    micro_batch: int | None
    nbytes: float
    seconds: float
    handle: _Handle = field(default_factory=_Handle)
    then: _Job | None = None  # queued when this one ends (an update's store)
    start: float = 0.0
    left: float = 0.0  # bytes (or seconds) still to go once started


#: A rank's program: yields ("wait", handles) or ("compute", seconds, kind, stage, mb).
_Program = Generator[tuple, None, None]


class _Sim:
    """The event loop: rank programs, their I/O queues, messages between ranks."""

    def __init__(self, stages: list[SwapStage], cfg: MobiusSimConfig):
        self.stages, self.cfg = stages, cfg
        self.S, self.M = len(stages), cfg.micro_batches
        self.rank_of = cfg.ranks(self.S)
        self.complex = cfg.complex_of()
        self.cap = cfg.complex_Bps or cfg.tier_Bps
        self.link = cfg.link_Bps or cfg.tier_Bps
        self.now = 0.0
        self.queues: list[deque[_Job]] = [deque() for _ in range(cfg.devices)]
        self.active: list[_Job | None] = [None] * cfg.devices
        self.msgs: dict[tuple[str, int, int], _Handle] = {}
        self.events: list[SwapEvent] = []
        self.busy = [0.0] * cfg.devices
        self.moving = [0.0] * cfg.devices

    def issue(
        self,
        rank: int,
        kind: str,
        j: int,
        nbytes: float,
        i: int | None = None,
        seconds: float = 0.0,
    ) -> _Handle:
        """Queue a transfer (or, ``seconds``, an update) on ``rank``'s I/O queue."""
        job = _Job(kind, j, i, nbytes, seconds)
        if nbytes <= 0 and seconds <= 0:
            job.handle.done = self.now
        else:
            self.queues[rank].append(job)
        return job.handle

    def msg(self, kind: str, j: int, i: int) -> _Handle:
        return self.msgs.setdefault((kind, j, i), _Handle())

    def post(self, kind: str, j: int, i: int, to: int, nbytes: float) -> None:
        """Stage j's output (``a``, to j + 1) or input gradient (``g``, to j - 1)."""
        frm = self.rank_of[j]
        delay = 0.0 if frm == self.rank_of[to] else nbytes / self.link
        self.msg(kind, j, i).done = self.now + delay

    def program(self, r: int) -> _Program:
        """Rank ``r``'s step: ``MobiusRunner.step`` as waits and computes."""
        S, pf = self.S, self.cfg.prefetch
        order = [(j, "f") for j in range(S - 1)] + [(S - 1, "fb")]
        order += [(j, "b") for j in range(S - 2, -1, -1)]
        order = [(j, mode) for j, mode in order if self.rank_of[j] == r]
        nxt = yield from self.upload(r, *order[0], "upload")
        for k, (j, mode) in enumerate(order):
            cur, nxt, more = nxt, None, k + 1 < len(order)
            yield ("wait", cur[0])
            if more and pf:
                nxt = yield from self.upload(r, *order[k + 1], "prefetch")
            yield from getattr(self, f"run_{mode}")(j, cur[1])
            if mode != "f":
                yield from self.wait_unless_prefetch(
                    self.issue(r, "download", j, self.stages[j].grads)
                )
            if more and nxt is None:
                nxt = yield from self.upload(r, *order[k + 1], "upload")

    def wait_unless_prefetch(self, *handles: _Handle) -> _Program:
        """Without prefetch a transfer is waited for where it is issued."""
        if not self.cfg.prefetch:
            yield ("wait", list(handles))

    def upload(self, r: int, j: int, mode: str, kind: str) -> _Program:
        """Issue stage j's upload (and update, and reloads); returns (what its run
        waits for, the reload of each micro-batch's input)."""
        s = self.stages[j]
        update = mode != "b" and self.cfg.update_on_upload
        nbytes = s.param_bytes + (s.grads + s.optim_bytes if update else 0.0)
        read = self.issue(r, kind, j, nbytes)
        yield from self.wait_unless_prefetch(read)
        waits = [read]
        if update:
            waits += self.update(r, j)
            yield from self.wait_unless_prefetch(*waits[1:])
            waits = waits if not self.cfg.prefetch else waits[:2]
        acts = []
        if mode == "b" and j > 0:
            acts = [self.issue(r, "reload", j, s.input_bytes, i) for i in range(self.M)]
        return waits, acts

    def update(self, r: int, j: int) -> list[_Handle]:
        """The update on upload, then the store of parameters and slots, queued when
        the update ends (the runtime issues it from the update); their handles."""
        s = self.stages[j]
        store = _Job("download", j, None, s.param_bytes + s.optim_bytes, 0.0)
        job = _Job("update", j, None, 0.0, s.update_s, then=store)
        if s.update_s > 0:
            self.queues[r].append(job)
        else:
            job.handle.done = self.now
            self.queues[r].append(store)
        return [job.handle, store.handle]

    def run_f(self, j: int, _acts: list[_Handle]) -> _Program:
        s, r = self.stages[j], self.rank_of[j]
        for i in range(self.M):
            if j > 0:
                yield ("wait", [self.msg("a", j - 1, i)])
                yield from self.wait_unless_prefetch(self.issue(r, "offload", j, s.input_bytes, i))
            yield ("compute", s.forward_s, "F", j, i)
            self.post("a", j, i, j + 1, s.boundary_bytes)

    def run_fb(self, j: int, _acts: list[_Handle]) -> _Program:
        s = self.stages[j]
        for i in range(self.M):
            if j > 0:
                yield ("wait", [self.msg("a", j - 1, i)])
            yield ("compute", s.forward_s + s.backward_s, "FB", j, i)
            if j > 0:
                self.post("g", j, i, j - 1, self.stages[j - 1].boundary_bytes)

    def run_b(self, j: int, acts: list[_Handle]) -> _Program:
        s = self.stages[j]
        for i in range(self.M):
            yield ("wait", [self.msg("g", j + 1, i), *acts[i : i + 1]])
            yield ("compute", s.backward_s, "B", j, i)
            if j > 0:
                self.post("g", j, i, j - 1, self.stages[j - 1].boundary_bytes)

    def play(self) -> MobiusSimResult:
        """Run every rank's program to its end; the result."""
        progs = [self.program(r) for r in range(self.cfg.devices)]
        self.req: list[tuple | None] = [None] * len(progs)
        self.wake = [0.0] * len(progs)
        for r in range(len(progs)):
            self.next_request(progs, r)
        for _ in range(64 * self.S * (3 * self.M + 8)):  # each turn ends >= 1 bar, or stalls
            self.settle(progs)
            if all(q is None for q in self.req) and not self.pending_io():
                break
            self.advance(self.next_time())
        else:
            raise RuntimeError("Mobius simulation stalled: time stopped advancing")
        end = max((e.end for e in self.events), default=0.0)
        self.events.sort(key=lambda e: (e.start, e.rank, e.end))
        return MobiusSimResult(end, self.busy, self.moving, self.events)

    def next_request(self, progs: list[_Program], r: int) -> None:
        """Rank r's next wait or compute (a compute starts now)."""
        try:
            req = next(progs[r])
        except StopIteration:
            req = None
        if req is not None and req[0] == "compute":
            _, seconds, kind, j, i = req
            self.wake[r] = self.now + seconds
            self.busy[r] += seconds
            self.events.append(SwapEvent(r, kind, j, i, self.now, self.wake[r]))
        self.req[r] = req

    def satisfied(self, r: int) -> bool:
        req = self.req[r]
        if req is None:
            return False
        if req[0] == "compute":
            return self.wake[r] <= self.now + EPS
        return all(h.done is not None and h.done <= self.now + EPS for h in req[1])

    def settle(self, progs: list[_Program]) -> None:
        """Advance every rank and start every idle I/O queue's head, until nothing moves."""
        moved = True
        while moved:
            moved = False
            for r in range(len(progs)):
                while self.satisfied(r):
                    self.next_request(progs, r)
                    moved = True
                if self.active[r] is None and self.queues[r]:
                    job = self.active[r] = self.queues[r].popleft()
                    job.start, job.left = self.now, job.nbytes or job.seconds
                    moved = True
            moved = self.finish_done() or moved

    def pending_io(self) -> bool:
        return any(self.queues) or any(a is not None for a in self.active)

    def rates(self) -> list[float]:
        """Per rank, its active job's progress per second (bytes, or 1 for an update)."""
        moving = [a is not None and a.nbytes > 0 for a in self.active]
        share = [0] * (max(self.complex) + 1)
        for r, m in enumerate(moving):
            share[self.complex[r]] += m
        bw = self.cfg.tier_Bps
        return [
            min(bw, self.cap / share[self.complex[r]]) if moving[r] else 1.0
            for r in range(len(moving))
        ]

    def next_time(self) -> float:
        """The earliest future event: a compute's end, a job's end, a message's arrival."""
        times = [w for r, w in enumerate(self.wake) if self.req[r] and self.req[r][0] == "compute"]
        times += [h.done for h in self.msgs.values() if h.done is not None and h.done > self.now]
        rates = self.rates()
        times += [self.now + a.left / rates[r] for r, a in enumerate(self.active) if a]
        if not times:
            raise RuntimeError("Mobius simulation stalled: a rank waits for what never comes")
        return max(min(times), self.now)

    def advance(self, t: float) -> None:
        """Move every active job on to time ``t``."""
        rates, dt = self.rates(), t - self.now
        for a, rate in zip(self.active, rates, strict=True):
            if a is not None:  # ends by t: done (no float residue that never reaches 0)
                a.left = 0.0 if self.now + a.left / rate <= t else a.left - rate * dt
        self.now = t

    def finish_done(self) -> bool:
        """End the jobs with nothing left: their handles, bars and follow-ups."""
        ended = False
        for r, a in enumerate(self.active):
            if a is None or a.left > 0:
                continue
            a.handle.done = self.now
            self.moving[r] += self.now - a.start
            self.events.append(SwapEvent(r, a.kind, a.stage, a.micro_batch, a.start, self.now))
            if a.then is not None:
                self.queues[r].append(a.then)  # issued by the update: last in line
            self.active[r], ended = None, True
        return ended


def simulate_mobius(stages: list[SwapStage], cfg: MobiusSimConfig) -> MobiusSimResult:
    """One step of ``stages`` under ``cfg`` (see the module doc)."""
    if len(stages) <= cfg.devices:
        raise ValueError(
            f"stages: {len(stages)}; a Mobius pipeline has more stages than devices "
            f"(S > N = {cfg.devices})"
        )
    return _Sim(stages, cfg).play()
