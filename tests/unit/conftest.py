"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from jobctl.engine.channel.server import ChannelServer, new_secret


@pytest.fixture
def server(tmp_path):
    """A live event channel on 127.0.0.1 writing ``tmp_path/metrics.jsonl``, its secret
    on ``server.secret``."""
    secret = new_secret()
    with ChannelServer("127.0.0.1", 0, secret, tmp_path / "metrics.jsonl") as srv:
        srv.secret = secret
        yield srv
