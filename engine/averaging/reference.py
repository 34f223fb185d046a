"""The reference model of one rank's stage, kept by its own thread (AvgPipe steps 4-5).

The parallel pipelines hand their local updates to :meth:`ReferenceModel.submit`, which
only puts them on a queue, so sending never blocks a pipeline (step 3). The thread
accumulates a batch's N updates in the order they were sent (E4) and, once all N are
in, normalises and applies them (E5). ``version`` counts the batches applied:
:meth:`wait_for` lets a pipeline dilute with exactly r_t (E3) and lets a checkpoint or
an evaluation read a settled reference. An error on the thread is raised again in the
training thread at its next call.
"""

from __future__ import annotations

import queue
import threading

import torch
from torch import nn

from jobctl.engine.averaging.rule import accumulate, apply_mean

_STOP = None


class ReferenceModel:
    """The reference's tensors of one stage and the thread that updates them."""

    def __init__(self, stage: nn.Module, n: int, version: int = 0):
        self.stage, self.n = stage, n
        self.tensors = [p.detach() for p in stage.parameters()]
        self.version = version  # batches applied: the reference is r_version
        self._inbox: queue.Queue = queue.Queue()
        self._applied = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="avgpipe-reference", daemon=True)
        self._thread.start()

    def submit(self, batch: int, update: list[torch.Tensor]) -> None:
        """Step 3: queue one parallel model's local update of ``batch`` (the tensors
        become the thread's; the caller must not touch them again)."""
        self._raise()
        self._inbox.put((batch, update))

    def wait_for(self, version: int) -> None:
        """Block until batches ``0 .. version-1`` are applied (the reference is r_version)."""
        with self._applied:
            self._applied.wait_for(lambda: self.version >= version or self._error is not None)
        self._raise()

    def close(self, check: bool = True) -> None:
        """Apply what was sent, then stop the thread (raising its error if ``check``)."""
        self._inbox.put(_STOP)
        self._thread.join()
        if check:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("the AvgPipe reference thread failed") from self._error

    def _run(self) -> None:
        total, got = None, 0
        try:
            while (item := self._inbox.get()) is not _STOP:
                batch, update = item
                if batch != self.version:
                    raise RuntimeError(f"update of batch {batch} while at {self.version}")
                total, got = accumulate(total, update), got + 1
                if got == self.n:  # every parallel pipeline finished the batch
                    apply_mean(self.tensors, total, self.n)
                    total, got = None, 0
                    with self._applied:
                        self.version += 1
                        self._applied.notify_all()
        except BaseException as e:  # handed to the training thread
            with self._applied:
                self._error = e
                self._applied.notify_all()
