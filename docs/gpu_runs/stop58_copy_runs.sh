# For the next stop (issue 21's lead from stop 58): how a served cuda_ipc handoff's host time depends on
# kvtransfer/cuda_ipc.py's MAX_COPY_RUNS (a copy_ per joint run of block ids up to it, the block-copy kernel past it).
# Qwen3-0.6B 1P:1D under `serve --mps` on one GPU, prefill-heavy at 16 and 32 req/s, N requests a rate, each variant
# served with its timelines: the tree's 16, 1 (the kernel unless the ids are one run) and 1000 (a copy_ per run
# always), alternated ROUNDS times; each run's TTFT and its sends' parts (send, wait, GPU copy, CPU; p50 / p90, us).
# The variants are copies of this tree's packages made here (no .git on the device). Carry .gpu-deps.
KEEP=/tmp/copy_runs; N=${N:-300}; ROUNDS=${ROUNDS:-2}
source docs/gpu_runs/one_gpu_validation.sh
for runs in 1 1000; do
  mkdir -p /tmp/runs$runs && tar -cf - common router prefill_worker decode_worker kvtransfer scripts | tar -C /tmp/runs$runs -xf -
  sed -i "s/^MAX_COPY_RUNS = 16 /MAX_COPY_RUNS = $runs /" /tmp/runs$runs/kvtransfer/cuda_ipc.py
  grep -q "^MAX_COPY_RUNS = $runs " /tmp/runs$runs/kvtransfer/cuda_ipc.py || { echo "no MAX_COPY_RUNS to set"; exit 2; }
done
parts() {  # a timeline folder -> its sends' parts
  python - "$1" <<'PY'
import json, pathlib, sys
marks = [json.loads(line) for f in pathlib.Path(sys.argv[1]).glob("p*.jsonl") for line in open(f) if "kv_sent" in line]
def pct(v, q): v = sorted(v); return v[min(len(v) - 1, int(q * len(v)))]
print("  sends", len(marks), " ".join(f"{k[:-3]} {pct([m[k] for m in marks], .5)}/{pct([m[k] for m in marks], .9)}"
                                        for k in ("send_us", "wait_us", "copy_us", "cpu_us")))
PY
}
for round in $(seq $ROUNDS); do
  for runs in 16 1 1000; do
    tree=$PWD; [ $runs = 16 ] || tree=/tmp/runs$runs
    echo "## MAX_COPY_RUNS=$runs, round $round"
    (cd $tree && export PYTHONPATH=${PYTHONPATH%:*}:$tree  # the variant's modules, in Ray's workers too
     python -c "import kvtransfer.cuda_ipc as c; print('  serving MAX_COPY_RUNS =', c.MAX_COPY_RUNS)"
     TAG=r$runs-$round SERVE=--mps bench ph disagg $PH --rates 16,32 --unloaded-requests 0)
    parts $KEEP/ph-disagg-r$runs-$round-timeline
  done
done
