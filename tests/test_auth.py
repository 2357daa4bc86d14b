"""Security without a cluster: the shared secret, the CURVE handshake, loopback by default, no pickle."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import zmq

from common import auth
from scripts.cli import main as cli_main
from tests.cluster_harness import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "correct horse battery staple"


def test_keys_are_derived_from_the_token_alone():
    keys = auth.keys_from_token(TOKEN)
    assert keys == auth.keys_from_token(TOKEN)
    assert keys != auth.keys_from_token(TOKEN + "!")
    assert len({keys.server_public, keys.server_secret, keys.client_public, keys.client_secret}) == 4
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public


def test_the_documented_derivation_matches():
    """docs/protocol.md gives a test vector so that a client can be written from scratch."""
    doc = (ROOT / "docs" / "protocol.md").read_text()
    token = re.search(r"token `([^`]+)` gives", doc).group(1)
    keys = auth.keys_from_token(token)
    for name in ("server_public", "client_public", "client_secret"):
        documented = re.search(rf"{name}: `([^`]+)`", doc).group(1)
        assert documented.encode() == getattr(keys, name), name


def test_weak_or_missing_tokens_are_refused(tmp_path, monkeypatch):
    with pytest.raises(auth.AuthError, match="at least 16"):
        auth.keys_from_token("short")
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    monkeypatch.delenv(auth.TOKEN_FILE_ENV, raising=False)
    assert auth.load_token() is None
    monkeypatch.setenv(auth.TOKEN_ENV, f"  {TOKEN}\n")
    assert auth.load_token() == TOKEN
    path = tmp_path / "token"
    path.write_text("from the file, with a newline\n")
    assert auth.load_token(path) == "from the file, with a newline"
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, str(path))
    assert auth.load_token() == "from the file, with a newline"  # the file wins over the variable
    path.write_text("\n")
    with pytest.raises(auth.AuthError, match="empty"):
        auth.load_token(path)
    with pytest.raises(auth.AuthError, match="No such file"):
        auth.load_token(tmp_path / "missing")


@pytest.mark.parametrize("address, local", [
    ("tcp://127.0.0.1:5555", True), ("tcp://127.0.0.2:1", True), ("tcp://localhost:5555", True),
    ("tcp://[::1]:5555", True), ("ipc:///tmp/pdcluster.sock", True), ("inproc://x", True), ("127.0.0.1", True),
    ("tcp://*:5555", False), ("tcp://0.0.0.0:5555", False), ("tcp://10.0.0.2:5555", False),
    ("tcp://eth0:5555", False), ("tcp://example.com:5555", False), ("0.0.0.0", False), ("[::]", False),
])
def test_what_counts_as_loopback(address, local):
    assert auth.is_local(address) is local


def test_binding_beyond_loopback_needs_a_token():
    auth.require_token_for(["tcp://127.0.0.1:1", "127.0.0.1"], None)
    auth.require_token_for(["tcp://0.0.0.0:1"], TOKEN)
    with pytest.raises(auth.AuthError, match="tcp://0.0.0.0:1 needs a shared secret"):
        auth.require_token_for(["tcp://0.0.0.0:1", "127.0.0.1"], None)


@pytest.mark.parametrize("flags", [["--bind", "tcp://0.0.0.0:5555"], ["--worker-host", "0.0.0.0"]])
def test_serve_refuses_to_expose_itself_without_a_token(tiny_qwen3_dir, flags, capsys, monkeypatch):
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    monkeypatch.delenv(auth.TOKEN_FILE_ENV, raising=False)
    assert cli_main(["serve", "--model", str(tiny_qwen3_dir), "--device", "cpu", *flags]) == 2
    assert "needs a shared secret" in capsys.readouterr().err


def test_only_token_holders_complete_the_handshake():
    keys = auth.keys_from_token(TOKEN)
    ctx = zmq.Context()
    authenticator = auth.start_authenticator(ctx, keys)
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    auth.secure_server(server, keys)
    address = f"tcp://127.0.0.1:{free_port()}"
    server.bind(address)
    clients = {}
    try:
        for name, token in [("holder", TOKEN), ("stranger", "some other secret entirely"), ("plain", None)]:
            sock = clients[name] = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if token:
                auth.secure_client(sock, auth.keys_from_token(token))
            sock.connect(address)
            sock.send(name.encode())
        got = []
        while server.poll(1500):
            got.append(server.recv_multipart()[-1])
        assert got == [b"holder"]
    finally:
        for sock in clients.values():
            sock.close()
        server.close()
        authenticator.stop()
        ctx.term()


def test_no_pickle_on_any_socket():
    """Everything that crosses a socket is msgpack (common/protocol/); pickle would run a peer's code.
    Checks the code itself (imports, calls, keywords), not the docs that say so."""
    modules = {"pickle", "cloudpickle", "dill", "marshal", "shelve"}
    calls = {"send_pyobj", "recv_pyobj", "send_serialized", "recv_serialized", "loads", "load"}
    offenders = []
    for package in ("common", "router", "prefill_worker", "decode_worker", "kvtransfer"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Import) and any(a.name.split(".")[0] in modules for a in node.names):
                    offenders.append(f"{where}: import {', '.join(a.name for a in node.names)}")
                elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in modules:
                    offenders.append(f"{where}: from {node.module} import ...")
                elif isinstance(node, ast.Attribute) and node.attr in calls and isinstance(node.value, ast.Name) \
                        and node.value.id in modules | {"torch", "socket", "sock"}:
                    offenders.append(f"{where}: {node.value.id}.{node.attr}")
                elif isinstance(node, ast.Attribute) and node.attr in {"send_pyobj", "recv_pyobj"}:
                    offenders.append(f"{where}: .{node.attr}")
                elif isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                    offenders.append(f"{where}: allow_pickle=")
    assert not offenders, "\n".join(offenders)
