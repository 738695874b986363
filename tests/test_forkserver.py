"""Python commands as forks of a preloaded interpreter (sandbox/forkserver.py), on the real engine:
a fork sees what a fresh interpreter sees, cannot reach its server, and whatever cannot be forked
runs in the shell as before."""

from __future__ import annotations

import json

import pytest

from envforge.sandbox.container import PythonCommand, Sandbox

pytestmark = pytest.mark.docker

RUNNER = "/run/envforge-verifier/runner"
SCRIPT = f"{RUNNER}/probe.py"
ENV = {"PYTHONNOUSERSITE": "1", "PYTHONPATH": RUNNER, "FOO": "it's 'quoted'"}
PROBE = r'''
import json, os, random, resource, signal, sys
status = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
          if k in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}
def is_open(fd):
    try:
        return os.fstat(fd) is not None
    except OSError:  # the descriptor listdir itself used
        return False
fds = [fd for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")) if is_open(fd)]
print(json.dumps({
    "env": dict(os.environ), "cwd": os.getcwd(), "umask": os.umask(0o22), "status": status,
    "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
    "dumpable": __import__("ctypes").CDLL(None).prctl(3, 0, 0, 0, 0),
    "argv": sys.argv, "path": sys.path, "flags": str(sys.flags), "executable": sys.executable,
    "fds": fds, "inheritable": [os.get_inheritable(f) for f in fds],
    "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGTERM, signal.SIGXFSZ)],
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "rlimits": [resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_CORE)],
    "main": [__name__, __file__, repr(__spec__)], "stdout": [sys.stdout.encoding, sys.stdout.line_buffering],
    "leader": os.getsid(0) == os.getpid(), "group": os.getpgid(0) == os.getsid(0), "random": random.random(), "hash": hash("envforge"),
}))
os.write(3, b"report")
'''
CMD = f"python3 -P {SCRIPT} 'a b' --x"
PROGRAM = PythonCommand(SCRIPT, ("a b", "--x"), preload=("pytest",))


def _install(sb: Sandbox, **scripts: str) -> None:
    sb.install_files(RUNNER, {f"{name}.py": text.encode() for name, text in scripts.items()}, mode=0o644)


def test_a_forked_run_sees_what_a_fresh_interpreter_sees(docker_client, task_image):
    with Sandbox.start(docker_client, task_image) as sb:
        _install(sb, probe=PROBE)
        runs = [sb.exec(CMD, env=ENV, report=True, python=p) for p in (None, PROGRAM, PROGRAM, None)]
        assert [r.forked for r in runs] == [False, True, True, False]
        assert all(r.exit_code == 0 and r.report == b"report" for r in runs), [r.err_text() for r in runs]
        fresh, fork, fork2, fresh2 = (json.loads(r.text()) for r in runs)
        # The shell runs the interpreter as its child, in the shell's session; a fork leads its own.
        assert (fresh.pop("leader"), fork.pop("leader")) == (False, True) and fresh["group"]
        assert len({run.pop("random") for run in (fresh, fork, fork2, fresh2)}) == 4  # reseeded in every fork
        # Forks of one server share the string hash seed; fresh interpreters do not.
        assert fork.pop("hash") == fork2["hash"] and fresh.pop("hash") != fresh2["hash"]
        assert fork == fresh
        assert fork["status"]["Uid"].split()[0] == "1000" and fork["status"]["CapEff"] == "0" * 16
        assert fork["env"]["FOO"] == "it's 'quoted'" and fork["argv"][1:] == ["a b", "--x"]


def test_a_forked_run_can_neither_reach_its_server_nor_change_the_next_run(docker_client, task_image):
    attack = r'''
import os, resource, signal, sys
server = os.getppid()
outcomes = []
for what, act in [
    ("kill", lambda: os.kill(server, signal.SIGKILL)),
    ("stop", lambda: os.kill(server, signal.SIGSTOP)),
    ("prlimit", lambda: resource.prlimit(server, resource.RLIMIT_NOFILE, (3, 3))),
    ("environ", lambda: open(f"/proc/{server}/environ").read()),
    ("mem", lambda: open(f"/proc/{server}/mem", "rb").read(1)),
    ("fd", lambda: os.listdir(f"/proc/{server}/fd")),
]:
    try:
        act()
        outcomes.append(f"{what}:done")
    except OSError as exc:
        outcomes.append(f"{what}:{type(exc).__name__}")
sys.modules["json"].dumps = None  # what a run changes in its own interpreter stays in it
print(" ".join(outcomes))
'''
    with Sandbox.start(docker_client, task_image) as sb:
        _install(sb, probe=PROBE, attack=attack)
        hit = sb.exec(f"python3 -P {RUNNER}/attack.py", env=ENV, python=PythonCommand(f"{RUNNER}/attack.py"))
        assert hit.forked and hit.exit_code == 0, hit.err_text()
        assert hit.text().split() == [
            "kill:PermissionError", "stop:PermissionError", "prlimit:PermissionError",
            "environ:PermissionError", "mem:PermissionError", "fd:PermissionError",
        ]
        after = sb.exec(CMD, env=ENV, report=True, python=PROGRAM)
        assert after.forked and after.exit_code == 0 and json.loads(after.text())["argv"][1:] == ["a b", "--x"]


def test_forked_runs_keep_exit_codes_timeouts_and_background_jobs_and_survive_a_reset(docker_client, task_image):
    scripts = {
        "exits": "import sys; sys.exit(int(sys.argv[1]))",
        "raises": "raise ValueError('boom')",
        "hangs": "import time; time.sleep(60)",
        "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        "detaches": "import subprocess; subprocess.Popen(['sleep', '20']); print('started')",
        "writes": "open('/workspace/left-behind', 'w').write('x')",
    }

    def run(name: str, *args: str, timeout: float = 30):
        program = PythonCommand(f"{RUNNER}/{name}.py", args)
        return sb.exec(f"python3 -P {RUNNER}/{name}.py {' '.join(args)}", timeout_s=timeout, env=ENV, python=program)

    with Sandbox.start(docker_client, task_image) as sb:
        _install(sb, **scripts)
        assert run("exits", "3").exit_code == 3 and run("exits", "0").exit_code == 0
        raised = run("raises")
        assert raised.exit_code == 1 and "ValueError: boom" in raised.err_text()
        hung = run("hangs", timeout=1)
        assert hung.forked and hung.timed_out and hung.duration_s < 10
        killed = run("killed")
        assert killed.exit_code == 137 and not killed.timed_out and not killed.oom_killed
        detached = run("detaches")  # a background job holding the pipes does not hold the run open
        assert detached.forked and detached.text() == "started\n" and detached.duration_s < 10
        assert run("writes").forked
        sb.reset()
        assert sb.exec("ls /workspace/left-behind").exit_code != 0
        _install(sb, **scripts)
        again = run("exits", "5")
        assert again.forked and again.exit_code == 5  # the server outlived the reset


@pytest.mark.parametrize(
    "env, why",
    [
        ({**ENV, "PATH": "/workspace/bin:/usr/local/bin:/usr/bin:/bin"}, "a python3 could be planted first on PATH"),
        ({**ENV, "LD_PRELOAD": "/tmp/x.so"}, "the loader reads it before Python starts"),
        ({"PYTHONPATH": RUNNER}, "a user site-packages directory would be looked up in /tmp"),
    ],
)
def test_a_run_a_fork_cannot_stand_in_for_runs_in_the_shell(docker_client, task_image, env, why):
    with Sandbox.start(docker_client, task_image) as sb:
        _install(sb, probe=PROBE)
        res = sb.exec(CMD, env=env, report=True, python=PROGRAM)
        assert not res.forked, why
        assert res.exit_code == 0 and json.loads(res.text())["argv"][1:] == ["a b", "--x"]


def test_a_server_that_cannot_preload_is_not_started_again_and_its_runs_use_the_shell(docker_client, task_image):
    broken = PythonCommand(SCRIPT, ("a b", "--x"), preload=("no_such_module_here",))
    with Sandbox.start(docker_client, task_image) as sb:
        _install(sb, probe=PROBE)
        runs = [sb.exec(CMD, env=ENV, report=True, python=broken) for _ in range(2)]
        assert [(r.forked, r.exit_code, r.report) for r in runs] == [(False, 0, b"report")] * 2
        assert sb.exec(CMD, env=ENV, report=True, python=PROGRAM).forked  # another preload list, another server
