"""What a worker is told by the launcher, and the fingerprint that decides which workers may exchange KV."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config import EngineConfig


@dataclass
class WorkerConfig:
    worker_id: str
    router_address: str  # the router's worker endpoint
    host: str = "127.0.0.1"  # where this worker's data channel listens
    node_id: str = ""
    device_index: int = 0
    kv_transports: list[str] = field(default_factory=list)  # empty: every transport this device has
    heartbeat_interval: float = 0.5
    handoff_timeout: float = 60.0  # how long blocks wait for the other side of a KV handoff
    local_prefill_chunk: int = 512  # decode worker: most prompt tokens a step prefills (prompts it prefills itself)
    auth_token: str | None = None  # the cluster's shared secret: CURVE on every socket (common/auth.py)
    fault_dir: str | None = None  # test-only fault injection (common/faults.py)
    timeline_dir: str | None = None  # per-request events, for finding where time goes (common/worker/timeline.py)


def model_fingerprint(config: EngineConfig) -> str:
    """Workers may exchange KV only when this matches: same architecture, shapes and KV dtype."""
    mc = config.model_config
    return (f"{mc.architecture}:L{mc.num_layers}:H{mc.hidden_size}:kv{mc.num_kv_heads}x{mc.head_dim}"
            f":V{mc.vocab_size}:{config.dtype_name}")
