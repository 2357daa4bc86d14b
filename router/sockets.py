"""The router's ZMQ sockets: binding one with its limits and security, and the loop that reads one. Every frame
in is one typed record or gets an error back; nothing a peer sends can stop a loop. Nothing sent out is dropped: a
ROUTER socket silently drops each message to a peer whose queue holds its high-water mark, so ours have none (a
client reading slower than its streams, a worker inside a long step); what they queue is bounded by the requests in
flight, and a peer that goes away takes its queue with it."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from common import auth
from common import protocol as P
from common.config import ConfigError

log = logging.getLogger(__name__)

Handle = Callable[[bytes, P.Message], Awaitable[None]]
Refuse = Callable[[bytes, P.Error], Awaitable[None]]


def bind_router_socket(ctx: zmq.asyncio.Context, address: str, keys: auth.CurveKeys | None) -> zmq.asyncio.Socket:
    """A ROUTER socket bound on `address`; a port in use or a host not of this machine is a ConfigError (one line,
    before anything slow starts)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)  # time to deliver the errors sent while shutting down
    sock.setsockopt(zmq.SNDHWM, 0)
    # A hard cap on what a peer can make us buffer; frames under it but over the limit get `too_large`.
    sock.setsockopt(zmq.MAXMSGSIZE, 4 * P.MAX_FRAME_BYTES)
    if keys:
        auth.secure_server(sock, keys)
    try:
        sock.bind(address)
    except zmq.ZMQError as e:
        sock.close()
        raise ConfigError(f"bind: cannot listen on {address}: {e.strerror}") from None
    return sock


def bind_worker_socket(ctx: zmq.asyncio.Context, host: str,
                       keys: auth.CurveKeys | None) -> tuple[zmq.asyncio.Socket, str]:
    """The ROUTER socket workers connect to, on a free port of `host`, and its address."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker reconnects under its old identity
    if keys:
        auth.secure_server(sock, keys)
    try:
        port = sock.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as e:
        sock.close()
        raise ConfigError(f"worker_host: cannot listen on {host}: {e.strerror}") from None
    return sock, f"tcp://{host}:{port}"


async def receive_forever(sock: zmq.asyncio.Socket, expect: tuple[type[P.Message], ...], handle: Handle,
                          refuse: Refuse) -> None:
    """One socket's loop: each message decoded and handled; a bad one refused with an error, never fatal. After each
    message the loop gives the other tasks a turn: pyzmq hands over a message already queued without suspending, so
    under a steady stream (token batches at saturation) this loop would otherwise hold the event loop for as long as
    messages keep coming, and the other socket's loop, the timers and the HTTP front end would wait."""
    while True:
        identity, *frames = await sock.recv_multipart()
        try:
            await handle(identity, one_record(frames, expect))
        except P.ProtocolError as e:
            await refuse(identity, P.error_reply(e))
        except Exception:
            log.exception("router failed on a message from %r", identity)
            await refuse(identity, P.Error(request_id="", code=P.INTERNAL, message="router error"))
        await asyncio.sleep(0)


def one_record(frames: list[bytes], expect: tuple[type[P.Message], ...]) -> P.Message:
    if len(frames) == 1:
        return P.decode(frames[0], expect=expect)
    raise P.ProtocolError(P.BAD_REQUEST, f"a message must be one frame, got {len(frames)}")
