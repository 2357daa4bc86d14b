"""Workers that share a GPU as clients of one CUDA MPS server (`serve --mps`).

Two processes on one GPU without MPS take it in turns of a couple of milliseconds, so a decode step beside a long
prompt waits out the prompt's turn. Under MPS their kernels run side by side, and a cap on the share of the SMs a
client may use (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) keeps a prompt's large kernels from holding every SM while
decode steps wait. Served, the first tokens come sooner than in turns (docs/benchmarks.md, "Stop 49").

The server is this run's own: started in a private folder (its pipe and log) before the workers, quit after them.
Only workers given that folder connect to it; every other CUDA process on the node runs as before. It serves the
node `serve` runs on.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from common.config import ConfigError
from router.serve_config import ROLES

CONTROL = "nvidia-cuda-mps-control"


def parse_shares(spec: str) -> dict[str, int]:
    """`decode=70,prefill=100` -> each role's share of the SMs in percent (100 where not given)."""
    shares = dict.fromkeys(ROLES, 100)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        role, _, value = part.partition("=")
        if role not in ROLES:
            raise ConfigError(f"mps_shares: {role!r} is not one of {', '.join(ROLES)} (in {spec!r})")
        try:
            share = int(value)
        except ValueError:
            raise ConfigError(f"mps_shares: {part!r} is not ROLE=PERCENT") from None
        if not 1 <= share <= 100:
            raise ConfigError(f"mps_shares: {role}'s share must be 1-100 (percent of the SMs), got {share}")
        shares[role] = share
    return shares


@dataclass
class MpsServer:
    """One MPS control daemon in its own folder; `env(role)` is what a worker of `role` needs to use it."""

    shares: dict[str, int]
    folder: str | None = None

    def start(self) -> None:
        control = shutil.which(CONTROL)
        if control is None:
            raise ConfigError(f"mps: {CONTROL} is not on PATH (it comes with the NVIDIA driver)")
        self.folder = tempfile.mkdtemp(prefix="pdcluster-mps-")
        os.makedirs(self._pipe)
        os.makedirs(self._log)
        done = subprocess.run([control, "-d"], env=self._daemon_env(), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            self._remove()
            raise RuntimeError(f"mps: {CONTROL} -d failed ({done.returncode}): {done.stderr.strip()}")

    def env(self, role: str) -> dict[str, str]:
        if self.folder is None:
            return {}
        return {"CUDA_MPS_PIPE_DIRECTORY": self._pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.shares[role])}

    def stop(self) -> None:
        """Quits the daemon (after its clients, the workers, have gone) and removes its folder."""
        if self.folder is None:
            return
        control = shutil.which(CONTROL)
        if control is not None:
            subprocess.run([control], input="quit\n", env=self._daemon_env(), capture_output=True, text=True,
                           timeout=30)
        self._remove()

    @property
    def _pipe(self) -> str:
        return os.path.join(self.folder, "pipe")

    @property
    def _log(self) -> str:
        return os.path.join(self.folder, "log")

    def _daemon_env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": self._pipe, "CUDA_MPS_LOG_DIRECTORY": self._log}

    def _remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None
