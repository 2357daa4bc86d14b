"""The output folder of a preparation: built in a hidden staging folder beside ``out`` and renamed into place at
the end, so an interrupted run never leaves a half-written model at ``out``."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PREP_INFO = "pdcluster_prep.json"
# Bump when the files prepare_smollm2 writes change, so that cached_smollm2_dir rebuilds its cache.
PREP_VERSION = 1


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"cannot write the model to {out}: it exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"cannot write the model to {out}: the directory is not empty "
                              "(--overwrite, or overwrite=True in Python, replaces it)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot write the model to {out}: cannot create {out.parent}: {e.strerror or e}") from e


@contextlib.contextmanager
def staging_dir(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty folder beside ``out``; on success it replaces ``out``, on any failure it is removed."""
    out = Path(out).expanduser().absolute()
    _check_target(out, overwrite)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
    except OSError as e:
        raise OSError(f"cannot write the model to {out}: {out.parent} is not writable: {e.strerror or e}") from e
    try:
        yield tmp
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_prep_info(out: Path, **info: Any) -> None:
    write_json(out / PREP_INFO, {"prep_version": PREP_VERSION, **info})


def prep_version(path: Path) -> int | None:
    """The PREP_VERSION a prepared folder was written with; None if it has none (or is not one)."""
    try:
        return int(json.loads((path / PREP_INFO).read_text(encoding="utf-8"))["prep_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
