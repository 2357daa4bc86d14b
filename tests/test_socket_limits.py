"""Nothing the router sends is dropped. ZMQ's ROUTER socket drops, without a word, every message to a peer whose
queue holds its high-water mark (1,000 by default): a client that reads slower than its streams' tokens come, or a
worker inside a long step while the router's messages for it pile up, would lose deltas, results or tasks. The
router's sockets queue without that limit; what they hold is bounded by the requests in flight."""
from __future__ import annotations

import asyncio

import pytest
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


def client_pair(ctx: zmq.asyncio.Context) -> tuple[zmq.asyncio.Socket, zmq.Socket]:
    address = f"tcp://127.0.0.1:{free_port()}"
    return bind_router_socket(ctx, address, None), dealer(zmq.Context.instance(), address, auth_token="")


def worker_pair(ctx: zmq.asyncio.Context) -> tuple[zmq.asyncio.Socket, zmq.Socket]:
    sock, address = bind_worker_socket(ctx, "127.0.0.1", None)
    worker = zmq.Context.instance().socket(zmq.DEALER)
    worker.setsockopt(zmq.IDENTITY, b"w0")
    worker.connect(address)
    return sock, worker


@pytest.mark.parametrize("pair", [client_pair, worker_pair], ids=["client", "worker"])
def test_a_peer_that_reads_late_gets_every_message(pair):
    ctx = zmq.asyncio.Context()
    sock, peer = pair(ctx)
    try:
        asyncio.run(flood(sock, peer))
        assert received(peer) == list(range(MESSAGES))
    finally:
        peer.close(0)
        sock.close(0)
        ctx.term()
