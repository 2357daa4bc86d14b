"""The benchmark's readings of the router's choices. Placement: each load point's prefix-cache hit rate (from the
engines' totals), and the target of prefix-aware placement against placement by load (`--modes
disagg:prefix,disagg:load`): at least HIT_RATE_TARGET x the hit rate, and a lower TTFT p50, at every load point.
Per-request disaggregation (`--modes disagg:always,disagg:auto,colocated`): does `auto` win, a TTFT p50 no higher
and a goodput no lower than `always` at every load point (the condition for making it the default)?"""
from __future__ import annotations

HIT_RATE_TARGET = 1.5
ROW = "prefix cache hit rate"


def hit_rate(point: dict | None) -> float | None:
    """Prompt tokens found in a prefix cache over those looked up, over the point's prefilling engines (prefill
    workers, or colocated ones); None where nothing was looked up or the results hold no such totals."""
    rows = [e for e in (point or {}).get("engines") or [] if e["role"] in ("prefill", "colocated")]
    asked = sum(e.get("prefix_query_tokens", 0) for e in rows)
    return sum(e.get("prefix_hit_tokens", 0) for e in rows) / asked if asked else None


def hit_rate_rows(points: list[dict | None]) -> list[tuple[str, list[str]]]:
    rates = [hit_rate(p) for p in points]
    if all(r is None for r in rates):
        return []
    return [(ROW, ["n/a" if r is None else f"{100 * r:.1f}%" for r in rates])]


def router_rows(points: list[dict | None]) -> list[tuple[str, list[str]]]:
    """What the router decided over each point (its `totals`): prompts prefilled on the decode worker itself, and
    streams moved after a worker died. Only where some point has them."""
    rows = [(p or {}).get("router") for p in points]
    out = []
    if any(r and r["local_prefills"] + r["remote_prefills"] for r in rows):
        out.append(("prefilled on the decode worker", [
            "n/a" if not r or not (n := r["local_prefills"] + r["remote_prefills"]) else f"{r['local_prefills']} of {n}"
            for r in rows]))
    if any(r and r["migrations"] for r in rows):
        out.append(("streams moved (migrations)", ["n/a" if not r else str(r["migrations"]) for r in rows]))
    return out


def placement_reading(results: dict) -> str | None:
    """For each base mode run with both placements: does `prefix` reach the targets at every load point? None
    when no run pairs them."""
    runs = {run["mode"]: run for run in results["runs"]}
    lines = []
    for base in ("disagg", "colocated"):
        prefix, load = runs.get(f"{base}:prefix") or runs.get(base), runs.get(f"{base}:load")
        if prefix is None or load is None:
            continue
        worse = []
        for i, point in enumerate(results["load_points"]):
            a, b = _point(prefix, i), _point(load, i)
            if a is None or b is None:
                worse.append(f"{point['label']}: not run")
                continue
            ra, rb = hit_rate(a), hit_rate(b)
            ta, tb = a["summary"]["ttft"]["p50"], b["summary"]["ttft"]["p50"]
            if ra is None or rb is None or ta is None or tb is None:
                worse.append(f"{point['label']}: no hit rate or TTFT")
            elif not (ra >= HIT_RATE_TARGET * rb and ta < tb):
                worse.append(f"{point['label']}: hit rate {100 * ra:.1f}% vs {100 * rb:.1f}%, "
                             f"TTFT p50 {ta * 1e3:.1f} vs {tb * 1e3:.1f} ms")
        verdict = ("meets the target at every load point" if not worse
                   else "misses the target at " + "; ".join(worse))
        lines.append(f"**{base}**: prefix-aware placement against placement by load {verdict} (target: at least "
                     f"{HIT_RATE_TARGET:g}x the prefix-cache hit rate and a lower TTFT p50).")
    return "\n\n".join(lines) if lines else None


def policy_reading(results: dict) -> str | None:
    """`disagg:auto` against `disagg:always` (or plain `disagg`), colocated's TTFT beside; None without both."""
    runs = {run["mode"]: run for run in results["runs"]}
    auto, always = runs.get("disagg:auto"), runs.get("disagg:always") or runs.get("disagg")
    if auto is None or always is None:
        return None
    colocated = runs.get("colocated")
    lost, rows = [], []
    for i, point in enumerate(results["load_points"]):
        a, b = _point(auto, i), _point(always, i)
        if a is None or b is None:
            lost.append(f"{point['label']}: not run")
            continue
        ta, tb = a["summary"]["ttft"]["p50"], b["summary"]["ttft"]["p50"]
        ga, gb = a["summary"]["goodput"], b["summary"]["goodput"]
        c = _point(colocated, i) if colocated else None
        tc = c["summary"]["ttft"]["p50"] if c else None
        rows.append(f"- {point['label']}: TTFT p50 {_ms(ta)} (auto) / {_ms(tb)} (always) / {_ms(tc)} (colocated) ms, "
                    f"goodput {ga:.2f} / {gb:.2f} req/s")
        if ta is None or tb is None or ta > tb or ga < gb:
            lost.append(point["label"])
    verdict = ("`auto` wins at every load point: it can become the default" if not lost
               else "`auto` does not win at " + ", ".join(lost))
    return "\n".join([verdict + " (a TTFT p50 no higher and a goodput no lower than `always`).", ""] + rows)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f}"


def _point(run: dict, i: int) -> dict | None:
    return run["points"][i] if i < len(run["points"]) else None
