#!/usr/bin/env bash
# Installs NVIDIA's aiperf 0.13.0 on the offline GPU host, from the pruned wheel set in .whl/aiperf (cp312,
# manylinux x86-64, ~26 MB: aiperf and what `aiperf profile` imports beyond the host's own packages; the host
# lacked idna, so its HTTP chain travels too).
# Run from the repo root:   bash docs/gpu_runs/install_aiperf.sh
#
# It makes .cache/aiperf-venv with --system-site-packages (and the host interpreter's own site-packages, should
# python3 be a venv's), so torch, transformers, tokenizers, huggingface_hub,
# numpy, jinja2, uvloop, ... come from the host; the venv's own copies of pydantic, rich, pyzmq 26.4, ... win over
# the host's inside the venv. aiperf pins pyzmq~=26.4, while the project's pyzmq 27.3 comes through PYTHONPATH,
# which Python puts ahead of every site-packages. So bin/aiperf becomes a small wrapper that unsets PYTHONPATH and
# runs pip's entry point (kept as bin/aiperf-bin): aiperf and the service processes it spawns (they inherit its
# environment) see the venv's pyzmq, not ours. scripts/bench_aiperf.py calls .cache/aiperf-venv/bin/aiperf, so it
# gets this without any change; by hand, call .cache/aiperf-venv/bin/aiperf (never `python -m aiperf` with our
# PYTHONPATH set).
#
# Env: AIPERF_WHEELS (default .whl/aiperf), AIPERF_VENV (default .cache/aiperf-venv), PYTHON (default python3).
set -euo pipefail

WHEELS=${AIPERF_WHEELS:-.whl/aiperf}
VENV=${AIPERF_VENV:-.cache/aiperf-venv}
PY=${PYTHON:-python3}
die() { echo "install_aiperf: $*" >&2; exit 1; }

[ -f pyproject.toml ] && [ -d scripts ] || die "run this from the repo root (no pyproject.toml/scripts here: $PWD)"
ls "$WHEELS"/aiperf-0.13.0-*.whl >/dev/null 2>&1 || die "no aiperf wheel in $WHEELS (make it on a networked machine; see the header)"
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
  || die "$PY is $("$PY" -V 2>&1); the wheels in $WHEELS are for CPython 3.12"

# Start clean: a half-made venv, or one from another wheel set, would hide what is missing.
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
# The host may lack ensurepip; a --system-site-packages venv can then use the host's own pip.
if ! env -u PYTHONPATH "$PY" -m venv --system-site-packages "$VENV" 2>/dev/null; then
  rm -rf "$VENV"
  env -u PYTHONPATH "$PY" -m venv --system-site-packages --without-pip "$VENV" || die "cannot create $VENV"
fi
VPY=$(cd "$VENV/bin" && pwd)/python
env -u PYTHONPATH "$VPY" -m pip --version >/dev/null 2>&1 || die "no pip for $VPY (neither ensurepip nor a host pip)"

# The host's python3 may itself run in a virtual environment, whose packages (transformers, numpy, yaml, ...)
# --system-site-packages does not reach: its site-packages go on the new venv's path after the venv's own.
VSITE=$(env -u PYTHONPATH "$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
env -u PYTHONPATH "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$VSITE/_host_site.pth"

env -u PYTHONPATH PIP_DISABLE_PIP_VERSION_CHECK=1 "$VPY" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl \
  || die "pip could not install the wheels from $WHEELS"

# bin/aiperf: pip's entry point behind a wrapper that drops PYTHONPATH (see the header).
BIN=$(dirname "$VPY")
[ -f "$BIN/aiperf" ] || die "pip made no $BIN/aiperf"
mv "$BIN/aiperf" "$BIN/aiperf-bin"
cat > "$BIN/aiperf" <<'EOF'
#!/bin/sh
# aiperf with its own pyzmq (~=26.4): the project's PYTHONPATH (pyzmq 27.3) would shadow the venv's site-packages.
unset PYTHONPATH
exec "$(dirname "$0")/aiperf-bin" "$@"
EOF
chmod +x "$BIN/aiperf"

# Checks, run the way the bench runs it (with the caller's PYTHONPATH, which the wrapper drops).
"$BIN/aiperf" --help >/dev/null 2>"$VENV/install-check.log" \
  || die "'$BIN/aiperf --help' failed; see $VENV/install-check.log: $(tail -3 "$VENV/install-check.log")"
# What `aiperf profile` and its service processes import (a missing one fails only there, not in --help).
env -u PYTHONPATH "$VPY" - >>"$VENV/install-check.log" 2>&1 <<'EOF' || die "aiperf's modules do not import; see $VENV/install-check.log: $(tail -3 "$VENV/install-check.log")"
import importlib, sys
for m in ["aiperf.cli", "aiperf.dataset.dataset_manager", "aiperf.dataset.composer.synthetic",
          "aiperf.metrics.accumulator", "aiperf.server_metrics.manager", "aiperf.records.records_manager",
          "aiperf.transports.aiohttp_client", "aiperf.common.mixins.process_health_mixin", "transformers"]:
    importlib.import_module(m)
import os, zmq, pydantic, rich, aiohttp, idna, httpx  # noqa: E401 (idna: yarl's; httpx: huggingface_hub's)
assert zmq.__version__.startswith("26."), f"aiperf would get pyzmq {zmq.__version__} from {zmq.__file__}"
# A user site (~/.local) comes ahead of the venv's site-packages: then retry with PYTHONNOUSERSITE=1 exported.
for mod in (zmq, pydantic, rich, aiohttp):
    assert os.path.realpath(mod.__file__).startswith(os.path.realpath(sys.prefix)), \
        f"{mod.__name__} comes from {mod.__file__}, not from the venv {sys.prefix}"
from transformers import AutoTokenizer  # noqa: F401  (aiperf's --tokenizer DIR)
print("imports ok; pyzmq", zmq.__version__, "from", zmq.__file__)
EOF
echo "install_aiperf: ok: $BIN/aiperf ($("$BIN/aiperf" --version 2>/dev/null | tail -1)); $(tail -1 "$VENV/install-check.log")"
echo "install_aiperf: run it as $BIN/aiperf (it drops PYTHONPATH itself); scripts/bench_aiperf.py uses it by default"
