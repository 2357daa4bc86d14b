"""Issue 20's first-minute check on a multi-GPU cluster: serve PREFILL + DECODE workers one GPU each (nccl between
them) or COLOCATED replicas, then 220 requests one at a time; requests i, i+100 and i+200 have the same prompt length
and sampling. Prints start-up time, each window's TTFT median and the median per-pair ratios, and the server's
warm-up and KV link log lines.

usage: stop31_first_window.py MODEL LABEL PORT disagg P D | colocated N"""
import random, statistics, subprocess, sys, time
from router.client import Client

model, label, port, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode == "disagg":
    workers = ["--prefill-workers", sys.argv[5], "--decode-workers", sys.argv[6]]
else:
    workers = ["--workers", sys.argv[5]]
path = f"/tmp/serve-{label}.log"
log = open(path, "w")
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "serve", "--model", model, "--device", "cuda",
                         "--gpus-per-worker", "1", "--mode", mode, *workers, "--bind", f"tcp://127.0.0.1:{port}"],
                        stdout=log, stderr=subprocess.STDOUT)
try:
    while "serving on" not in open(path).read():
        assert proc.poll() is None, open(path).read()[-3000:]
        time.sleep(0.1)
    ready = time.monotonic() - t0
    ttft, rng = [], random.Random(1)
    with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
        c.wait_ready(60)
        for i in range(220):
            shape = random.Random(i % 100)
            ids = [rng.randrange(1, 100000) for _ in range(shape.randint(20, 2000))]
            out = c.generate(ids, max_tokens=8, temperature=shape.choice([0.0, 0.7]), ignore_eos=True)
            ttft.append(out.timings.ttft * 1e3)
    w = [ttft[0:20], ttft[100:120], ttft[200:220]]
    med = [statistics.median(x) for x in w]
    pair = statistics.median(a / b for a, b in zip(w[0], w[1]))
    pair2 = statistics.median(a / b for a, b in zip(w[1], w[2]))
    print(f"{label}: ready in {ready:.1f} s; TTFT median 1-20 {med[0]:.2f}, 101-120 {med[1]:.2f}, "
          f"201-220 {med[2]:.2f} ms; ratio of medians {med[0] / med[1]:.2f}; median per-pair ratio (i / i+100) "
          f"{pair:.2f}, (i+100 / i+200) {pair2:.2f}")
    print("first 20 TTFT ms:", " ".join(f"{x:.1f}" for x in ttft[:20]))
    print("\n".join(line.rstrip()[-170:] for line in open(path)
                    if "KV link" in line or "warm" in line.lower() or "compil" in line.lower()))
finally:
    proc.send_signal(2)
    proc.wait(60)
