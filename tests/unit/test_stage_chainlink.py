"""The staging chain's links: a connection that does not say the push's token is dropped unheard."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fatpipe.trainer.staging import chainlink


def test_only_the_connection_with_the_token_is_taken(monkeypatch):
    monkeypatch.setenv(chainlink.TOKEN_ENV, "right-token")
    server = chainlink.listen("127.0.0.1:0")
    at = f"127.0.0.1:{server.getsockname()[1]}"
    stray = socket.create_connection(chainlink.address(at))
    stray.sendall(b"wrong-token\n")

    def previous_node():
        conn = chainlink.connect_next(at, time.monotonic() + 30)
        chainlink.send_message(conn, b"HELD", [[True, False]])
        conn.close()

    thread = threading.Thread(target=previous_node)
    thread.start()
    conn = chainlink.accept_previous(server, time.monotonic() + 30)
    assert chainlink.recv_message(conn, b"HELD", 30) == [[True, False]]
    thread.join(timeout=30)
    assert stray.recv(1) == b""  # the stray one was closed
    with pytest.raises(chainlink.ChainBroke):
        chainlink.recv_message(conn, b"REPT", 5)  # the neighbour went away: said, not hung
    for s in (conn, stray, server):
        s.close()
