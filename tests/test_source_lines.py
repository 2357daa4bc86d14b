"""No git-tracked .py file has a line over 120 columns (docs/gpu_runs/ holds historical scripts and is left out)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_COLUMNS = 120


def tracked_sources() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and the repository's .git (not in an sdist)")
    proc = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"git ls-files failed: {proc.stderr.strip()}")
    return [path for path in proc.stdout.split("\0") if path and not path.startswith("docs/gpu_runs/")]


def test_no_source_line_is_longer_than_120_columns() -> None:
    long = [f"{path}:{number}: {len(line)} columns"
            for path in tracked_sources() if (ROOT / path).is_file()
            for number, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_COLUMNS]
    assert not long, f"lines over {MAX_COLUMNS} columns:\n" + "\n".join(long)
