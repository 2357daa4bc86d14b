"""Stop 34 (issue 20): where each of a new cluster's first requests spends its time to the first token, against
later requests of the same shape (request i and i+20 alike). Serves two workers (`--gpus-per-worker 0.5` on a GPU)
with `--timeline-dir`, sends requests one at a time, and prints for each its events' times after the client's send
(ms): the decode worker's reservation, the prefill worker's receipt and launch, the prompt's first token, the KV
handed to the transport, its record at the decode worker, landed (colocated: received, launched, finished).

    python docs/gpu_runs/stop34_first_trace.py MODEL MODE N [cuda|cpu]
"""
import glob, json, random, subprocess, sys, time
from router.client import Client

model, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
device = sys.argv[4] if len(sys.argv) > 4 else "cuda"
tl = f"/tmp/first34-{mode}"
subprocess.run(["rm", "-rf", tl])
port = 29000 + random.randrange(1000)
share = ["--gpus-per-worker", "0.5"] if device == "cuda" else ["--kv-cache-memory", "64MiB"]
proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "serve", "--model", model, "--device", device,
                         "--mode", mode, "--workers", "2", "--bind", f"tcp://127.0.0.1:{port}", "--timeline-dir", tl,
                         *share], stdout=open(f"/tmp/first34-{mode}.log", "w"), stderr=subprocess.STDOUT)
sent = []
try:
    with Client(f"tcp://127.0.0.1:{port}", timeout=120) as c:
        c.wait_ready(120)
        time.sleep(1)
        vocab, rng = (500 if device == "cpu" else 100000), random.Random(1)
        for i in range(n):
            shape = random.Random(i % 20)
            ids = [rng.randrange(1, vocab) for _ in range(shape.randint(20, 2000 if device == "cuda" else 200))]
            t0 = time.monotonic()
            out = c.generate(ids, max_tokens=4, temperature=0.0, ignore_eos=True)
            sent.append((t0, out.timings.ttft))
finally:
    proc.send_signal(2)
    proc.wait(60)
events: dict[str, dict[str, float]] = {}
for path in glob.glob(f"{tl}/*.jsonl"):
    for line in open(path):
        e = json.loads(line)
        events.setdefault(e["request"], {}).setdefault(f"{e['role'][0]}.{e['event']}", e["t"])
keys = (["d.received", "p.received", "p.launched", "p.prefilled", "p.kv_sent", "d.kv_record", "d.landed"]
        if mode == "disagg" else ["c.received", "c.launched", "c.finished"])
print(f"{mode}: request " + " ".join(keys) + " ttft (ms after the send)")
for i, (rid, (t0, ttft)) in enumerate(zip(sorted(events, key=lambda r: min(events[r].values())), sent)):
    e = events[rid]
    print(f"{mode} {i:3d} " + " ".join(f"{(e[k] - t0) * 1e3:7.2f}" if k in e else "      -" for k in keys)
          + f" {ttft * 1e3:7.2f}")
