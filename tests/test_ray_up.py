"""`ray up deploy/onprem.yaml` for real, on hosts made of network namespaces on this machine (tests/netns_hosts.py):
every node joins with its pd_* resources, `pdcluster serve` runs on the head as docs/deploy.md says, clients
outside the cluster are served with the token, prefill and decode run on their hosts over the host KV transport,
decode scales down and up, a decode host dies mid-stream and a replacement host's worker comes in through
`pdcluster scale`, and the documented teardown leaves no Ray or pdcluster process, namespace or bridge.

Four hosts: h0 the head (pd_router), h1 prefill (pd_prefill: 1), h2 and h3 decode (pd_decode: 1 each). The
test fills deploy/onprem.yaml's EDIT and PLACEHOLDER lines and nothing else. Each phase is printed with its
time (CI's log shows them). Needs root, iproute2, util-linux, openssh-server, rsync and tmux
(`make host-tools`); skips with the reason otherwise.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from router.client import AsyncClient, Client, ServerError
from tests import netns_hosts
from tests.cluster_harness import offline_token_ids
from tests.netns_hosts import Host, Hosts, leftovers, make_hosts, provision_python

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4, 5,"]
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
LONG = dict(max_tokens=400, temperature=0.0, ignore_eos=True)  # still streaming when the host dies
PIP_PLACEHOLDER = '"pdcluster[gpu] @ git+https://github.com/EXAMPLE-ORG/pdcluster.git@main"'

pytestmark = pytest.mark.slow


def docs_commands() -> dict[str, str]:
    """The commands of docs/deploy.md's on-premise recipe this test runs, by what they do."""
    text = (ROOT / "docs" / "deploy.md").read_text().replace("\\\n", " ")
    recipe = text[text.index("## The tested recipe"):]
    recipe = recipe[:recipe.index("\n## ", 1)]
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in recipe.splitlines() if line.startswith("ray ")]
    lines = [re.sub(r"\s+", " ", line) for line in lines]
    find = {"up": "ray up deploy/onprem.yaml -y", "token": "secrets.token_urlsafe", "token_down": "ray rsync-down",
            "serve": "pdcluster serve", "stop_serve": "tmux send-keys C-c", "stop_workers": "ray get-worker-ips",
            "down": "ray down"}
    found = {name: [line for line in lines if needle in line] for name, needle in find.items()}
    missing = [find[name] for name, hits in found.items() if not hits]
    assert not missing, f"docs/deploy.md's tested recipe has no `ray` line with {missing}"
    return {name: hits[0] for name, hits in found.items()}


def fill(text: str, hosts: Hosts, model: Path, workers: list[Host]) -> str:
    """deploy/onprem.yaml with its EDIT and PLACEHOLDER lines filled: `hosts`' first host is the head, its
    second the prefill host, `workers` the worker_ips; nothing else changes."""
    head, prefill, *_ = hosts.hosts
    workers = "".join(f"    - {h.ip}\n" for h in workers)
    swaps = [
        (r"head_ip: 10\.0\.0\.10", f"head_ip: {head.ip}"),
        (r"(worker_ips:[^\n]*\n)(    - [0-9.]+\n)+", lambda m: m.group(1) + workers),
        (r"ssh_user: ubuntu", "ssh_user: root"),
        (r"ssh_private_key: ~/\.ssh/id_ed25519", f"ssh_private_key: {hosts.key}"),
        (r"~/models/model: \./models/model", f"~/models/model: {model}"),
        (re.escape(PIP_PLACEHOLDER), f"--no-deps --no-build-isolation -e {ROOT}"),  # no index inside the hosts
        (r'PREFILL_HOSTS="10\.0\.0\.11 10\.0\.0\.12"', f'PREFILL_HOSTS="{prefill.ip}"'),
        (r'CPU_UNITS=""', 'CPU_UNITS="1"'),
    ]
    for pattern, new in swaps:
        text, count = re.subn(pattern, new, text)
        assert count == 1, f"deploy/onprem.yaml: {pattern!r} found {count} times"
    return text


class Phases:
    """Prints each phase with the seconds since the start (to the terminal, past pytest's capture)."""

    def __init__(self, capsys):
        self.capsys, self.start, self.lines = capsys, time.monotonic(), []

    def __call__(self, what: str) -> None:
        line = f"[ray up test {time.monotonic() - self.start:6.1f} s] {what}"
        self.lines.append(line)
        with self.capsys.disabled():
            print(line, flush=True)


class Deployment:
    """The hosts, the filled config and the `ray` CLI of this machine (the one outside the cluster)."""

    def __init__(self, hosts: Hosts, work: Path, config: Path):
        self.hosts, self.work, self.config = hosts, work, config
        tmp = work / "cli-tmp"
        tmp.mkdir(exist_ok=True)
        # RAY_TMPDIR: the local provider's cluster state file stays in this test's folder.
        self.env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
                    "RAY_TMPDIR": str(tmp), "TMPDIR": str(tmp)}

    @property
    def head(self) -> Host:
        return self.hosts.hosts[0]

    def ray(self, line: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """A docs line (`ray ... deploy/onprem.yaml ...`) run against the filled config."""
        args = [str(self.config) if a == "deploy/onprem.yaml" else a for a in shlex.split(line)]
        done = subprocess.run(args, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout)
        with open(self.work / "ray-cli.log", "a") as f:
            f.write(f"$ {line}\n{done.stdout}{done.stderr}\n")
        if check:
            assert done.returncode == 0, f"{line}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}"
        return done

    def on_head(self, command: str, timeout: float = 120) -> str:
        """`command` on the head through ssh, in its login shell (the env ~/.bashrc activates)."""
        done = self.hosts.ssh(self.head, f"bash -lc {shlex.quote(command)}", timeout=timeout)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout

    def nodes(self, count: int, timeout: float) -> list[dict]:
        """Ray's live nodes, once `count` are alive (asked on the head, as a driver there would)."""
        script = ("import json, time, ray\n"
                  "ray.init(address='auto', logging_level='ERROR')\n"
                  f"deadline = time.time() + {timeout}\n"
                  "while True:\n"
                  "    alive = [n for n in ray.nodes() if n['Alive']]\n"
                  f"    if len(alive) >= {count} or time.time() > deadline: break\n"
                  "    time.sleep(1)\n"
                  "print('NODES ' + json.dumps([{k: n[k] for k in ('NodeID', 'NodeManagerAddress', 'Resources')} "
                  "for n in alive]))\n")
        out = self.on_head(f"python -c {shlex.quote(script)}", timeout=timeout + 60)
        # Ray streams its own events to a driver's stdout (the autoscaler's "Resized to 8 CPUs." came after the list
        # once), so the list is the line that says it is.
        return json.loads(next(line for line in out.splitlines() if line.startswith("NODES "))[len("NODES "):])

    def serve_output(self) -> str:
        return self.ray("ray exec deploy/onprem.yaml 'tmux capture-pane -p -S -'").stdout

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV / "bin" / "pdcluster"), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=self.work)


@pytest.fixture(scope="module")
def can_make_hosts() -> None:
    reason = netns_hosts.missing()
    if reason:
        pytest.skip(f"cannot make hosts here: {reason}")


@pytest.fixture(scope="module")
def expected(tiny_qwen3_dir):
    return offline_token_ids(tiny_qwen3_dir, PROMPTS, {"short": GREEDY, "long": LONG})


def test_ray_up_serve_scale_lose_a_host_and_tear_down(can_make_hosts, tiny_qwen3_dir, expected, tmp_path, capsys):
    phase = Phases(capsys)
    commands = docs_commands()
    with make_hosts(4, tmp_path) as hosts:
        phase(f"hosts made: {', '.join(f'{h.name} {h.ip}' for h in hosts.hosts)}")
        provision_python(hosts.hosts, VENV)  # the hosts' image: Python with torch and ray; `ray up` installs pdcluster
        config = tmp_path / "onprem.yaml"
        config.write_text(fill((ROOT / "deploy" / "onprem.yaml").read_text(), hosts, tiny_qwen3_dir, hosts.hosts[1:]))
        run = Deployment(hosts, tmp_path, config)
        run.model = tiny_qwen3_dir
        try:
            up_and_serve(run, phase, commands, expected)
            scale_and_lose_a_host(run, phase, commands, expected, tmp_path)
            tear_down(run, phase, commands)
        finally:
            with capsys.disabled():
                print(f"ray up test: the ray CLI's log is {tmp_path / 'ray-cli.log'}", flush=True)
    assert leftovers(hosts) == []
    phase("hosts gone: no namespace, bridge or process left")


def up_and_serve(run: Deployment, phase: Phases, commands: dict[str, str], expected) -> None:
    start = time.monotonic()
    run.ray(commands["up"], timeout=600)
    phase(f"ray up returned after {time.monotonic() - start:.1f} s")
    nodes = run.nodes(4, timeout=240)
    by_ip = {n["NodeManagerAddress"]: n for n in nodes}
    h0, h1, h2, h3 = run.hosts.hosts
    # Every host joined (autoscaler v1: with v2 the workers past the first never did), each with its kind.
    assert sorted(by_ip) == sorted(h.ip for h in run.hosts.hosts), nodes
    assert by_ip[h0.ip]["Resources"].get("pd_router") == 1 and "GPU" not in by_ip[h0.ip]["Resources"]
    assert by_ip[h1.ip]["Resources"].get("pd_prefill") == 1 and "pd_decode" not in by_ip[h1.ip]["Resources"]
    for h in (h2, h3):
        assert by_ip[h.ip]["Resources"].get("pd_decode") == 1 and "pd_prefill" not in by_ip[h.ip]["Resources"]
    run.node_ids = {h.name: by_ip[h.ip]["NodeID"] for h in run.hosts.hosts}
    run.joined_at = time.monotonic()
    phase(f"nodes joined {run.joined_at - start:.1f} s after ray up started: "
          + ", ".join(f"{h.name} {sorted(k for k in by_ip[h.ip]['Resources'] if k.startswith('pd_'))}"
                      for h in run.hosts.hosts))

    run.ray(commands["token"])
    run.ray(commands["token_down"])
    run.token = (run.work / "pd-token").read_text().strip()
    serve = (commands["serve"].replace("--device cuda", "--device cpu")
             .replace("--prefill-workers 4", "--prefill-workers 1").replace("--decode-workers 4", "--decode-workers 2"))
    serve = serve[:-1] + " --kv-cache-memory 64MiB --worker-restarts 0'"  # restarts: a lost host's worker stays gone
    # Without --worker-host the workers on the other hosts could never reach the router: refused, in one line.
    unreachable = re.sub(r" --worker-host \S+", "", serve).replace(" --tmux", "")
    refused = run.ray(unreachable, check=False)
    assert refused.returncode != 0
    assert re.search(r"pdcluster: error: worker_host: 127\.0\.0\.1 is out of reach of workers on the other nodes "
                     rf"of this Ray cluster \({re.escape(h1.ip)}, {re.escape(h2.ip)}, {re.escape(h3.ip)}\)",
                     refused.stdout + refused.stderr), (refused.stdout + refused.stderr)[-2000:]
    phase("serve without --worker-host refused: " + next(
        line for line in (refused.stdout + refused.stderr).splitlines() if "pdcluster: error" in line).strip())

    run.ray(serve)
    run.address = f"tcp://{h0.ip}:5555"
    with Client(run.address, auth_token=run.token, timeout=60) as c:
        c.wait_ready(timeout=300)
        phase("serve ready")
        first = c.generate(PROMPTS[0], **{**GREEDY, "max_tokens": 1})
        assert first.token_ids == expected["short"][0][:1]
        phase(f"first token {time.monotonic() - start:.1f} s after ray up started "
              f"({time.monotonic() - run.joined_at:.1f} s after the nodes joined)")
        got = [c.generate(p, **GREEDY).token_ids for p in PROMPTS]
        assert got == expected["short"]
        stats = c.stats()
    nodes_of = {w.worker_id: w.node_id for w in stats.workers}
    assert nodes_of["p0"] == run.node_ids["h1"]
    assert {nodes_of["d0"], nodes_of["d1"]} == {run.node_ids["h2"], run.node_ids["h3"]}
    host_of = {v: k for k, v in run.node_ids.items()}
    # And seen from the hosts themselves: each worker's process runs on its host, none on the head.
    actors = {h.name: sum("WorkerActor" in p for p in h.processes()) for h in run.hosts.hosts}
    assert actors == {"h0": 0, "h1": 1, "h2": 1, "h3": 1}, actors
    phase("placement: " + ", ".join(f"{w} on {host_of[n]}" for w, n in sorted(nodes_of.items()))
          + f" (worker processes per host: {actors})")
    log = run.serve_output()
    transports = sorted(set(re.findall(r"KV transport (p\d+ -> d\d+): (\w+)", log)))
    assert transports and all(t == "host" for _, t in transports), log[-3000:]  # CPU workers on two nodes
    phase("transport: " + ", ".join(f"{pair} {t}" for pair, t in transports))


def scale(run: Deployment, *flags: str) -> dict:
    done = run.cli("scale", "--address", run.address, "--auth-token-file", str(run.work / "pd-token"), *flags,
                   "--timeout", "600")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def stats(run: Deployment):
    with Client(run.address, auth_token=run.token, timeout=30) as c:
        return c.stats()


def scale_and_lose_a_host(run: Deployment, phase: Phases, commands, expected, work: Path) -> None:
    host_of = {v: k for k, v in run.node_ids.items()}
    removed = scale(run, "--decode", "-1")["workers"]
    assert len(removed) == 1
    added = scale(run, "--decode", "+1")["workers"]
    assert added == ["d2"]
    now = {w.worker_id: w.node_id for w in stats(run).workers}
    assert sorted(now) == sorted({"p0", "d0", "d1", "d2"} - set(removed))
    assert {now[w] for w in now if w.startswith("d")} == {run.node_ids["h2"], run.node_ids["h3"]}
    phase(f"scaled decode -1 ({removed[0]} removed) and +1 (d2 on {host_of[now['d2']]})")

    # The fault: h3, with one decode worker, dies whole (its PID 1 and so every process, at once) mid-stream.
    victim = next(w for w, n in now.items() if n == run.node_ids["h3"])
    survivor = next(w for w, n in now.items() if w.startswith("d") and n == run.node_ids["h2"])
    done = threading.Event()
    outcomes: list[tuple[str, object]] = []
    streaming: set[int] = set()

    async def client_loop(i: int) -> None:
        async with AsyncClient(run.address, auth_token=run.token, timeout=300) as c:
            while not done.is_set():
                k = i % len(PROMPTS)
                try:
                    stream = c.stream(PROMPTS[k], **LONG)
                    tokens = []
                    async for delta in stream:
                        tokens += delta.token_ids
                        streaming.add(i)  # this client has seen tokens
                    streaming.discard(i)
                    assert tokens == stream.result.token_ids == expected["long"][k]
                    outcomes.append(("result", k))
                except ServerError as e:
                    streaming.discard(i)
                    outcomes.append(("error", e))
                    await asyncio.sleep(e.retry_after or 0.5)

    async def load_and_kill() -> float:
        clients = [asyncio.create_task(client_loop(i)) for i in range(8)]
        deadline = time.monotonic() + 60
        while True:  # mid-stream: clients have seen tokens, and the victim holds requests
            held = (await asyncio.to_thread(stats, run)).workers
            on_victim = next(w.running_requests + w.queued_requests for w in held if w.worker_id == victim)
            if (len(streaming) >= 4 and on_victim > 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert on_victim > 0, f"no request on {victim}: the fault would test nothing"
        killed = time.monotonic()
        run.hosts.hosts[3].kill()
        phase(f"h3 killed (its PID 1: every process on it) with {len(streaming)} of 8 clients mid-stream and "
              f"{on_victim} requests on {victim} there")
        noticed = None
        while noticed is None:
            workers = {w.worker_id: w for w in (await asyncio.to_thread(stats, run)).workers}
            if not workers[victim].alive:
                noticed = time.monotonic() - killed
            assert time.monotonic() - killed < 30, "the router still counts the dead host's worker alive"
            await asyncio.sleep(0.2)
        await asyncio.sleep(6.0)  # requests placed after the death all go to the survivor
        done.set()
        await asyncio.gather(*clients)
        return noticed

    noticed = asyncio.run(load_and_kill())
    errors = [e for kind, e in outcomes if kind == "error"]
    assert sum(kind == "result" for kind, _ in outcomes) >= 8
    assert all(e.code in ("aborted", "unavailable") and e.message for e in errors), errors
    phase(f"router stopped placing on {victim} {noticed:.1f} s after the kill; {len(outcomes)} requests answered: "
          f"{len(outcomes) - len(errors)} results, {len(errors)} clear errors "
          f"({', '.join(sorted({e.code for e in errors})) or 'none'})")
    assert noticed < 15, f"the router took {noticed:.1f} s to stop placing on the dead host's worker"
    clean = wait_clean(run)
    assert clean.requests_in_flight == 0 and clean.queued_requests == 0
    assert all(w.kv_blocks_free == w.kv_blocks_total for w in clean.workers if w.alive)
    phase("nothing leaked: no request in flight or queued, every live worker's KV blocks free")

    # A replacement machine at the dead host's address, provisioned like the others (the image's Python, then
    # what file_mounts and setup_commands put there): the head's autoscaler restarts Ray there (its recovery of
    # a node without heartbeats runs worker_start_ray_commands), and `pdcluster scale` puts a worker on it.
    dead = run.hosts.hosts[3]
    netns_hosts.remove_host(run.hosts, 3)
    replacement = netns_hosts.add_another(run.hosts, work, ip=dead.ip, prepare=lambda host: set_up(run, host))
    phase(f"replacement host {replacement.name} up at h3's address {replacement.ip}, set up like the others")
    added = scale(run, "--decode", "+1")["workers"]
    assert added == ["d3"]
    by_ip = {n["NodeManagerAddress"]: n for n in run.nodes(4, timeout=60)}
    new_h3 = by_ip[replacement.ip]["NodeID"]
    assert new_h3 != run.node_ids["h3"] and by_ip[replacement.ip]["Resources"].get("pd_decode") == 1
    workers = {w.worker_id: w for w in stats(run).workers}
    assert workers["d3"].node_id == new_h3 and workers["d3"].alive and workers[survivor].alive
    phase(f"pdcluster scale --decode +1: d3 on the replacement {replacement.name} (node {new_h3[:12]})")

    with Client(run.address, auth_token=run.token, timeout=120) as c:
        got = [c.generate(p, **GREEDY).token_ids for p in PROMPTS * 2]
    assert got == expected["short"] * 2
    assert re.search(r"KV transport p0 -> d3: host", run.serve_output())
    phase("requests served with d3 (p0 -> d3: host)")
    run.node_ids[replacement.name] = new_h3


def set_up(run: Deployment, host: Host) -> None:
    """A new host as `ray up` left the first ones: the image's Python, then what file_mounts and setup_commands put
    there (done before its sshd answers: the head's autoscaler must not find it half set up)."""
    provision_python([host], VENV)
    filled = yaml.safe_load(run.config.read_text())
    for remote, local in filled["file_mounts"].items():
        shutil.copytree(local, host.home / remote.removeprefix("~/"))
    for command in filled["setup_commands"]:
        done = host.run(command, login=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"


def wait_clean(run: Deployment, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        s = stats(run)
        if (s.requests_in_flight == 0 and s.queued_requests == 0
                and all(w.kv_blocks_free == w.kv_blocks_total for w in s.workers if w.alive)) \
                or time.monotonic() > deadline:
            return s
        time.sleep(0.5)


def tear_down(run: Deployment, phase: Phases, commands: dict[str, str]) -> None:
    start = time.monotonic()
    for name in ("stop_serve", "stop_workers", "down"):
        run.ray(commands[name])
        phase(f"ran: {commands[name][:90]}...")
    deadline = time.monotonic() + 60
    while True:
        left = {h.name: h.processes() for h in run.hosts.hosts}
        left = {name: procs for name, procs in left.items() if procs}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    # `ray down` alone stopped Ray on the head only: the workers' raylets and agents ran on.
    assert not left, f"processes left after the documented teardown: {left}"
    phase(f"torn down as documented in {time.monotonic() - start:.1f} s: no Ray or pdcluster process on any host")


def test_where_hosts_cannot_be_made_the_reason_is_given(monkeypatch):
    """Not root, or a tool missing: `missing()` names it (the ray up test skips with it instead of failing)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns_hosts.missing() == "needs root (network namespaces, bridges, mounts)"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tmux" else f"/usr/bin/{tool}")
    monkeypatch.setattr(os, "access", lambda path, mode: True)  # sshd there, whatever this host has
    assert netns_hosts.missing().startswith("missing tmux (Debian: apt-get install")
    monkeypatch.setattr(os, "access", lambda path, mode: path != netns_hosts.SSHD)
    assert netns_hosts.missing().startswith("missing tmux, sshd (Debian: apt-get install")
