"""A survivor stops waiting for the supervisor's word once its own node is torn down
(SIGTERM from its agent): the failure is reported at once, not after torchrun's grace."""

from __future__ import annotations

import os
import signal
import time

from torch.distributed import HashStore

from jobctl.engine.worker import survival


def test_a_sigterm_during_the_hand_over_is_caught_and_the_old_handler_restored():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("old"))
    try:
        with survival._teardown() as signalled:
            assert not signalled()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # delivered to the main thread at the next bytecode
            assert signalled()
        assert seen == []  # the trainer's handler did not run: no stop vote now
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert seen == ["old"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_waiting_for_a_key_ends_when_torn_and_not_before():
    store = HashStore()
    start = time.monotonic()
    assert survival.wait_key(store, "never", 30.0, torn=lambda: True) is None
    assert time.monotonic() - start < 1.0
    assert survival.wait_key(store, "never", 0.1) is None  # the bound still holds
    store.set("word", '{"nodes": [1]}')
    assert survival.wait_key(store, "word", 5.0, torn=lambda: False) == {"nodes": [1]}
