"""One profiling run: build the engine as `serve` does, time its steps warm, close it, time the KV handoffs, fit
the cost models (scripts/planner/fit.py) and return the profile with the machine, model and engine settings named.

What the simulator charges (docs/planner.md) and what is measured for it:
- every step: `host_launch_s`, the host's scheduling and input packing in a decode step of the smallest batch;
- a prefill-only step: host_launch_s + prefill cost, fitted to single prompts' steps with and without a cached
  prefix;
- a decode-only step: host_launch_s + decode cost, fitted to steady decode steps over a grid of batch and context;
- a step mixing a prompt with decodes: both parts, plus `mixed_step_s`, what such steps (a prompt beside a few
  decode batch sizes) took beyond their parts apart: their decodes run eagerly, not as a CUDA graph;
- a handoff: base + bytes / rate per transport, fitted to handoffs of a few prompt sizes.
"""
from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.config import ConfigError, EngineConfig
from common.engine.device import mps_share
from common.engine.llm import LLM
from common.protocol.kv import DTYPE_BYTES
from scripts.planner.fit import Fit, fit_costs
from scripts.planner.measure.handoff import handoff_sizes, measure_handoffs
from scripts.planner.measure.steps import (Grid, Prompts, host_launch_seconds, launch_prep_seconds, measure_decode,
                                           measure_mixed, measure_prefill, measure_sustained)
from scripts.planner.points import MeasuredPoints
from scripts.planner.profile import Profile
from scripts.planner.profile_config import ProfileConfig

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Measured:
    """A run's points and fits, beside the profile they make: what the command prints."""

    points: MeasuredPoints = field(default_factory=MeasuredPoints)
    fits: dict[str, Fit] = field(default_factory=dict)  # "prefill", "decode", "handoff.NAME"
    skipped: list[str] = field(default_factory=list)  # points or transports left out, and why
    engine_start_s: float = 0.0


def check_devices(cfg: ProfileConfig) -> None:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device")
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.tp > 1 and cfg.tp > seen:
        raise ConfigError(f"--tp {cfg.tp}: needs {cfg.tp} visible GPUs, torch sees {seen}")


def measure_profile(cfg: ProfileConfig, progress: Callable[[str], None]) -> tuple[Profile, Measured]:
    check_devices(cfg)
    grid, measured = Grid.make(cfg.quick), Measured()
    progress(f"starting the engine ({cfg.model}, tp {cfg.tp}) as serve would: weights, KV pool, CUDA graphs, "
             "warm-up")
    start = time.perf_counter()
    llm = LLM.from_config(cfg.engine_config())
    measured.engine_start_s = time.perf_counter() - start
    engine = llm.engine
    try:
        ec: EngineConfig = engine.config
        device, layout = engine.runner.device, engine.runner.kv_pool.layout
        num_blocks = engine.block_manager.num_blocks
        progress(f"engine ready in {measured.engine_start_s:.1f} s on {device}: {num_blocks} KV blocks of "
                 f"{ec.block_size} tokens, step budget {ec.max_num_batched_tokens} tokens, max_model_len "
                 f"{ec.max_model_len}")
        prompts = Prompts(ec.model_config.vocab_size)
        measured.points.prefill = measure_prefill(engine, grid, prompts, progress)
        measured.points.sustained = measure_sustained(engine, grid, prompts, progress)
        decodes, skipped = measure_decode(engine, grid, prompts, progress)
        measured.points.decode = [d.point for d in decodes]
        measured.skipped += [f"decode {s}" for s in skipped]
        host_launch_s, launch_prep_s = host_launch_seconds(decodes), launch_prep_seconds(decodes)
        measured.points.mixed = measure_mixed(engine, grid, prompts, progress)
        # An int, not the graph runner: a reference to it would keep the model and its KV pool alive past close().
        graph_max = engine.runner.prefill_graphs.sizes[-1] if engine.runner.prefill_graphs is not None else 0
        skinny_max = skinny_max_batch(engine.runner.device)
    finally:
        llm.close()
        del llm, engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    mc = ec.model_config
    kv_bytes_per_token = mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * DTYPE_BYTES[layout.dtype]
    # One rank's shard moves; the simulator asks for the whole model's KV (docs/planner.md: TP handoffs).
    scale = kv_bytes_per_token / (layout.block_bytes // layout.block_size)
    measured.points.handoff, skipped = measure_handoffs(layout, device,
                                                        handoff_sizes(grid.handoff_tokens, ec.max_model_len),
                                                        grid.handoff_reps, progress, scale)
    measured.skipped += [f"handoff {s}" for s in skipped]

    costs, measured.fits = fit_costs(measured.points, host_launch_s, graph_max, skinny_max)
    profile = Profile(machine=machine_name(device, cfg.tp), model=model_name(cfg), tp=cfg.tp, device=device.type,
                      note=note(cfg, device), block_size=ec.block_size, num_kv_blocks=num_blocks,
                      kv_bytes_per_token=kv_bytes_per_token, max_num_batched_tokens=ec.max_num_batched_tokens,
                      max_num_seqs=ec.max_num_seqs, host_launch_s=host_launch_s, launch_prep_s=launch_prep_s,
                      prefill_graph_max_tokens=graph_max, points=measured.points, **costs)
    profile.check()
    return profile, measured


def skinny_max_batch(device: torch.device) -> int:
    """The most sequences whose decode step runs the skinny GEMMs (common/engine/layers/gemv.py): none on CPU."""
    if device.type != "cuda":
        return 0
    from common.engine.layers import gemv  # triton: a CUDA machine has it

    return gemv.MAX_ROWS


def machine_name(device: torch.device, tp: int) -> str:
    if device.type == "cuda":
        return f"{tp}x {torch.cuda.get_device_name(device)}"
    return f"CPU: {cpu_model()} ({os.cpu_count()} cores)"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def model_name(cfg: ProfileConfig) -> str:
    """--model-name, else config.json's _name_or_path, else the model folder's name."""
    if cfg.model_name:
        return cfg.model_name
    try:
        named = json.loads((Path(cfg.model) / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError):
        named = None
    return Path(named).name if named else Path(cfg.model).resolve().name


def git_revision() -> str | None:
    """HEAD's short hash, with "+changes" when tracked files differ from it (a tree measured before its commit)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    return head.stdout.strip() + ("+changes" if changed.returncode == 0 and changed.stdout.strip() else "")


def note(cfg: ProfileConfig, device: torch.device) -> str:
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    rev = git_revision()
    text = f"measured by `pdcluster profile` on {day}" + (f" at git {rev}" if rev else "")
    text += f", {device.type}" + (", --quick" if cfg.quick else "")
    if not cfg.overlap_scheduling or cfg.enforce_eager:
        text += ", " + ", ".join(flag for flag, on in (("--no-overlap-scheduling", not cfg.overlap_scheduling),
                                                       ("--enforce-eager", cfg.enforce_eager)) if on)
    if device.type == "cuda" and (share := mps_share()) is not None:  # its costs are a share's (Profile.mps `alone`)
        text += f", as an MPS client at {share}% of the SMs"
    return text
