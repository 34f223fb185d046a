"""A real S3 endpoint for tests and benchmarks: moto's threaded HTTP server on 127.0.0.1."""

from __future__ import annotations

import logging

from moto.server import ThreadedMotoServer

TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""Dummy credentials and region for the local server (moto accepts any)."""


def start_moto_server() -> tuple[ThreadedMotoServer, str]:
    """Start a moto S3 server on a free port of 127.0.0.1; return it and its endpoint URL.

    Call ``server.stop()`` when done. Every server in one process shares moto's
    in-memory state, so give each test its own bucket.
    """
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"
