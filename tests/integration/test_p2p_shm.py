"""Shared-memory channels between two real processes of one gloo group."""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.runtime.p2p.shm import PeerGone, ShmInbox, ShmOutbox, connect, ring_slots

SHAPE = (2, 3)


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )


def _exchange(rank: int, port: int, out: str, n: int) -> None:
    _init(rank, port)
    peer = 1 - rank
    link = connect(peer, SHAPE, torch.float32, torch.device("cpu"), True, 30.0, 4)
    dist.barrier()  # both have returned: the lower rank unlinks the names before it does
    rec = {"linked": link is not None, "left": os.path.exists(link.out.path + ".data")}
    order = list(range(n))
    if rank == 0:  # sends n activations (more than the ring holds), then takes n back
        box = ShmOutbox(link.out)
        for i in order:
            box.send(i, torch.full(SHAPE, float(i)))
        inbox = ShmInbox(link.into, order)
        rec["ready_out_of_order"] = inbox.ready(1)
        rec["got"] = [float(inbox.take(i)[0, 0]) for i in order]
    else:
        inbox, box = ShmInbox(link.into, order), ShmOutbox(link.out)
        got = []
        for i in order:
            while not inbox.ready(i):
                pass
            x = inbox.take(i)
            got.append(float(x.sum()) / x.numel())
        for i in order:
            box.send(i, torch.full(SHAPE, -got[i]))
        rec["got"] = got
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(rec))
    link.close()
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, tmp_path: Path, *args) -> list[dict]:
    mp.start_processes(fn, args=(_port(), str(tmp_path), *args), nprocs=2, start_method="spawn")
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.multiproc
def test_messages_arrive_in_order_through_a_full_ring_and_nothing_is_left_on_disk(tmp_path):
    n = 3 * ring_slots(4) + 1  # each sender waits for slots to come back
    r0, r1 = _spawn(_exchange, tmp_path, n)
    assert r0["linked"] and r1["linked"]
    assert not r0["left"] and not r1["left"]  # names unlinked once both ends were open
    assert r1["got"] == [float(i) for i in range(n)]
    assert r0["got"] == [-float(i) for i in range(n)]
    assert r0["ready_out_of_order"] is False


def _peer_dies(rank: int, port: int, out: str) -> None:
    _init(rank, port)
    link = connect(1 - rank, SHAPE, torch.float32, torch.device("cpu"), True, 30.0)
    if rank == 1:
        os._exit(0)  # killed: its FIFO ends close with the process
    rec = {}
    try:
        ShmInbox(link.into, [0]).take(0)
    except PeerGone as e:
        rec["error"] = str(e)
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(rec))
    (Path(out) / "rank-1.json").write_text("{}")
    os._exit(0)  # no group teardown with a dead peer


@pytest.mark.multiproc
def test_a_receiver_fails_when_its_peer_dies(tmp_path):
    r0, _ = _spawn(_peer_dies, tmp_path)
    assert "closed its end" in r0["error"]


def _one_side_finishes(rank: int, port: int, out: str) -> None:
    """Rank 1 sends its last two messages and closes its ends before rank 0 takes them
    (the last stage after its final step); then rank 0 sends to the closed rank 1."""
    _init(rank, port)
    link = connect(1 - rank, SHAPE, torch.float32, torch.device("cpu"), True, 30.0)
    rec = {}
    if rank == 1:
        box = ShmOutbox(link.out)
        for i in range(2):
            box.send(i, torch.full(SHAPE, float(i + 1)))
        link.close()
        dist.barrier()
    else:
        dist.barrier()  # rank 1 has closed both ends by now
        inbox = ShmInbox(link.into, [0, 1])
        rec["got"] = [float(inbox.take(i)[0, 0]) for i in range(2)]
        try:
            ShmOutbox(link.out).send(0, torch.zeros(SHAPE))
        except PeerGone as e:
            rec["error"] = str(e)
        link.close()
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(rec))
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_messages_sent_before_the_sender_closed_are_taken_and_sends_to_a_closed_end_fail(
    tmp_path,
):
    r0, _ = _spawn(_one_side_finishes, tmp_path)
    assert r0["got"] == [1.0, 2.0]  # no broken pipe giving the slots back
    assert "closed its end" in r0["error"]  # PeerGone: the node is dropped, not a bug


def _choose(rank: int, port: int, out: str, same_node: bool, device: str) -> None:
    _init(rank, port)
    link = connect(1 - rank, SHAPE, torch.float32, torch.device(device), same_node, 30.0)
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps({"linked": link is not None}))
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_other_machines_and_gloo_by_request_keep_the_process_group(tmp_path, monkeypatch):
    r = _spawn(_choose, tmp_path, False, "cpu")
    assert [x["linked"] for x in r] == [False, False]
    monkeypatch.setenv("JOBCTL_P2P", "gloo")  # inherited by the spawned ranks
    r = _spawn(_choose, tmp_path, True, "cpu")
    assert [x["linked"] for x in r] == [False, False]
