"""Abuse cases on the real engine: the sandbox contains each one, and the host and the
other sandboxes stay healthy."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.task import Limits

pytestmark = pytest.mark.docker

TIGHT = SandboxOptions(limits=Limits(cpus=1, memory_mb=256, pids=64, workspace_mb=32, tmp_mb=16,
                                     command_timeout_s=20))


@pytest.fixture
def sandbox(docker_client, task_image):
    with Sandbox.start(docker_client, task_image, TIGHT) as sb:
        yield sb


@pytest.fixture
def bystander(docker_client, task_image):
    """A second sandbox that must keep working while the first one misbehaves."""
    with Sandbox.start(docker_client, task_image) as sb:
        yield sb


def healthy(sb: Sandbox) -> bool:
    res = sb.exec("echo alive && ls inventory | head -1", timeout_s=20)
    return res.exit_code == 0 and res.text().startswith("alive")


class _Listener:
    """A TCP server on the host that counts connections."""

    def __init__(self, host: str = "0.0.0.0"):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _connect_cmd(host: str, port: int) -> str:
    return (f"python3 -c \"import socket; s=socket.create_connection(('{host}', {port}), timeout=3); "
            f"print('connected')\"")


def test_network_egress_is_refused(sandbox, docker_client):
    listener = _Listener()
    try:
        gateway = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Gateway"]
        for host in ("127.0.0.1", gateway, "1.1.1.1"):
            res = sandbox.exec(_connect_cmd(host, listener.port if host != "1.1.1.1" else 53), timeout_s=15)
            assert res.exit_code != 0 and "connected" not in res.text(), host
        dns = sandbox.exec("python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"", timeout_s=15)
        assert dns.exit_code != 0
        assert listener.connections == 0
        interfaces = sandbox.exec("cat /proc/net/dev").text()
        assert "eth0" not in interfaces  # only loopback exists
        # The host side is unaffected: the listener still accepts from the host.
        socket.create_connection(("127.0.0.1", listener.port), timeout=3).close()
    finally:
        listener.close()


def test_writes_outside_the_workspace_fail(sandbox):
    for path in ("/etc/passwd", "/usr/bin/evil", "/opt/envforge/task/workspace/x", "/root/x", "/x",
                 "/run/envforge-bin/bash", "/run/envforge-agent/x"):
        res = sandbox.exec(f"echo pwned > {path}")
        assert res.exit_code != 0, path
    assert sandbox.exec("echo fine > /workspace/ok && echo fine > /tmp/ok").exit_code == 0


def test_fork_bomb_is_stopped_by_the_process_limit(sandbox, bystander):
    # The shell itself spins on builtins for a few seconds so that the orphaned forks, which
    # share its stderr, have time to hit the limit before the command's output is collected
    # (the agent returns as soon as the shell exits, background jobs or not).
    res = sandbox.exec("bomb() { bomb | bomb & }; bomb; SECONDS=0; while (( SECONDS < 4 )); do :; done",
                       timeout_s=15)
    assert "Resource temporarily unavailable" in res.err_text()  # forks were refused at the limit
    # Builtins only: while the bomb (still running in the background) holds every pid slot,
    # even `cat` could not start.
    probe = sandbox.exec("read -r m < /sys/fs/cgroup/pids/pids.max; read -r c < /sys/fs/cgroup/pids/pids.current; "
                         "echo $m $c")
    limit, current = probe.text().split()
    assert limit == "64" and int(current) <= 64
    # A command that needs a new process now fails as a command, not as an infrastructure fault.
    for _ in range(3):
        sandbox.exec("/bin/true", timeout_s=5)  # would raise InfraError if misclassified
    assert not sandbox.tainted
    assert healthy(bystander)
    sandbox.reset()
    assert healthy(sandbox)
    count = int(sandbox.exec("ps -e --no-headers | wc -l").text())
    assert count < 10


def test_memory_hog_is_oom_killed_and_reported(sandbox, bystander):
    res = sandbox.exec("python3 -c \"x = bytearray(600 * 1024 * 1024); print('allocated')\"", timeout_s=60)
    assert res.oom_killed and res.exit_code == 137 and "allocated" not in res.text()
    assert sandbox.tainted == "oom"  # a pool would not reuse it
    assert healthy(bystander)
    assert healthy(sandbox)


def test_filling_the_disk_stops_at_the_quota(sandbox):
    res = sandbox.exec("dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; du -m /workspace/big | cut -f1",
                       timeout_s=60)
    assert "No space left on device" in res.text()
    assert int(res.text().strip().splitlines()[-1]) <= 32
    tmp = sandbox.exec("dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1", timeout_s=60)
    assert "No space left on device" in tmp.text()
    assert not sandbox.tainted and healthy(sandbox)


def test_infinite_loop_is_killed_at_its_timeout_and_reset_recovers(sandbox):
    res = sandbox.exec("while :; do :; done", timeout_s=2)
    assert res.timed_out and 1.9 <= res.duration_s < 10
    spawner = sandbox.exec("(while :; do :; done) & (sleep 1000) & echo started", timeout_s=5)
    assert "started" in spawner.text()
    sandbox.reset()
    ps = sandbox.exec("ps -u sandbox -o args= | grep -v -e '_go' -e '^ps' -e 'grep'").text()
    assert ps.strip() == ""
    assert healthy(sandbox)


def test_privileged_operations_are_refused(sandbox):
    assert sandbox.exec("id -u").text().strip() == "1000"
    assert sandbox.exec("id -u; id -G").text().split() == ["1000", "1000"]
    assert sandbox.exec("mkdir -p /tmp/m && mount -t tmpfs none /tmp/m").exit_code != 0
    raw = sandbox.exec("python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)\"")
    assert raw.exit_code != 0 and "PermissionError" in raw.err_text()
    setuid = sandbox.exec("python3 -c \"import os; os.setuid(0)\"")
    assert setuid.exit_code != 0 and "PermissionError" in setuid.err_text()
    assert sandbox.exec("find / -xdev -perm /6000 -type f 2>/dev/null").text().strip() == ""
    caps = sandbox.exec("grep -E '^Cap(Eff|Prm|Inh|Amb)' /proc/self/status").text().split()
    assert set(caps[1::2]) == {"0000000000000000"}
    assert "NoNewPrivs:\t1" in sandbox.exec("cat /proc/self/status").text()
    assert sandbox.exec("test -S /var/run/docker.sock || test -S /run/docker.sock").exit_code != 0


def test_host_environment_does_not_leak(sandbox):
    os.environ["ENVFORGE_SECRET_MARKER"] = "do-not-leak"
    try:
        with Sandbox.start(sandbox.client, sandbox.image) as fresh:
            env = fresh.exec("env").text()
    finally:
        del os.environ["ENVFORGE_SECRET_MARKER"]
    assert "do-not-leak" not in env and "DOCKER" not in env
    names = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    assert names <= {"HOME", "PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PWD", "SHLVL", "_",
                     "OLDPWD"}


def test_the_agent_is_out_of_the_sandbox_users_reach(sandbox):
    """Commands cannot signal the agent, nor read the waiting shells' pipes (no forged results)."""
    agent_pid = sandbox.exec("pgrep -u root -x python3 | head -1").text().strip()
    assert agent_pid
    assert sandbox.exec(f"kill -9 {agent_pid}").exit_code != 0
    waiting = sandbox.exec("pgrep -u sandbox -f _go | head -1").text().strip()
    assert waiting
    assert sandbox.exec(f"ls /proc/{waiting}/fd").exit_code != 0  # non-dumpable: no fd access
    assert sandbox.exec(f"cat /proc/{waiting}/mem").exit_code != 0
    assert sandbox.agent_alive and healthy(sandbox)


def test_allowlisted_network_reaches_only_the_allowed_endpoint(docker_client, task_image):
    from envforge.sandbox.network import ALLOWLIST_NETWORK, CHAIN, _iptables, ensure_allowlist_network
    from envforge.task import NetworkPolicy

    ensure_allowlist_network(docker_client)
    gateway = docker_client.networks.get(ALLOWLIST_NETWORK).attrs["IPAM"]["Config"][0]["Gateway"]
    allowed, blocked = _Listener(gateway), _Listener(gateway)
    try:
        opts = SandboxOptions(network=NetworkPolicy(mode="allowlist", allow=[f"{gateway}:{allowed.port}"]))
        with Sandbox.start(docker_client, task_image, opts) as sb:
            ok = sb.exec(_connect_cmd(gateway, allowed.port), timeout_s=15)
            assert ok.exit_code == 0 and "connected" in ok.text(), ok.err_text()
            denied = sb.exec(_connect_cmd(gateway, blocked.port), timeout_s=15)
            assert denied.exit_code != 0
            assert sb.exec(_connect_cmd("1.1.1.1", 53), timeout_s=15).exit_code != 0
            ip = sb._network.source_ip
            assert ip in _iptables("-S", CHAIN).stdout
        assert allowed.connections == 1 and blocked.connections == 0
        assert ip not in _iptables("-S", CHAIN).stdout  # rules are removed with the sandbox
    finally:
        allowed.close()
        blocked.close()


def test_killing_the_waiting_shells_does_not_take_the_agent_down(sandbox):
    sandbox.exec("kill -9 -1; pkill -9 bash; true")
    for _ in range(3):
        assert sandbox.exec("echo still").text() == "still\n"
    assert sandbox.agent_alive and not sandbox.tainted
    stopped = sandbox.exec('for p in $(pgrep -f _go); do [ "$p" = "$$" ] || kill -STOP "$p"; done; true')
    assert stopped.exit_code == 0
    sandbox.reset()  # stopped spares are discarded, not reused
    assert sandbox.exec("echo fresh", timeout_s=10).text() == "fresh\n"


def test_streamed_output_stops_at_the_cap(docker_client, task_image):
    with Sandbox.start(docker_client, task_image, SandboxOptions(output_cap=10_000)) as sb:
        seen = []
        res = sb.exec("head -c 5000000 /dev/zero", on_output=lambda s, d: seen.append(len(d)))
        assert sum(seen) <= 10_000 and len(res.stdout) == 10_000 and res.stdout_truncated


def _new_files_diff(files: dict[str, str]) -> str:
    out = []
    for path, text in files.items():
        lines = text.splitlines()
        out += [f"diff --git a/{path} b/{path}", "new file mode 100644", "--- /dev/null", f"+++ b/{path}",
                f"@@ -0,0 +1,{len(lines)} @@", *("+" + line for line in lines)]
    return "\n".join(out) + "\n"


# What a policy leaves in the work tree instead of a fix: a pytest plugin that passes every test
# without running it, registered as a distribution on sys.path (what `pip install --target .` writes),
# so pytest's autoload would find its pytest11 entry point.
PASS_EVERYTHING = _new_files_diff({
    "evilpass.py": "import pytest\n\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_pyfunc_call(pyfuncitem):\n"
                   "    return True\n",
    "evilpass-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evilpass\nVersion: 1.0\n",
    "evilpass-1.0.dist-info/entry_points.txt": "[pytest11]\nevilpass = evilpass\n",
})


def test_a_plugin_the_policy_writes_is_never_loaded(docker_client, task_image, grader):
    """Grading loads exactly the task's recorded plugins with -p and keeps autoload off: a plugin
    the policy installs into the work tree is not loaded, although pytest's autoload would load it.
    The task protects only its tests, so the plugin's dist-info reaches the graded copy (by default
    `*.dist-info/**` is a protected path too) and autoload being off is what stops it."""
    from envforge.sources.specs import load_spec_file

    from tests.conftest import BUNDLED_SPECS

    task = load_spec_file(BUNDLED_SPECS / "inventory-median-even" / "task.yaml")
    tests = task.spec.verification.tests.model_copy(update={"plugins": ["pytester"]})
    task = task.model_copy(update={"spec": task.spec.model_copy(update={
        "verification": task.spec.verification.model_copy(update={"tests": tests, "protected_paths": ["tests/**"]})})})
    with Sandbox.start(docker_client, task_image) as sb:  # the control: with autoload, the plugin passes all
        sb.apply_patch(PASS_EVERYTHING)
        res = sb.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout_s=120)
        assert res.exit_code == 0 and " passed" in res.text() and "failed" not in res.text(), res.text()
    result = grader.grade(task, task_image, PASS_EVERYTHING)
    assert not result.resolved
    assert result.tests["tests/test_stats.py::test_median_even_length"] == "failed"
    assert grader.grade(task, task_image, (BUNDLED_SPECS / "inventory-median-even" / "solution.patch").read_text()
                        ).resolved  # the recorded plugin itself loads
