"""uvicorn serving the front end's app on the router's running event loop (uvloop under `pdcluster serve`). The
process's signals stay the launcher's: uvicorn is told not to take them."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from common.config import ConfigError

from router.http.app import FrontEnd
from router.router import Router

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # SIGINT / SIGTERM stop the whole cluster, through the launcher's handlers
        yield


class HttpServer:
    def __init__(self, router: Router, host: str, port: int):
        self.frontend = FrontEnd(router)
        config = uvicorn.Config(self.frontend.app, lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=5, loop="none")
        self.server = _Server(config)
        # Bound now, so that a port in use is an error before anything slow starts (and port 0 picks a free one).
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise ConfigError(f"http: cannot listen on {host}:{port}: {e.strerror}") from None
        self.sock.listen(2048)
        self.sock.setblocking(False)
        self.host, self.port = host, self.sock.getsockname()[1]
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises why it could not start
        log.info("HTTP front end on %s", self.url)

    async def stop(self) -> None:
        if self._task is None:
            self.sock.close()
            return
        self.server.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)
        self.sock.close()
