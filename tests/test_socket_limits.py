"""Nothing the router sends is dropped. ZMQ's ROUTER socket drops, without a word, every message to a peer whose
queue holds its high-water mark (1,000 by default): a client that reads slower than its streams' tokens come, or a
worker inside a long step while the router's messages for it pile up, would lose deltas, results or tasks. The
router's sockets queue without that limit; what they hold is bounded by the requests in flight."""
from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from router.client.socket import dealer
from router.sockets import bind_router_socket, bind_worker_socket
from tests.cluster_harness import free_port

MESSAGES = 20_000  # each 512 bytes: more than the peer's queue, the kernel's buffers and ZMQ's default limit hold
FRAME = 512


async def flood(sock: zmq.asyncio.Socket, peer: zmq.Socket) -> None:
    """The peer says hello (so the router knows its identity), then gets MESSAGES numbered frames."""
    peer.send(b"hello")
    identity, _ = await asyncio.wait_for(sock.recv_multipart(), 5)
    for i in range(MESSAGES):
        await sock.send_multipart([identity, i.to_bytes(4, "big") * (FRAME // 4)])


def received(peer: zmq.Socket) -> list[int]:
    """Everything queued for `peer`, read only after the sender is done (a reader slower than its stream)."""
    got = []
    while peer.poll(1000):
        got.append(int.from_bytes(peer.recv()[:4], "big"))
    return got


def test_a_client_that_reads_late_gets_every_message():
    ctx = zmq.asyncio.Context()
    address = f"tcp://127.0.0.1:{free_port()}"
    sock = bind_router_socket(ctx, address, None)
    client = dealer(zmq.Context.instance(), address, auth_token="")
    try:
        asyncio.run(flood(sock, client))
        assert received(client) == list(range(MESSAGES))
    finally:
        client.close(0)
        sock.close(0)
        ctx.term()


def test_a_worker_that_reads_late_gets_every_message():
    ctx = zmq.asyncio.Context()
    sock, address = bind_worker_socket(ctx, "127.0.0.1", None)
    worker = zmq.Context.instance().socket(zmq.DEALER)
    worker.setsockopt(zmq.IDENTITY, b"w0")
    worker.connect(address)
    try:
        asyncio.run(flood(sock, worker))
        assert received(worker) == list(range(MESSAGES))
    finally:
        worker.close(0)
        sock.close(0)
        ctx.term()
