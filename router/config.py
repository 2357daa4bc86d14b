"""The router's configuration: one dataclass, filled from `pdcluster serve`'s flags."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import auth
from common import protocol as P
from router.disagg_policy import POLICIES as DISAGG_POLICIES
from router.placement import POLICIES

MODES = ("disagg", "colocated")


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class RouterConfig:
    model: str = field(metadata={"help": "checkpoint folder; the router uses its tokenizer and chat template"})
    bind: str = _opt(P.DEFAULT_ROUTER_ADDRESS, "client endpoint (ZMQ ROUTER)")
    worker_host: str = _opt("127.0.0.1", "interface the worker endpoint binds")
    mode: str = _opt("disagg", "disagg or colocated")
    kv_transport: str = _opt("auto", "auto, host, cuda_ipc or nccl (gloo on cpu)")
    placement: str = _opt("prefix", "where a prompt is prefilled: prefix (where the fewest of its tokens are "
                                    "not cached, counting the work waiting there) or load (the least loaded)")
    disagg_policy: str = _opt("always", "disagg: where each prompt is prefilled: always on a prefill worker (the KV "
                                        "handed over), never (the decode worker prefills it itself), or auto (per "
                                        "request, whichever is estimated to give the first token sooner, from "
                                        "measured prefill rates, decode steps, chunk costs and handoff times, "
                                        "while the decode worker's running decodes keep their pace)")
    local_prefill_chunk: int = _opt(512, "disagg: most prompt tokens a decode worker prefills per step of the prompts "
                                         "it prefills itself, so its running decodes keep their pace")
    eager_kv_links: int = _opt(256, "disagg: most prefill x decode worker pairs whose KV links the router has opened "
                                    "as the workers meet, ahead of any handoff; in a larger cluster a pair's first "
                                    "handoff opens its link (every pair ahead would be prefill x decode links)")
    max_queued_requests: int = _opt(4096, "requests waiting for a worker before new ones get `overloaded`")
    max_queued_tokens: int = _opt(1 << 20, "prompt tokens waiting for a worker before new requests get `overloaded`")
    max_worker_requests: int = _opt(1024, "requests one worker holds at a time (queued or running); more wait at "
                                          "the router")
    retry_after: float = _opt(1.0, "seconds an `overloaded` or `unavailable` reply asks the client to wait before "
                                   "retrying")
    log_stall_stacks: bool = _opt(False, "log where the router's event loop was during each stall over 50 ms (a "
                                         "thread samples its stack while it is late; for diagnosis)")
    worker_timeout: float = _opt(5.0, "seconds without a heartbeat before a worker counts as dead")
    request_restarts: int = _opt(1, "times a request is started over on other workers when one dies before the "
                                    "client saw a token")
    request_migrations: int = _opt(2, "times a streamed request moves to other workers when its worker dies after "
                                      "the client saw tokens (0: it ends `aborted`)")
    drain_timeout: float = _opt(120.0, "seconds a worker being removed (`pdcluster scale`) gets to finish its "
                                       "requests; those left are then handled as if it died")
    http: str | None = _opt(None, "HOST:PORT of the OpenAI-compatible HTTP front end and /metrics (docs/http.md); off "
                                  "unless given; a non-loopback HOST needs the shared secret, which HTTP clients then "
                                  "send as `Authorization: Bearer ...`")
    served_model_name: str | None = _opt(None, "the model's name in the HTTP API (default: --model as given)")
    auth_token_file: str | None = _opt(None, f"file holding the cluster's shared secret (or set {auth.TOKEN_ENV}); "
                                             "needed to bind a non-loopback address; clients and workers must hold "
                                             "it too")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def http_host_port(self) -> tuple[str, int] | None:
        """(host, port) of `http`, or None when it is off; raises ValueError when it is not HOST:PORT."""
        if self.http is None:
            return None
        host, sep, port = self.http.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"http: must be HOST:PORT, e.g. 127.0.0.1:8000, got {self.http!r}")
        return host, int(port)

    def http_addresses(self) -> list[str]:
        """`http` as an address `common.auth` can judge (empty when it is off)."""
        hp = self.http_host_port()
        return [] if hp is None else [hp[0]]

    def check(self) -> None:
        """Raises ValueError naming the first setting that cannot work."""
        self.http_host_port()
        if self.mode not in MODES:
            raise ValueError(f"mode: must be disagg or colocated, got {self.mode!r}")
        if self.placement not in POLICIES:
            raise ValueError(f"placement: must be prefix or load, got {self.placement!r}")
        if self.disagg_policy not in DISAGG_POLICIES:
            raise ValueError(f"disagg_policy: must be always, never or auto, got {self.disagg_policy!r}")
        if self.eager_kv_links < 0:
            raise ValueError(f"eager_kv_links: must be >= 0, got {self.eager_kv_links}")
        # zero would queue every request forever
        for name in ("max_worker_requests", "worker_timeout", "local_prefill_chunk"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("max_queued_requests", "max_queued_tokens", "retry_after", "request_restarts",
                     "request_migrations"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
