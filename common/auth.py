"""Who may talk to the cluster: loopback by default, a shared secret for anything else.

One token (a shared secret of at least 16 characters) gives every component two CURVE key pairs,
derived the same way everywhere (docs/protocol.md, "Authentication"): a *server* pair for every
socket that binds (the router's client and worker endpoints, the workers' KV data channels) and a
*client* pair for every socket that connects. A server accepts only the client public key derived
from the token, so a peer without the token cannot finish the handshake and gets nothing; CURVE
also encrypts the traffic. Without a token the sockets are plain, and only loopback (or ipc://)
addresses are allowed.
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

TOKEN_ENV = "PDCLUSTER_AUTH_TOKEN"
TOKEN_FILE_ENV = "PDCLUSTER_AUTH_TOKEN_FILE"
MIN_TOKEN_LEN = 16
_LABEL = b"pdcluster/v1/curve/"
ZAP_DOMAIN = "pdcluster"


class AuthError(ValueError):
    """A missing, weak or unreadable shared secret, or an address that needs one."""


@dataclass(frozen=True)
class CurveKeys:
    """Z85-encoded CURVE keys derived from the shared token."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def _secret(role: bytes, token: str) -> bytes:
    return z85.encode(hashlib.sha256(_LABEL + role + b"\0" + token.encode()).digest())


def keys_from_token(token: str) -> CurveKeys:
    if len(token) < MIN_TOKEN_LEN:
        raise AuthError(f"auth token: must have at least {MIN_TOKEN_LEN} characters, got {len(token)}")
    server, client = _secret(b"server", token), _secret(b"client", token)
    return CurveKeys(zmq.curve_public(server), server, zmq.curve_public(client), client)


def load_token(path: str | os.PathLike | None = None) -> str | None:
    """The token from `path`, else $PDCLUSTER_AUTH_TOKEN_FILE, else $PDCLUSTER_AUTH_TOKEN; None if none is set.

    Surrounding whitespace (a trailing newline) is not part of the token.
    """
    path = path or os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise AuthError(f"auth token file {str(path)!r}: {e.strerror}") from None
        if not token:
            raise AuthError(f"auth token file {str(path)!r} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def is_local(address: str) -> bool:
    """Whether a ZMQ endpoint (or a bare host) is reachable only from this machine."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rsplit(":", 1)[0] if sep else rest
    host = host.strip("[]")
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", 0.0.0.0, an interface name or a host name: other machines may reach it


def require_token_for(addresses: list[str], token: str | None) -> None:
    """Raises AuthError when an address other machines can reach would be served without a token."""
    exposed = [a for a in addresses if not is_local(a)]
    if exposed and token is None:
        raise AuthError(f"binding {', '.join(exposed)} needs a shared secret: pass --auth-token-file "
                        f"or set {TOKEN_ENV} (or bind a loopback address)")


def secure_server(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Before bind: encrypt, and accept only peers holding the token (checked by the context's Authenticator)."""
    sock.curve_server = True
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.zap_domain = ZAP_DOMAIN.encode()


def secure_client(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Before connect: prove we hold the token, and talk only to a server that holds it too."""
    sock.curve_serverkey = keys.server_public
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public


def socket_security(keys: CurveKeys | None) -> Callable[[zmq.Socket, bool], None] | None:
    """`secure(sock, server)` for sockets made later (a worker's data channel), or None without a token."""
    if keys is None:
        return None

    def secure(sock: zmq.Socket, server: bool) -> None:
        (secure_server if server else secure_client)(sock, keys)
    return secure


class _OnlyTokenHolders:
    def __init__(self, keys: CurveKeys):
        self.allowed = keys.client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.allowed


def start_authenticator(ctx: zmq.Context, keys: CurveKeys) -> ThreadAuthenticator:
    """The ZAP handler of `ctx` (a thread; also for a zmq.asyncio context). Call before any server binds."""
    sync_ctx = zmq.Context.shadow(ctx.underlying)
    auth = ThreadAuthenticator(sync_ctx)
    auth.start()
    auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_OnlyTokenHolders(keys))
    return auth
