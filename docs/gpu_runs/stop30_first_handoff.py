"""What the first request through each prefill -> decode pair pays over nccl (the link opens on first use): serve
PREFILL + DECODE workers, one GPU each, then send requests one at a time, each prompt 500 tokens, 4 tokens out;
prints each request's TTFT and the server's link-open log lines."""
import random, subprocess, sys, time
from router.client import Client

model, prefill, decode, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
path, port = "/tmp/serve-first-handoff.log", 45123
log = open(path, "w")
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "serve", "--model", model, "--device", "cuda",
                         "--gpus-per-worker", "1", "--mode", "disagg", "--prefill-workers", str(prefill),
                         "--decode-workers", str(decode), "--bind", f"tcp://127.0.0.1:{port}"],
                        stdout=log, stderr=subprocess.STDOUT)
try:
    while "serving on" not in open(path).read():
        assert proc.poll() is None, open(path).read()[-3000:]
        time.sleep(0.1)
    print(f"ready in {time.monotonic() - t0:.1f} s")
    rng = random.Random(1)
    with Client(f"tcp://127.0.0.1:{port}", timeout=120) as c:
        c.wait_ready(60)
        ttft = []
        for i in range(n):
            out = c.generate([rng.randrange(1, 100000) for _ in range(500)], max_tokens=4, ignore_eos=True)
            ttft.append(out.timings.ttft * 1e3)
    print("TTFT ms, in order:", " ".join(f"{x:.1f}" for x in ttft))
    print("\n".join(line.rstrip()[-160:] for line in open(path) if "KV link" in line))
finally:
    proc.send_signal(2)
    proc.wait(60)
