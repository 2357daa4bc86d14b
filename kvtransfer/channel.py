from __future__ import annotations

from collections.abc import Callable

import zmq

from common import protocol as P


class DataChannel:
    """The KV data plane of one worker: a PULL socket others push handoffs and acks to, and PUSH
    sockets to peers, opened on first use or ahead of it (`connect`). Records travel as the first
    frame of a multipart message; KV payload frames, if any, follow. `secure(sock, server)`, if
    given, configures each socket before it binds (server) or connects (e.g. CURVE, see
    common/auth.py)."""

    def __init__(self, ctx: zmq.Context, host: str = "127.0.0.1",
                 secure: Callable[[zmq.Socket, bool], None] | None = None):
        self.ctx = ctx
        self.secure = secure
        self.inbox = ctx.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        if secure is not None:
            secure(self.inbox, True)
        port = self.inbox.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.peers: dict[str, zmq.Socket] = {}

    def connect(self, address: str) -> zmq.Socket:
        """The PUSH socket to a peer's inbox, connected now if it is not yet (ZMQ connects in the background: a
        first record sent on a fresh socket waits for the TCP and ZMTP handshakes)."""
        sock = self.peers.get(address)
        if sock is None:
            sock = self.peers[address] = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            if self.secure is not None:
                self.secure(sock, False)
            sock.connect(address)
        return sock

    def send(self, address: str, msg: P.Message, payload: list | None = None) -> None:
        self.connect(address).send_multipart([P.encode(msg), *(payload or [])], copy=False)

    def recv(self) -> tuple[P.Message, list[memoryview]]:
        """One pending message (call when the inbox is readable); raises ProtocolError for a bad record."""
        frames = self.inbox.recv_multipart(copy=False)
        msg = P.decode(frames[0].buffer, expect=P.DATA_PLANE)
        return msg, [f.buffer for f in frames[1:]]

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close()
        self.inbox.close()
