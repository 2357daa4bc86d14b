"""The client's socket: a DEALER connected to the router, over CURVE when the cluster has a token."""
from __future__ import annotations

import zmq

from common import auth


def dealer(context: zmq.Context, address: str, auth_token: str | None) -> zmq.Socket:
    """A DEALER connected to `address`; with a token (given, or from the environment) over CURVE."""
    token = auth_token if auth_token is not None else auth.load_token()
    keys = auth.keys_from_token(token) if token else None  # a weak token raises AuthError (a ValueError)
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys:
        auth.secure_client(sock, keys)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        sock.close()
        raise ValueError(f"cannot connect to {address!r}: {exc}") from None
    return sock
