"""What hardware each benchmarked mode got: the machine (GPUs found by nvidia-smi, or CPU cores), then per mode its
workers, worker processes and GPUs or CPU threads, and one sentence on whether the modes are compared at equal
hardware. No torch: GPUs are found the way a user would look (`nvidia-smi`)."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from scripts.bench_config import BenchConfig, mode_variants

NVIDIA_SMI_TIMEOUT_S = 10.0


def detect_gpus() -> list[str]:
    """The names of this machine's NVIDIA GPUs, [] where there are none (or no nvidia-smi to ask)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip() or None
    except OSError:
        pass
    return None


def machine(cfg: BenchConfig, gpus: list[str] | None = None) -> dict:
    """The hardware the benchmark's clusters run on: `device` cpu or cuda (None: a running cluster whose device
    --device does not say), the GPUs' names, the CPU's cores (what `pdcluster serve` splits among CPU workers)."""
    cores = os.cpu_count() or 1
    if cfg.address:  # the cluster may be on other machines: only what the user said about it
        device = cfg.device if cfg.device in ("cpu", "cuda") else None
        return {"device": device, "gpus": [], "cpu_cores": None, "cpu_model": None, "local": False}
    gpus = detect_gpus() if gpus is None else gpus
    device = cfg.device if cfg.device != "auto" else ("cuda" if gpus else "cpu")
    return {"device": device, "gpus": gpus if device == "cuda" else [], "cpu_cores": cores, "cpu_model": cpu_model(),
            "local": True}


def label(m: dict | None) -> str:
    """The hardware in a few words, for titles: "2x NVIDIA H200", "CPU, 8 cores"."""
    if not m or not m.get("local"):
        return {"cpu": "CPU", "cuda": "GPU"}.get((m or {}).get("device"), "unknown hardware")
    if m["device"] == "cuda":
        names = m["gpus"]
        if not names:
            return "GPU"
        return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"
    return f"CPU, {m['cpu_cores']} cores"


def tensor_parallel_size(serve_args: str) -> int:
    """--tensor-parallel-size among --serve-args (1 when not there)."""
    args = shlex.split(serve_args)
    for i, arg in enumerate(args):
        value = arg.partition("=")[2] if arg.startswith("--tensor-parallel-size=") else (
            args[i + 1] if arg == "--tensor-parallel-size" and i + 1 < len(args) else None)
        if value is not None:
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1


def uses_mps(serve_args: str) -> bool:
    """Whether --serve-args ask for `--mps` (the last of --mps / --no-mps wins, as argparse reads them)."""
    flags = [a for a in shlex.split(serve_args) if a in ("--mps", "--no-mps")]
    return bool(flags) and flags[-1] == "--mps"


def mode_hardware(cfg: BenchConfig, mode: str, m: dict) -> dict | None:
    """What `pdcluster serve` gives one mode on machine `m`: its workers by role, worker processes (one a worker and
    tensor-parallel rank), and GPUs (per worker, in all) or CPU threads (per worker, of how many cores). None for
    a running cluster: the benchmark did not place it."""
    if not m.get("local"):
        return None
    disagg = mode_variants(mode)[0] == "disagg"  # `disagg:auto` is disaggregated too
    workers = ({"prefill": cfg.prefill_workers, "decode": cfg.decode_workers} if disagg
               else {"colocated": cfg.workers})
    n = sum(workers.values())
    if m["device"] == "cpu":
        # as router/launcher.py's Cluster.worker_env: the cores split evenly among the workers (OMP_NUM_THREADS)
        return {"workers": workers, "processes": n, "device": "cpu", "threads_per_worker": max(1, m["cpu_cores"] // n),
                "cpu_cores": m["cpu_cores"]}
    tp = tensor_parallel_size(cfg.serve_args)
    per = cfg.gpus_per_worker if disagg else (cfg.colocated_gpus_per_worker or cfg.gpus_per_worker)
    return {"workers": workers, "processes": n * tp, "device": "cuda", "gpus_per_worker": per * tp,
            "gpus": n * per * tp}


def describe(hw: dict | None) -> str:
    """One mode's hardware in a line: "1 prefill + 1 decode worker (2 processes), 4 threads each on 8 shared CPU
    cores"."""
    if hw is None:
        return "a running cluster: the benchmark did not place it, so its hardware is not known here"
    n = sum(hw["workers"].values())
    workers = " + ".join(f"{k} {role}" for role, k in hw["workers"].items()) + f" worker{'s' if n > 1 else ''}"
    procs = f"{hw['processes']} process{'es' if hw['processes'] > 1 else ''}"
    each = " each" if n > 1 else ""
    if hw["device"] == "cpu":
        return f"{workers} ({procs}), {threads(hw['threads_per_worker'])}{each} on {hw['cpu_cores']} CPU cores"
    return f"{workers} ({procs}), {gpus(hw['gpus_per_worker'])}{each}, {gpus(hw['gpus'])} in all"


def threads(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def gpus(n: float) -> str:
    return f"{n:g} GPU{'' if n <= 1 else 's'}"


def comparison_note(hardware: dict[str, dict | None]) -> str | None:
    """One plain sentence on whether disagg and colocated were compared at equal hardware (None: nothing to say)."""
    d, c = hardware.get("disagg"), hardware.get("colocated")
    if d is None or c is None:
        return None
    if d["device"] == "cpu":
        if d["processes"] == c["processes"]:
            return (f"Equal hardware: both modes run {d['processes']} worker processes on the same "
                    f"{d['cpu_cores']} CPU cores, {threads(d['threads_per_worker'])} each.")
        return (f"Not the same number of engines: on the same {d['cpu_cores']} CPU cores, disagg runs "
                f"{d['processes']} worker processes ({threads(d['threads_per_worker'])} each) and colocated "
                f"{c['processes']} ({threads(c['threads_per_worker'])} each), so the comparison is also one of "
                f"{d['processes']} engines against {c['processes']}; for as many colocated workers as disagg has, "
                f"add --workers {sum(d['workers'].values())}.")
    if d["gpus"] == c["gpus"]:
        split = "" if d["processes"] == c["processes"] else (
            f", disagg's split over {d['processes']} worker processes and colocated's over {c['processes']}")
        return f"Equal hardware: both modes have {gpus(d['gpus'])} in all{split}."
    return (f"Not equal hardware: disagg has {gpus(d['gpus'])} and colocated {gpus(c['gpus'])}, so the comparison "
            f"is also one of {gpus(d['gpus'])} against {gpus(c['gpus'])}; for equal hardware give colocated "
            f"{gpus(d['gpus'])} in all (--workers and --colocated-gpus-per-worker).")
