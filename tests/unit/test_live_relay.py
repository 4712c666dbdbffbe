"""The relay to the run's serving Lighthouse: real sockets on loopback, servers that stop and
come back; the choice rule on its own."""

from __future__ import annotations

import asyncio

import lighthouses
import pytest

from fatpipe.trainer.live import relay
from fatpipe.trainer.live.epochs import serving_lighthouse
from fatpipe.trainer.live.quorum import majority
from fatpipe.trainer.live.relay import Health, Relay, choose


def health(*states: tuple[int, int]) -> list[Health]:
    return [Health(good, failed) for good, failed in states]


def test_the_first_lighthouse_that_takes_connections_serves():
    assert choose(health((0, 1), (1, 0), (1, 0)), None) == 1
    assert choose(health((0, 1), (0, 1)), None) is None


def test_the_serving_lighthouse_keeps_serving_through_one_failed_try():
    assert choose(health((0, 1), (5, 0)), 0) == 0
    assert choose(health((0, relay.DOWN_CHECKS), (5, 0)), 0) == 1


def test_an_earlier_lighthouse_serves_again_only_after_several_good_tries():
    assert choose(health((relay.BACK_CHECKS - 1, 0), (9, 0)), 1) == 1
    assert choose(health((relay.BACK_CHECKS, 0), (9, 0)), 1) == 0


def test_a_quorum_needs_a_majority_from_three_nodes_on():
    assert [majority(n) for n in (1, 2, 3, 4, 5, 8)] == [1, 1, 2, 3, 3, 5]


class Named:
    """A TCP server that answers every connection with its name, and can stop and start."""

    def __init__(self, name: bytes):
        self.name, self.server, self.port = name, None, 0

    async def start(self) -> None:
        async def answer(reader, writer):
            writer.write(self.name)
            await writer.drain()
            await reader.read()  # held open until the other side closes
            writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def _through(port: int) -> tuple[bytes, asyncio.StreamReader]:
    reader, _ = await asyncio.open_connection("127.0.0.1", port)
    return await asyncio.wait_for(reader.read(1), 5), reader


async def _until(what, check, timeout_s: float = 10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)
    return value


@pytest.mark.timeout(60)
def test_the_relay_moves_to_the_next_lighthouse_and_back(monkeypatch):
    monkeypatch.setattr(relay, "CHECK_S", 0.05)
    port = lighthouses.free_port()

    async def scenario():
        first, second = Named(b"0"), Named(b"1")
        await first.start()
        await second.start()
        ready = asyncio.Event()
        the_relay = Relay(("127.0.0.1", port),
                          [("127.0.0.1", first.port), ("127.0.0.1", second.port)])
        serving = asyncio.create_task(the_relay.serve(ready))
        await ready.wait()
        name, held = await _through(port)
        assert name == b"0"
        await first.stop()  # node 0 gone: the held connection is closed, new ones reach node 1
        assert await asyncio.wait_for(held.read(), 10) == b""

        async def reaches(want: bytes):
            try:
                return (await _through(port))[0] == want
            except (OSError, asyncio.TimeoutError):
                return False

        await _until("node 1's server to serve", lambda: reaches(b"1"))
        _, held = await _through(port)
        await first.start()  # node 0 back: everyone moves back to it
        assert await asyncio.wait_for(held.read(), 10) == b""
        await _until("node 0's server to serve again", lambda: reaches(b"0"))
        serving.cancel()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_manager_asks_the_relay_which_lighthouse_it_forwards_to(monkeypatch):
    """The answer names the Lighthouse and counts the relay's moves: a Manager that asks before
    and after its quorum knows which Lighthouse formed it (live.epochs)."""
    monkeypatch.setattr(relay, "CHECK_S", 0.05)
    port = lighthouses.free_port()

    async def scenario():
        first, second = Named(b"0"), Named(b"1")
        await first.start()
        await second.start()
        ready = asyncio.Event()
        the_relay = Relay(("127.0.0.1", port),
                          [("127.0.0.1", first.port), ("127.0.0.1", second.port)])
        serving = asyncio.create_task(the_relay.serve(ready))
        await ready.wait()

        def serves(lighthouse: Named):
            async def check():
                answer = await asyncio.to_thread(serving_lighthouse, f"127.0.0.1:{port}")
                return answer if answer and answer[0] == f"127.0.0.1:{lighthouse.port}" else None
            return check

        assert await _until("node 0's to serve", serves(first)) == (f"127.0.0.1:{first.port}", 1)
        assert (await _through(port))[0] == b"0"  # anything else is forwarded as before
        await first.stop()
        assert await _until("node 1's to serve", serves(second)) == (f"127.0.0.1:{second.port}", 2)
        serving.cancel()

    asyncio.run(scenario())
