"""What a simulation runs: a cluster's layout, as `pdcluster serve` would start it (its workers by role, how many
GPUs each, the router's policies and the KV transport)."""
from __future__ import annotations

from dataclasses import dataclass

from scripts.planner.gpu import pack


@dataclass(frozen=True)
class Layout:
    """A cluster to simulate: `prefill` + `decode` workers (disaggregated) or `colocated` replicas."""

    prefill: int = 0
    decode: int = 0
    colocated: int = 0
    policy: str = "always"  # disaggregated: --disagg-policy
    placement: str = "prefix"  # --placement
    local_prefill_chunk: int = 512
    tp: int = 1  # GPUs per engine (the profile's: only the label shows it)
    # Below 1, engines share GPUs (0.5: two on one, --gpus-per-worker), each with that share of its KV blocks
    gpus_per_engine: float = 1.0
    mps: bool = False  # engines that share a GPU run side by side under MPS (serve --mps), not in turns
    transport: str | None = None  # the handoffs' KV transport (None: the profile's fastest); Profile.cost_transport

    @property
    def mode(self) -> str:
        return "colocated" if self.colocated else "disagg"

    @property
    def engines(self) -> int:
        return self.prefill + self.decode + self.colocated

    def gpus(self) -> list[int]:
        """Each engine's GPU, engines in launch order (prefill, decode, colocated), as `serve` places them."""
        return pack([self.gpus_per_engine] * self.engines)

    @property
    def num_gpus(self) -> int:
        """The GPUs its engines take (engines of the profile's TP size: one each unless they share)."""
        return len(set(self.gpus()))

    def __str__(self) -> str:
        tp = f"tp{self.tp} " if self.tp > 1 else ""
        shared = "" if self.gpus_per_engine >= 1 else f", {self.gpus_per_engine:g} GPU each" + (
            " under MPS" if self.mps else "")
        if self.colocated:
            return f"{tp}colocated x{self.colocated}" + (f" ({shared[2:]})" if shared else "")
        policy = "" if self.policy == "always" else self.policy
        notes = ", ".join(filter(None, [policy, shared[2:]]))
        return f"{tp}{self.prefill}P:{self.decode}D" + (f" ({notes})" if notes else "")
