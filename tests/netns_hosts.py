"""Hosts made on this machine for `ray up`: network namespaces on a bridge, each running sshd as PID 1.

Each host has its own address on a private /24 (the bridge, in this machine's namespace, holds .1), a
default route into a dead-end veth pair inside its namespace (Ray picks its node address by routing
outward: nothing leaves), its own PID, UTS and mount namespaces (`ray stop` on one host sees only its own
processes; killing PID 1 kills everything on the host), and a private home, /tmp (so /tmp/ray) and
/dev/shm. Root logs in with a key only. The rest of the filesystem (/work, /usr) is shared.

`make_hosts` always tears everything down (processes, namespaces, bridge), also when the body fails;
`missing()` says why hosts cannot be made here (the tests skip with that reason).
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parent.parent  # the checkout the hosts install pdcluster from
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", "rsync", "tmux")

SSHD_CONFIG = """\
ListenAddress {ip}
HostKey /root/.sshd/host_ed25519
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile .ssh/authorized_keys
MaxStartups 100
MaxSessions 100
LogLevel ERROR
"""


def missing() -> str | None:
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges, mounts)"
    absent = [t for t in TOOLS if shutil.which(t) is None] + ([] if os.access(SSHD, os.X_OK) else ["sshd"])
    if absent:
        return f"missing {', '.join(absent)} (Debian: apt-get install iproute2 util-linux openssh-server rsync tmux)"
    probe = f"pdprobe{os.getpid()}"
    made = subprocess.run(["ip", "link", "add", probe, "type", "bridge"], capture_output=True, text=True)
    if made.returncode:
        return f"cannot make a bridge: {made.stderr.strip()}"
    subprocess.run(["ip", "link", "del", probe], capture_output=True)
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    made = subprocess.run(["unshare", "--pid", "--uts", "--mount", "--fork", "--mount-proc", "true"],
                          capture_output=True, text=True)
    if made.returncode:
        return f"cannot make PID, UTS and mount namespaces: {made.stderr.strip()}"
    return None


def sh(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    name: str
    netns: str
    ip: str
    root: Path          # its private home, /tmp and sshd files live under here
    proc: subprocess.Popen | None = None  # `ip netns exec ... unshare ...`; its child is the host's PID 1

    @property
    def home(self) -> Path:
        return self.root / "home"

    def init_pid(self) -> int | None:
        """The host's PID 1 (sshd), as this machine numbers it."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        kids = sh("pgrep", "-P", str(self.proc.pid), check=False).stdout.split()
        return int(kids[0]) if kids else None

    def pids(self) -> list[int]:
        """Every process on the host but its PID 1."""
        init = self.init_pid()
        if init is None:
            return []
        ns = os.readlink(f"/proc/{init}/ns/pid")
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != init:
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                        found.append(int(entry))
        return found

    def processes(self) -> list[str]:
        """'pid command line' of every process on the host but sshd's own (PID 1 and its session children)."""
        out = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if cmd.strip() and not cmd.startswith("sshd"):
                    out.append(f"{pid} {cmd.strip()}")
        return out

    def run(self, command: str, timeout: float = 120, login: bool = False) -> subprocess.CompletedProcess:
        """`command` through bash on the host, as root (entering its namespaces, not through ssh); `login`: in
        a login shell with a clean environment, as an ssh session would have."""
        init = self.init_pid()
        assert init is not None, f"{self.name} is down"
        shell = (["env", "-i", "HOME=/root", f"PATH={LOGIN_PATH}", "TERM=dumb", "bash", "-lic"] if login
                 else ["bash", "-c"])
        return subprocess.run(["nsenter", "-t", str(init), "-n", "-p", "-m", "-u", "--", *shell, command],
                              capture_output=True, text=True, timeout=timeout)

    def kill(self) -> None:
        """The whole host goes at once: PID 1 dies, the kernel kills everything in its PID namespace."""
        init = self.init_pid()
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


@dataclass
class Hosts:
    hosts: list[Host]
    bridge: str
    gateway: str        # the bridge's address: where this machine's clients come from
    key: Path           # root's private key on every host

    def ssh(self, host: Host, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", *ssh_options(self.key), f"root@{host.ip}", command],
                              capture_output=True, text=True, timeout=timeout)


def ssh_options(key: Path) -> list[str]:
    return ["-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"]


def free_subnet() -> int:
    """X of a 10.213.X.0/24 that no address or route here uses yet."""
    used = sh("ip", "-4", "addr").stdout + sh("ip", "-4", "route").stdout
    for x in random.sample(range(1, 255), 254):
        if f"10.213.{x}." not in used:
            return x
    raise RuntimeError("no free 10.213.X.0/24")


def start_host(host: Host, key_pub: str, host_key: Path, hold: bool = False) -> None:
    """The host's files, then sshd as PID 1 of new PID, UTS and mount namespaces inside its network one. With
    `hold`, PID 1 waits for `release(host)` before it becomes sshd (the host can be set up through `run` first,
    unseen from the network: a machine provisioned before it is put on it)."""
    for sub in ("home/.ssh", "home/.sshd", "tmp", "shm"):
        (host.root / sub).mkdir(parents=True, exist_ok=True)
    (host.home / ".ssh" / "authorized_keys").write_text(key_pub)
    (host.home / ".bashrc").write_text("")
    (host.home / ".profile").write_text('[ -n "$BASH" ] && [ -f ~/.bashrc ] && . ~/.bashrc\n')  # as Debian's root has
    shutil.copy(host_key, host.home / ".sshd" / "host_ed25519")
    os.chmod(host.home / ".sshd" / "host_ed25519", 0o600)
    (host.home / ".sshd" / "sshd_config").write_text(SSHD_CONFIG.format(ip=host.ip))
    os.chmod(host.root / "tmp", 0o1777)
    # The Python this machine's venvs point at may live under /root (pyenv): the host's image has it too.
    keep = [p for p in {sys.base_prefix, sys.prefix} if Path(p).is_relative_to("/root")]
    binds = "".join(f"mkdir -p {host.home}{p[len('/root'):]}; mount --bind -o ro {p} {host.home}{p[len('/root'):]}; "
                    for p in sorted(keep))
    # The checkout and its venv may live under /tmp (CI clones there): seen through the private /tmp all the same,
    # by way of a mount outside it made before /tmp is covered.
    under_tmp = sorted(p for p in {sys.base_prefix, sys.prefix, str(REPO)} if Path(p).is_relative_to("/tmp"))
    stage = f"/run/pdcluster-netns-{host.name}"
    keep_tmp = "".join(f"mkdir -p {stage}/{i}; mount --bind {p} {stage}/{i}; " for i, p in enumerate(under_tmp))
    back_in_tmp = "".join(f"mkdir -p {p}; mount --bind {stage}/{i} {p}; " for i, p in enumerate(under_tmp))
    boot = (f"set -e; hostname {host.name}; mount --make-rprivate /; {binds}{keep_tmp}"
            f"mount --rbind {host.home} /root; mount --bind {host.root / 'tmp'} /tmp; {back_in_tmp}"
            f"mount -t tmpfs -o size=2g tmpfs /dev/shm; mkdir -p /run/sshd; "
            + ("while [ ! -e /root/.sshd/go ]; do sleep 0.2; done; " if hold else "")
            + f"exec {SSHD} -D -e -f /root/.sshd/sshd_config")
    host.proc = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, "unshare", "--pid", "--uts", "--mount", "--fork", "--mount-proc",
         "sh", "-c", boot], stdout=subprocess.DEVNULL, stderr=open(host.root / "sshd.log", "ab"),
        start_new_session=True)


def release(host: Host) -> None:
    (host.home / ".sshd" / "go").touch()


def wait_ssh(hosts: Hosts, timeout: float = 30, only: list[Host] | None = None) -> None:
    deadline = time.monotonic() + timeout
    for host in only or hosts.hosts:
        while True:
            done = hosts.ssh(host, "hostname", timeout=10)
            if done.returncode == 0 and done.stdout.strip() == host.name:
                break
            if time.monotonic() > deadline:
                log = (host.root / "sshd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"no ssh to {host.name} ({host.ip}): {done.stderr.strip()}; sshd log:\n{log}")
            time.sleep(0.2)


def add_host(made: Hosts, i: int, host: Host, hold: bool = False) -> None:
    """Host `i`: its namespace on the bridge (its veth is the bridge's port {tag}v{i}), then its sshd."""
    tag = made.bridge[:-2]
    outside, inside = f"{tag}v{i}", f"{tag}i{i}"
    sh("ip", "netns", "add", host.netns)
    sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", host.netns)
    sh("ip", "link", "set", outside, "master", made.bridge, "up")
    ns = ["ip", "-n", host.netns]
    sh(*ns, "link", "set", inside, "name", "eth0")
    sh(*ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
    sh(*ns, "link", "set", "eth0", "up")
    sh(*ns, "link", "set", "lo", "up")
    # The dead end: a veth pair with nothing behind it; the default route goes in and nowhere.
    sh(*ns, "link", "add", "dead0", "type", "veth", "peer", "name", "dead1")
    sh(*ns, "link", "set", "dead0", "up")
    sh(*ns, "link", "set", "dead1", "up")
    sh(*ns, "route", "add", "default", "dev", "dead0")
    start_host(host, made.key.with_suffix(".pub").read_text(), made.key.parent / "host_ed25519", hold)


def remove_host(made: Hosts, i: int) -> None:
    """Host `i` is gone for good: its processes, its namespace and its port on the bridge (it stays listed, so
    that teardown and `leftovers` still look for it)."""
    made.hosts[i].kill()
    sh("ip", "netns", "del", made.hosts[i].netns, check=False)
    sh("ip", "link", "del", f"{made.bridge[:-2]}v{i}", check=False)


def add_another(made: Hosts, workdir: Path, ip: str | None = None,
                prepare: Callable[[Host], None] | None = None) -> Host:
    """One more host, h{n}, at `ip` (a replacement machine given a dead host's address) or the next address;
    `prepare(host)` sets it up (through `Host.run`) before its sshd answers."""
    i = len(made.hosts)
    tag = made.bridge[:-2]
    new = Host(f"h{i}", f"{tag}h{i}", ip or f"{made.gateway.rsplit('.', 1)[0]}.{10 + i}", workdir / f"h{i}")
    made.hosts.append(new)
    add_host(made, i, new, hold=prepare is not None)
    if prepare is not None:
        deadline = time.monotonic() + 30
        while new.init_pid() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        prepare(new)
        release(new)
    wait_ssh(made, only=[new])
    return new


@contextlib.contextmanager
def make_hosts(count: int, workdir: Path):
    """`count` hosts h0 .. h{count-1} (h0 first: the head); yields Hosts; always tears all of it down."""
    x = free_subnet()
    tag = f"pd{x}"
    bridge = f"{tag}br"
    gateway = f"10.213.{x}.1"
    hosts = [Host(f"h{i}", f"{tag}h{i}", f"10.213.{x}.{10 + i}", workdir / f"h{i}") for i in range(count)]
    made = Hosts(hosts, bridge, gateway, workdir / "id_ed25519")
    # A SIGTERM (a CI job cancelled, a timeout) must still tear the hosts down: raise instead of dying.
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupted)
    try:
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(made.key))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / "host_ed25519"))
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{gateway}/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for i, host in enumerate(hosts):
            add_host(made, i, host)
        wait_ssh(made)
        yield made
    finally:
        teardown(made)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def teardown(made: Hosts) -> None:
    tag = made.bridge[:-2]
    for i, host in enumerate(made.hosts):
        host.kill()
        if host.proc is not None and host.proc.poll() is None:
            host.proc.kill()
            host.proc.wait()
        sh("ip", "netns", "del", host.netns, check=False)
        sh("ip", "link", "del", f"{tag}v{i}", check=False)  # gone with the namespace, unless something held it
    sh("ip", "link", "del", made.bridge, check=False)


def leftovers(made: Hosts) -> list[str]:
    """Namespaces, links and processes of these hosts still here after teardown."""
    left = [n for n in sh("ip", "netns", "list").stdout.split() if n in {h.netns for h in made.hosts}]
    links = sh("ip", "-o", "link").stdout
    tag = made.bridge[:-2]
    left += sorted(set(re.findall(rf" ({re.escape(tag)}(?:br|v\d+))[:@]", links)))
    left += [f"{h.name}: {p}" for h in made.hosts for p in h.processes()]
    return left


def provision_python(hosts: list[Host], venv: Path, env: str = "~/pdcluster-env") -> None:
    """Each host gets `env`: a venv of its own that sees `venv`'s packages (as an image with torch and ray
    installed would) and has the `ray` command; its own setuptools goes so that `venv`'s newer one builds."""
    python = os.path.realpath(venv / "bin" / "python")
    shared = sh(str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                ).stdout.strip()
    ray = "import sys; from ray.scripts.scripts import main; sys.exit(main())"
    script = (f"set -e; {python} -m venv {env}; "
              f"site=$({env}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
              f"echo \"import site; site.addsitedir('{shared}')\" > $site/pdcluster-shared.pth; "
              f"{env}/bin/pip uninstall -q -y setuptools; "
              f"printf '#!%s\\n%s\\n' {env}/bin/python {ray!r} > {env}/bin/ray; chmod +x {env}/bin/ray")
    procs = [(h, subprocess.Popen(["nsenter", "-t", str(h.init_pid()), "-n", "-p", "-m", "-u", "--", "bash", "-c",
                                   script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for h in hosts]
    for host, proc in procs:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode:
            raise RuntimeError(f"{host.name}: making {env} failed: {out}")
