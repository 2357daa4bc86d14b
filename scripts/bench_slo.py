"""The SLO goodput is judged by, and where each half of it came from: --slo-ttft / --slo-tpot when given; else on
GPUs GPU-sized defaults; else on CPU, where those would make every request miss, a multiple (--slo-scale) of the
slower mode's unloaded p50, known once the modes have served their unloaded requests. Load points measured before
the SLO is known are judged again (`rejudge`) from their requests."""
from __future__ import annotations

from scripts.bench_config import BenchConfig
from scripts.bench_metrics import SLO, RequestRecord, judge

GPU_DEFAULTS = {"ttft": 1.0, "tpot": 0.05}  # seconds: what a small model on one datacenter GPU comfortably meets
NAMES = {"ttft": "TTFT", "tpot": "TPOT"}


def known_before(cfg: BenchConfig, device: str | None) -> SLO | None:
    """The SLO when no part of it waits for the unloaded runs (flags, or GPU defaults off CPU); else None."""
    values = [getattr(cfg, f"slo_{key}") for key in NAMES]
    if device != "cpu":
        values = [v if v is not None else GPU_DEFAULTS[k] for v, k in zip(values, NAMES)]
    return None if None in values else SLO(*values)


def unloaded_p50(runs: list[dict], key: str) -> tuple[float, str] | None:
    """The slowest unloaded `key` p50 among the modes, and its mode."""
    found = [(p50, run["mode"]) for run in runs if run.get("unloaded")
             if (p50 := run["unloaded"]["summary"][key]["p50"]) is not None]
    return max(found) if found else None


def settle(cfg: BenchConfig, device: str | None, runs: list[dict]) -> dict:
    """{"ttft": s, "tpot": s, "ttft_from": why, "tpot_from": why} from the flags, the device and the modes' runs."""
    slo: dict = {}
    for key, name in NAMES.items():
        flag = getattr(cfg, f"slo_{key}")
        base = unloaded_p50(runs, key) if flag is None and device == "cpu" else None
        if flag is not None:
            value, why = flag, f"--slo-{key}"
        elif base is not None:
            value = cfg.slo_scale * base[0]
            slower = ", the slower mode's" if sum(bool(r.get("unloaded")) for r in runs) > 1 else ""
            why = (f"on CPU: --slo-scale {cfg.slo_scale:g} x {base[1]}'s unloaded {name} p50 "
                   f"({base[0] * 1e3:.1f} ms{slower}); --slo-{key} sets it")
        else:
            value = GPU_DEFAULTS[key]
            why = {"cuda": f"GPU-sized default; --slo-{key} sets it",
                   "cpu": f"GPU-sized default: on CPU, no unloaded {name} to derive it from (--unloaded-requests "
                          f"> 0, or --slo-{key})",
                   None: f"GPU-sized default: the running cluster's device is not known (with --device cpu it is "
                         f"derived from the unloaded requests; --slo-{key} sets it)"}[device]
        slo[key], slo[f"{key}_from"] = value, why
    return slo


def rejudge(results: dict, slo: dict) -> None:
    """Every measured point's goodput and SLO attainment again, from its requests, by `slo`."""
    judged_by = SLO(slo["ttft"], slo["tpot"])
    for run in results["runs"]:
        for point in ([run["unloaded"]] if run.get("unloaded") else []) + run["points"]:
            records = [RequestRecord.from_json(r) for r in point["requests"]]
            summary = point["summary"]
            summary["goodput"], summary["slo_attainment"] = judge(records, judged_by, summary["duration"])


def of_results(results: dict) -> dict:
    """The SLO a results.json was judged by; results from before `slo` was kept had it in their config."""
    if results.get("slo"):
        return results["slo"]
    cfg = results["config"]
    slo = {key: cfg.get(f"slo_{key}") or GPU_DEFAULTS[key] for key in NAMES}
    return {**slo, **{f"{key}_from": "the run's configuration" for key in NAMES}}
