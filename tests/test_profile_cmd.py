"""`pdcluster profile` on the CPU: the fits recover known coefficients, the measured grids respect the engine's
limits, the command writes a profile that `load_profile` accepts, predicts its own points and `pdcluster plan`
runs with, and its mistakes are one line."""
from __future__ import annotations

import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from scripts.planner.fit import (
    apart_seconds, fit_decode, fit_handoff, fit_mixed, fit_prefill, fit_relative, nnls, refit,
)
from scripts.planner.points import DecodePoint, HandoffPoint, MixedPoint, PrefillPoint
from scripts.planner.profile import DecodeCost, HandoffCost, PrefillCost, ProfileError, load_profile, save_profile

ROOT = Path(__file__).resolve().parent.parent


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


# ---- fits ---------------------------------------------------------------------------------------------

def test_prefill_fit_recovers_known_coefficients_with_the_host_work_split_off():
    truth = PrefillCost(base_s=4e-3, per_token_s=3e-5, per_token_context_s=2e-9, per_chunk_pair_s=2e-9,
                        min_tokens=256, context_min_tokens=1024)
    host = 5e-4
    points = [PrefillPoint(n, c, host + truth.seconds(n, c)) for c in (0, 1024, 4096) for n in (64, 512, 2048, 8192)]
    cost, fit = fit_prefill(points, host)
    assert close(cost.base_s, truth.base_s) and close(cost.per_token_s, truth.per_token_s)
    assert close(cost.per_token_context_s, truth.per_token_context_s) and fit.worst_error < 1e-9
    assert close(cost.per_chunk_pair_s, truth.per_chunk_pair_s)
    assert (cost.min_tokens, cost.context_min_tokens) == (256, 1024)


def test_the_sustained_factor_is_back_to_back_over_alone_and_never_below_one():
    from scripts.planner.fit import sustained_factor
    from scripts.planner.points import SustainedPoint

    assert sustained_factor(SustainedPoint(8190, 6, 0.180, 0.1949)) == pytest.approx(1.0828, rel=1e-3)
    assert sustained_factor(SustainedPoint(8190, 6, 0.004, 0.003)) == 1.0  # a CPU: faster back to back
    assert sustained_factor(None) == 1.0


def test_decode_and_handoff_fits_recover_known_coefficients():
    truth, host = DecodeCost(base_s=2e-3, per_seq_s=1e-5, per_seq_context_s=3e-8), 3e-4
    points = [DecodePoint(b, b * c, host + truth.seconds(b, b * c)) for b in (1, 8, 64, 256) for c in (128, 4096)]
    cost, fit = fit_decode(points, host)
    assert close(cost.base_s, truth.base_s) and close(cost.per_seq_s, truth.per_seq_s)
    assert close(cost.per_seq_context_s, truth.per_seq_context_s) and fit.worst_error < 1e-9

    link = HandoffCost(base_s=1e-3, bytes_per_s=2.5e10)
    cost, fit = fit_handoff([HandoffPoint(n, link.seconds(n)) for n in (1 << 20, 1 << 24, 1 << 28)])
    assert close(cost.base_s, link.base_s) and close(cost.bytes_per_s, link.bytes_per_s) and fit.worst_error < 1e-9


def test_the_mixed_step_fit_is_what_mixed_steps_take_beyond_their_parts_apart():
    prefill, decode, host = PrefillCost(base_s=4e-3, per_token_s=3e-5), DecodeCost(base_s=2e-3, per_seq_s=1e-5), 3e-4
    extra = 6e-3
    points = [MixedPoint(b, b * 512, 256, host + prefill.seconds(256) + decode.seconds(b, b * 512) + extra)
              for b in (1, 16, 64)]
    value, fit = fit_mixed(points, host, prefill, lambda b: decode)
    assert close(value, extra) and fit.worst_error < 1e-9
    assert all(close(apart_seconds(p, host, prefill, lambda b: decode) + value, p.seconds) for p in points)
    faster = [MixedPoint(p.batch, p.total_context, p.tokens, p.seconds - 2 * extra) for p in points]
    assert fit_mixed(faster, host, prefill, lambda b: decode)[0] == 0.0  # never below 0
    assert fit_mixed([], host, prefill, lambda b: decode)[0] == 0.0


def test_noisy_points_give_coefficients_near_the_truth():
    rng = random.Random(3)
    truth = PrefillCost(base_s=4e-3, per_token_s=3e-5, per_token_context_s=2e-9, per_chunk_pair_s=2e-9)
    points = [PrefillPoint(n, c, truth.seconds(n, c) * rng.uniform(0.97, 1.03))
              for c in (0, 1024, 4096) for n in (64, 256, 1024, 2048, 8192)]
    cost, fit = fit_prefill(points)
    assert abs(cost.per_token_s / truth.per_token_s - 1) < 0.1 and abs(cost.base_s / truth.base_s - 1) < 0.2
    assert fit.worst_error < 0.1 and "WARNING" not in fit.summary("prefill")


def test_coefficients_stay_non_negative_where_least_squares_would_go_below_zero():
    # time falls with size: unconstrained, the slope is negative
    rows, targets = [[1.0, x] for x in (1, 2, 3, 4)], [4.0, 3.0, 2.5, 1.0]
    x = nnls(rows, targets)
    assert x[1] == 0 and close(x[0], statistics.mean(targets))
    cost, _ = fit_decode([DecodePoint(b, b * 100, 0.01 - 1e-4 * b) for b in (1, 4, 16, 64)])
    assert min(cost.base_s, cost.per_seq_s, cost.per_seq_context_s) >= 0
    handoff, _ = fit_handoff([HandoffPoint(n, 1e-3) for n in (1000, 2000, 4000)])  # flat: a finite rate all the same
    assert handoff.bytes_per_s > 0 and handoff.seconds(4000) >= 1e-3 * 0.99


def test_a_poor_fit_warns_in_one_line():
    fit = fit_relative([[1.0, float(n)] for n in (1, 10, 100, 1000)], [1.0, 1.0, 100.0, 1.0])
    line = fit.summary("decode")
    assert fit.worst_error > 0.2 and "WARNING" in line and "\n" not in line


# ---- what is measured ---------------------------------------------------------------------------------

def test_grids_fit_the_step_budget_the_model_length_and_the_kv_pool():
    from scripts.planner.measure.steps import (Grid, decode_growth, decode_plan, mixed_plan, prefill_plan,
                                               spread_contexts)

    for quick in (True, False):
        grid = Grid.make(quick)
        plan = prefill_plan(grid, budget=8192, max_len=40960, block_size=16)
        assert max(n for n, _ in plan) == 8192 and {c for _, c in plan} == set(grid.prefill_contexts)
        short = prefill_plan(grid, budget=256, max_len=1024, block_size=16)
        assert all(n <= 256 and n + c < 1024 and c % 16 == 0 for n, c in short) and any(c for _, c in short)
        points, skipped = decode_plan(grid, max_num_seqs=256, budget=8192, max_len=40960, num_blocks=20000,
                                      block_size=16)
        for b, c in points:
            growth = decode_growth(grid, b, c, 8192)
            lengths = spread_contexts(b, c)
            assert b <= 256 and sum(-(-(n + growth) // 16) for n in lengths) <= 20000
            assert max(lengths) + growth <= 40960
        assert skipped and all("KV blocks" in s for s in skipped)  # 256 x 4096 tokens do not fit 320k slots
        assert len({c for _, c in points}) >= 2 and len({b for b, _ in points}) >= 3
        mixed = mixed_plan(grid, max_num_seqs=256, budget=8192, max_len=40960, num_blocks=20000, block_size=16)
        assert len(mixed) >= 2 and all(b + n <= 8192 and b < 256 for b, _, n in mixed)
        small = mixed_plan(grid, max_num_seqs=16, budget=256, max_len=1024, num_blocks=20000, block_size=16)
        assert small and all(b < 16 and b + n <= 256 for b, _, n in small)


def test_decode_points_mix_context_lengths_around_their_mean():
    """A serving batch mixes lengths, and the decode plan costs more over mixed ones: the profile's decode points
    run contexts from a third to five thirds of the point's context, with that mean."""
    from scripts.planner.measure.steps import spread_contexts

    assert spread_contexts(1, 1024) == [1024]
    for batch, context in ((2, 1024), (64, 1024), (7, 4096), (256, 128)):
        lengths = spread_contexts(batch, context)
        assert len(lengths) == batch and abs(sum(lengths) / batch - context) <= 1
        assert min(lengths) == round(context / 3) and max(lengths) == round(5 * context / 3)


# ---- the command --------------------------------------------------------------------------------------

def pdcluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # one intra-op thread: the CPU timings are less at the mercy of whatever else this machine runs
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "scripts.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("pdcluster: error: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def profiled(tiny_qwen3_dir, tmp_path_factory) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    proc = pdcluster("profile", "--model", str(tiny_qwen3_dir), "--device", "cpu", "--quick", "--max-num-seqs", "16",
                     "--max-num-batched-tokens", "256", "--max-model-len", "1024", "--model-name", "tiny-qwen3",
                     "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "profile: prefill" in proc.stderr and "profile: decode" in proc.stderr  # progress on stderr
    return out, proc.stdout, proc.stderr


def test_the_command_writes_a_profile_of_the_engine_it_built(profiled):
    out, stdout, stderr = profiled
    profile = load_profile(out)
    assert profile.machine.startswith("CPU: ") and profile.model == "tiny-qwen3" and profile.tp == 1
    assert "measured by `pdcluster profile` on" in profile.note and "--quick" in profile.note
    assert (profile.block_size, profile.max_num_seqs, profile.max_num_batched_tokens) == (16, 16, 256)
    assert profile.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4  # tiny-qwen3: layers x (K, V) x KV heads x dim x fp32
    assert profile.num_kv_blocks == (2 << 30) // (16 * profile.kv_bytes_per_token)  # the CPU pool's default 2 GiB
    assert set(profile.handoff) == {"host"} and "skipped: handoff cuda_ipc" in stdout
    # grows with prompts
    assert profile.prefill.seconds(256) > profile.prefill.seconds(16) and profile.host_launch_s > 0
    # the launch clock's own figure: scheduling and launching a step, more than the scheduler's part of it
    assert profile.launch_prep_s > profile.host_launch_s
    assert profile.mixed_step_s >= 0 and "profile: mixed" in stderr
    for name in ("prefill", "decode", "mixed", "handoff host"):
        assert re.search(rf"^{name}: worst relative error [0-9.]+%", stdout, re.M), stdout
    assert f"wrote {out}" in stdout


def test_its_coefficients_predict_its_own_points(profiled):
    """The profile's coefficients give the fit column it printed beside every point; and, loosely (CPU timings on a
    shared machine are noisy), the median prefill and decode point is within 50% of them. A host copy's time on a
    shared CPU is too noisy for a line through three sizes to be held to a bound (its median point was 51% off once)."""
    out, stdout, _ = profiled
    profile, host = load_profile(out), load_profile(out).host_launch_s
    lines = stdout.splitlines()

    def rows(header: str, width: int) -> list[list[float]]:
        """The numbers of the table under the line starting with `header`'s words."""
        start = next(i for i, line in enumerate(lines) if line.split()[:len(header.split())] == header.split())
        found = []
        for line in lines[start + 1:]:
            if len(line.split()) != width:
                break
            found.append([float(f) for f in line.split()])
        return found

    prefill = [(host + profile.prefill_cost(int(n))[0].seconds(int(n), int(c)), ms / 1e3, fit / 1e3)
               for n, c, ms, fit in rows("prefill tokens", 4)]
    decode = [(host + profile.decode_cost(int(b)).seconds(int(b), int(b * ctx)), ms / 1e3, fit / 1e3)
              for b, ctx, ms, fit in rows("decode batch", 4)]
    handoff = rows("handoff host MB", 3)
    assert len(prefill) >= 6 and len(decode) >= 3 and len(handoff) >= 3
    # the table rounds
    assert [p for p, _, _ in prefill] == pytest.approx([f for _, _, f in prefill], rel=2e-3, abs=2e-6)
    # A handoff row prints its size to 0.01 MB: its fit lies between the costs of the least and the most bytes that
    # stands for, up to the table's rounding (0.001 ms).
    for mb, _, fit in handoff:
        least, most = (profile.handoff["host"].seconds((mb + d) * 1e6) for d in (-0.005, 0.005))
        assert least - 6e-7 <= fit / 1e3 <= most + 6e-7, (mb, fit, least, most)
    # A decode row prints the mean context floored (total // batch): its fit lies between the costs of the least and
    # the most total context that mean stands for, up to the table's rounding (0.001 ms).
    for b, ctx, _, fit in rows("decode batch", 4):
        cost = profile.decode_cost(int(b))
        least, most = (host + cost.seconds(int(b), int(b * ctx) + extra) for extra in (0, int(b) - 1))
        assert min(least, most) - 6e-7 <= fit / 1e3 <= max(least, most) + 6e-7, (b, ctx, fit, least, most)
    for name, points in (("prefill", prefill), ("decode", decode)):
        errors = [abs(p - m) / m for p, m, _ in points]
        assert statistics.median(errors) < 0.5, (name, errors)


def test_the_profile_keeps_its_points_so_a_changed_model_refits_them_without_a_gpu(profiled, tmp_path):
    """The points every cost was fitted to are in the profile; fitted again by the same models they give the same
    profile, and a profile whose costs came from another model gets this tree's (`pdcluster refit-profile`)."""
    out, _, _ = profiled
    profile = load_profile(out)
    points = profile.points
    assert len(points.prefill) >= 6 and len(points.decode) >= 3 and len(points.mixed) >= 1
    assert len(points.handoff["host"]) >= 3
    assert points.sustained is not None and points.sustained.prompts == 6 and points.sustained.back_to_back_s > 0
    same, fits = refit(profile)
    assert same == profile and {"prefill", "decode", "mixed", "handoff.host"} <= set(fits)

    other = msgspec.structs.replace(profile, prefill=PrefillCost(base_s=1.0, per_token_s=1.0),
                                    decode=DecodeCost(base_s=1.0, per_seq_s=1.0))
    save_profile(other, tmp_path / "other.json")
    proc = pdcluster("refit-profile", str(tmp_path / "other.json"), "--out", str(tmp_path / "refitted.json"))
    assert proc.returncode == 0, proc.stderr
    refitted = load_profile(tmp_path / "refitted.json")
    assert (refitted.prefill, refitted.decode) == (profile.prefill, profile.decode)
    assert "refitted to its points" in refitted.note and re.search(r"^prefill: worst relative error", proc.stdout, re.M)

    save_profile(msgspec.structs.replace(profile, points=None), tmp_path / "before.json")
    line = one_error_line(pdcluster("refit-profile", str(tmp_path / "before.json"), "--out", str(tmp_path / "x.json")))
    assert "keeps no measured points" in line
    with pytest.raises(ProfileError, match="keeps no measured points"):
        refit(msgspec.structs.replace(profile, points=None))


def test_plan_runs_with_the_measured_profile(profiled, tmp_path):
    out, _, _ = profiled
    proc = pdcluster("plan", "--profile", str(out), "--gpus", "2", "--rates", "2", "--num-requests", "20",
                     "--input-len", "32:128", "--output-len", "4:16", "--disagg-policies", "always")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recommendation:" in proc.stdout and "tiny-qwen3 on CPU: " in proc.stdout


def test_mistakes_are_one_line(tiny_qwen3_dir, tmp_path):
    assert "no config.json" in one_error_line(pdcluster("profile", "--model", str(tmp_path), "--out", "x.json"))
    assert "--out FILE is required" in one_error_line(pdcluster("profile", "--model", str(tiny_qwen3_dir)))
    line = one_error_line(pdcluster("profile", "--model", str(tiny_qwen3_dir), "--out",
                                    str(tmp_path / "no" / "p.json")))
    assert "--out: no folder" in line
    line = one_error_line(pdcluster("profile", "--model", str(tiny_qwen3_dir), "--tp", "2", "--out", "x.json"))
    assert "--tp 2: needs 2 visible GPUs" in line
    line = one_error_line(pdcluster("profile", "--model", str(tiny_qwen3_dir), "--device", "cuda", "--out", "x"))
    assert "cuda" in line


def test_a_profile_names_a_tree_that_differs_from_its_commit(tmp_path, monkeypatch):
    """A profile measured before its tree is committed says so: the note's revision gets "+changes"."""
    from scripts.planner.measure import run

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    git("add", "f.py")
    git("commit", "-qm", "one")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    clean = run.git_revision()
    assert clean and re.fullmatch(r"[0-9a-f]{7,}", clean)
    (tmp_path / "f.py").write_text("a = 2\n")
    assert run.git_revision() == clean + "+changes"


@pytest.mark.parametrize("share, said", [(None, False), ("100", False), ("70", True)])
def test_a_profile_measured_as_an_mps_client_at_a_share_says_so(monkeypatch, share, said):
    """Its costs are then that share's: the decode cap's `alone` (Profile.mps) is its ratio to an uncapped one."""
    import torch

    from types import SimpleNamespace

    from scripts.planner.measure.run import note

    if share is None:
        monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    else:
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share)
    from common.engine.device import mps_share

    cfg = SimpleNamespace(quick=False, overlap_scheduling=True, enforce_eager=False)  # the flags `note` reads
    mps_share.cache_clear()  # read once a process; this test changes it
    try:
        assert ("as an MPS client at 70% of the SMs" in note(cfg, torch.device("cuda"))) == said
        assert "MPS" not in note(cfg, torch.device("cpu"))
    finally:
        mps_share.cache_clear()
