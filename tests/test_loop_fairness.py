"""A socket's reading loop shares its event loop: under a steady stream of messages (token batches at saturation,
deltas at the bench's client) the other tasks on the loop still get their turns. pyzmq hands over a message already
queued without suspending, so a loop that only awaits the next message holds the event loop for as long as messages
keep coming: the router then reads no submit, and its stall counter sees a stall, until the stream pauses."""
from __future__ import annotations

import asyncio
import time

import zmq
import zmq.asyncio

from common import protocol as P
from router.client import AsyncClient
from router.client.aio import READ_BATCH
from router.sockets import bind_worker_socket, receive_forever

FLOOD = 300


class Turns:
    """Counts the turns another task gets on the loop; `at` records the count at each message handled."""

    def __init__(self) -> None:
        self.count = 0
        self.at: list[int] = []

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1

    def handled(self) -> None:
        self.at.append(self.count)

    def interleaved(self) -> int:
        """How many messages came after another task had a turn since the one before."""
        return sum(b > a for a, b in zip(self.at, self.at[1:]))

    def longest_run(self) -> int:
        """The most messages handled in a row with no turn of another task between them."""
        longest = run = 1
        for a, b in zip(self.at, self.at[1:]):
            run = 1 if b > a else run + 1
            longest = max(longest, run)
        return longest


async def queued(sock: zmq.asyncio.Socket, timeout: float = 5.0) -> None:
    """Until `sock` has a message to read (then the rest of a burst sent at once is there too, a moment later)."""
    await asyncio.wait_for(sock.poll(), timeout)
    await asyncio.sleep(0.2)


def test_the_routers_socket_loop_leaves_the_event_loop_to_other_tasks_under_a_flood():
    async def main() -> Turns:
        ctx = zmq.asyncio.Context()
        sock, address = bind_worker_socket(ctx, "127.0.0.1", None)
        peer = ctx.socket(zmq.DEALER)
        peer.connect(address)
        for i in range(FLOOD):
            await peer.send(P.encode(P.Ping(nonce=i)))
        await queued(sock)
        turns, done = Turns(), asyncio.Event()

        async def handle(identity: bytes, msg: P.Message) -> None:
            turns.handled()
            if len(turns.at) == FLOOD:
                done.set()

        async def refuse(identity: bytes, error: P.Error) -> None:
            raise AssertionError(error.message)

        other = asyncio.create_task(turns.run())
        reader = asyncio.create_task(receive_forever(sock, (P.Ping,), handle, refuse))
        await asyncio.wait_for(done.wait(), 10)
        for task in (other, reader):
            task.cancel()
        peer.close(0)
        sock.close(0)
        ctx.term()
        return turns

    turns = asyncio.run(main())
    assert len(turns.at) == FLOOD
    assert turns.interleaved() >= FLOOD - 2


def test_the_async_clients_reader_leaves_the_event_loop_to_its_callers_under_a_flood():
    """It routes what is queued in batches of at most READ_BATCH frames (a turn of the loop per frame cost more
    than routing it), and gives the loop a turn after each batch."""
    async def main() -> Turns:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        address = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
        turns = Turns()
        async with AsyncClient(address, timeout=5) as client:
            receive = client._core.receive

            def counted(frame: bytes) -> None:
                turns.handled()
                receive(frame)
            client._core.receive = counted
            ping = asyncio.create_task(client.ping())  # the client's first frames start its reader
            pings = [await router.recv_multipart()]
            await asyncio.sleep(0.2)
            while await router.poll(0):  # a ping that reaches the router comes first, then the one timed
                pings.append(await router.recv_multipart())
            nonces = [P.decode(frame, expect=(P.Ping,)).nonce for _, frame in pings]
            identity = pings[0][0]
            for i in range(FLOOD):  # replies nobody waits for (dropped), then the ones the pings wait for
                await router.send_multipart([identity, P.encode(P.Pong(nonce=max(nonces) + 1 + i))])
            for nonce in nonces:
                await router.send_multipart([identity, P.encode(P.Pong(nonce=nonce))])
            time.sleep(0.2)  # holds the loop while the frames reach the client's socket: all are queued there
            other = asyncio.create_task(turns.run())
            await asyncio.wait_for(ping, 10)
            other.cancel()
        router.close(0)
        ctx.term()
        return turns

    turns = asyncio.run(main())
    assert len(turns.at) >= FLOOD + 1
    assert 1 < turns.longest_run() <= READ_BATCH
    assert turns.interleaved() >= FLOOD // READ_BATCH
