"""Starts `pdcluster serve` as a real subprocess (own process group) and stops it like a user would."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from router.client import Client

ROOT = Path(__file__).resolve().parent.parent


def offline_token_ids(model_dir: Path, prompts: list, kinds: dict[str, dict]) -> dict[str, list[list[int]]]:
    """What offline generation gives for `prompts` under each kind of sampling: what a cluster must serve."""
    from common.engine.llm import LLM
    from common.sampling_params import SamplingParams

    llm = LLM(str(model_dir), device="cpu", kv_cache_memory=64 << 20)
    try:
        return {kind: [o.token_ids for o in llm.generate(prompts, SamplingParams(**params), use_tqdm=False)]
                for kind, params in kinds.items()}
    finally:
        llm.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningCluster:
    def __init__(self, model: Path, mode: str, log_path: Path, *extra: str, env: dict[str, str] | None = None,
                 auth_token: str | None = None):
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.auth_token = auth_token  # what clients present; the serve side gets its secret from `env` or `extra`
        # PDCLUSTER_TEST_DEVICE=cuda runs the same tests on a GPU host (e.g. the migration test, issue 19), with
        # PDCLUSTER_TEST_SERVE_ARGS for what a GPU needs (e.g. "--gpus-per-worker 0.5": 4 workers on 2 GPUs).
        device = os.environ.get("PDCLUSTER_TEST_DEVICE", "cpu")
        extra = (*extra, *shlex.split(os.environ.get("PDCLUSTER_TEST_SERVE_ARGS", "")))
        args = [sys.executable, "-m", "scripts.cli", "serve", "--model", str(model), "--mode", mode, "--device", device,
                "--bind", self.address, "--kv-cache-memory", "64MiB", "--max-num-seqs", "64",
                "--max-num-batched-tokens", "1024", *extra]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log_path = log_path
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(log_path, "wb"), start_new_session=True)
        try:
            with self.client() as client:
                client.wait_ready(timeout=300)
        except BaseException:
            self.stop()
            raise RuntimeError(f"cluster did not start; log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def client(self, **kw) -> Client:
        kw.setdefault("auth_token", self.auth_token)
        return Client(self.address, **kw)

    def wait_clean(self, timeout: float = 60.0):
        """Polls stats until nothing is left behind: every worker alive with all its KV blocks free, and no
        request in flight or queued at the router. Returns the last stats (the caller asserts on them)."""
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while True:
                stats = c.stats(timeout=10)
                clean = (stats.requests_in_flight == 0 and stats.queued_requests == 0 and stats.workers
                         and all(w.alive and w.kv_blocks_free == w.kv_blocks_total for w in stats.workers))
                if clean or time.monotonic() > deadline:
                    return stats
                time.sleep(0.2)

    def wait_all_blocks_free(self, timeout: float = 10.0) -> list:
        """Polls stats until every worker reports all KV blocks free; returns the last worker stats."""
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while True:
                workers = c.stats().workers
                if all(w.kv_blocks_free == w.kv_blocks_total for w in workers) or time.monotonic() > deadline:
                    return workers
                time.sleep(0.2)

    def stop(self) -> int:
        """SIGTERM, as a service manager would; returns the exit status. Anything left in the process
        group afterwards (a Ray worker, an actor) is an orphan: kill it and fail loudly."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stop_cleanly(self) -> None:
        """Stop; assert a clean exit and that nothing was left behind (orphans are killed first)."""
        status = self.stop()
        orphans = self.orphans()
        for pid in orphans:
            os.kill(pid, signal.SIGKILL)
        assert status == 0, self.log()
        assert not orphans, f"processes left behind: {orphans}"

    def orphans(self) -> list[int]:
        out = subprocess.run(["pgrep", "-g", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
