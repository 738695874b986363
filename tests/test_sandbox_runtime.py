"""The sandbox API on the real engine: agent commands, files, diff, snapshot/reset, fallback."""

from __future__ import annotations

import asyncio
import random

import pytest

from envforge.errors import InfraError
from envforge.sandbox.container import INITIAL, Sandbox

pytestmark = pytest.mark.docker

TREE_HASH = ("cd /workspace && find . -mindepth 1 -printf '%p %y %m %s %T@\\n' | sort && "
             "find . -type f -print0 | sort -z | xargs -0 sha256sum")


def test_exec_contract(docker_client, task_image):
    with Sandbox.start(docker_client, task_image) as sb:
        res = sb.exec("echo out; echo err >&2; exit 7")
        assert (res.exit_code, res.stdout, res.stderr) == (7, b"out\n", b"err\n")
        assert not res.timed_out and not res.oom_killed and res.duration_s > 0
        assert sb.exec("pwd", workdir="/tmp").text() == "/tmp\n"
        assert sb.exec("echo $GREETING", env={"GREETING": "it's 'quoted' \"too\""}).text() == "it's 'quoted' \"too\"\n"
        assert sb.exec("cat", stdin=b"\x00binary\xff" * 1000).stdout == b"\x00binary\xff" * 1000
        big = sb.exec("head -c 3000000 /dev/zero")
        assert len(big.stdout) == 1 << 20 and big.stdout_truncated and not big.stderr_truncated
        chunks: list[tuple[str, bytes]] = []
        streamed = sb.exec("for i in 1 2 3; do echo $i; sleep 0.05; done", on_output=lambda s, d: chunks.append((s, d)))
        assert b"".join(d for s, d in chunks if s == "stdout") == streamed.stdout == b"1\n2\n3\n"
        bg = sb.exec("sleep 5 & echo started")  # a background job does not hold the command open
        assert bg.text() == "started\n" and bg.duration_s < 3
        assert sb.exec("if (:").exit_code == 2  # a syntax error is the command's result, not a crash
        assert sb.stats.fallback_execs == 0 and sb.agent_alive


def test_a_commands_output_does_not_depend_on_the_sandboxs_history(docker_client, task_image):
    """The observation of a failing command names no harness file: it used to carry the sourced script's
    path, which counts the sandbox's earlier commands, so a rollout's next prompt depended on which warm
    sandbox it got (and rollouts from the same weights and seeds diverged)."""
    failing = "cd /workspace\nnot-a-command --flag\nif (:"
    with Sandbox.start(docker_client, task_image) as fresh, Sandbox.start(docker_client, task_image) as used:
        for n in range(5):
            used.exec(f"echo {n}")
        a, b = fresh.exec(failing), used.exec(failing)
        assert (a.exit_code, a.stdout, a.stderr) == (b.exit_code, b.stdout, b.stderr)
        assert b"not-a-command: command not found" in a.stderr and b"envforge" not in a.stderr
        assert fresh.exec("exit 3").exit_code == 3 and fresh.exec("echo $__s $__f $ENVFORGE_CMD.").text() == ".\n"


def test_files_and_tamper_proof_diff(docker_client, task_image):
    with Sandbox.start(docker_client, task_image) as sb:
        sb.write_file("/workspace/new/dir/file.txt", "hello\n")
        assert sb.read_file("/workspace/new/dir/file.txt") == b"hello\n"
        with pytest.raises(FileNotFoundError):
            sb.read_file("/workspace/missing")
        sb.put_files("/workspace/many", {f"f{i}.txt": str(i).encode() for i in range(50)})
        assert sb.exec("ls many | wc -l").text().strip() == "50"
        sb.exec("rm tests/test_stock.py && echo '# edit' >> inventory/stats.py")
        # Rewriting the workspace's own git history must not hide or forge anything.
        sb.exec("git add -A && git commit -qm 'hide my changes' && rm -rf .git/logs")
        diff = sb.diff()
        assert "new/dir/file.txt" in diff and "many/f7.txt" in diff
        assert "deleted file mode" in diff and "tests/test_stock.py" in diff
        assert "+# edit" in diff
        sb.exec("rm -rf .git")
        assert sb.diff() == diff


def test_apply_patch_methods(docker_client, task_image):
    with Sandbox.start(docker_client, task_image) as sb:
        sb.exec("echo changed > NOTES_A.md")
        patch = sb.diff()
        sb.reset()
        assert sb.apply_patch(patch) == "git_apply"
        assert sb.read_file("/workspace/NOTES_A.md") == b"changed\n"
        sb.reset()
        # Context shifted by a line: git apply refuses, patch --fuzz applies it.
        shifted = ("--- a/inventory/stats.py\n+++ b/inventory/stats.py\n@@ -1,3 +1,3 @@\n"
                   '-"""Summary statistics used by the reorder report."""\n+"""Patched docstring."""\n'
                   " \n from __future__ import annotations\n")
        sb.exec("sed -i '1i # a new first line' inventory/stats.py")
        assert sb.apply_patch(shifted) in ("git_apply", "patch_fuzz")
        assert "Patched docstring" in sb.read_file("/workspace/inventory/stats.py").decode()


@pytest.mark.parametrize("changed_only", [False, True], ids=["full", "changed-only"])
def test_reset_restores_a_byte_identical_workspace_without_leftovers(docker_client, task_image, changed_only):
    """Both resets: the full one (wipe and copy) and the one after trusted code (only what changed)."""
    with Sandbox.start(docker_client, task_image) as fresh:
        pristine = fresh.exec(TREE_HASH).text()
    rng = random.Random(7)
    with Sandbox.start(docker_client, task_image) as sb:
        for round_ in range(3):
            if changed_only:
                sb.trust_until_reset()
            files = sb.exec("cd /workspace && find . -type f -not -path './.git/*'").text().split()
            for path in rng.sample(files, 3):
                sb.exec(f"echo junk{round_} >> {path}")
            sb.exec(f"rm -f {rng.choice(files)}; mkdir -p deep/er && echo x > deep/er/new && "
                    "chmod 000 deep/er && chmod 777 inventory && chmod 600 README.md 2>/dev/null; "
                    "rm -rf .git/refs && mkdir .git/refs && chmod 000 .git/refs; "
                    # a same-size rewrite renamed into place with the old time: only its inode tells
                    "f=inventory/stats.py; cp -p $f f.new && sed -i '1s/./X/' f.new && touch -r $f f.new && mv f.new $f; "
                    "ln -s /etc/passwd link; echo tmpjunk > /tmp/junk; echo shm > /dev/shm/junk; "
                    "(sleep 1000 &) ; (while :; do sleep 1; done &) ; nohup sleep 999 >/dev/null 2>&1 &")
            assert sb.exec(TREE_HASH).text() != pristine
            took = sb.reset()
            assert sb.exec(TREE_HASH).text() == pristine
            assert sb.exec("ls -A /tmp /dev/shm").text().split() == ["/dev/shm:", "/tmp:"]
            leftovers = sb.exec("ps -u sandbox -o args= | grep -v -e '_go' -e '^ps ' -e '^grep'").text()
            assert leftovers.strip() == "", leftovers
            assert took < 5
        # The first asked-for reset restores in full and takes the record the next ones compare with.
        assert sb.stats.changed_only_resets == (2 if changed_only else 0)


def test_a_changed_only_reset_is_asked_for_once_and_sees_renames_and_mmap_writes(docker_client, task_image):
    """The writes that keep a file's size and mtime: a same-size rewrite renamed into place with the
    old time, and a write through a shared mmap; each is put back. Asked for once, it lasts one reset."""
    rename = "f=inventory/stats.py; cp -p $f f.new && sed -i '1s/./X/' f.new && touch -r $f f.new && mv f.new $f"
    poke = ("python3 -c \"import mmap; f = open('inventory/stats.py', 'r+b'); "
            "m = mmap.mmap(f.fileno(), 0); m[0:1] = b'X'; m.flush(); m.close()\"")
    with Sandbox.start(docker_client, task_image) as sb:
        original = sb.read_file("/workspace/inventory/stats.py")
        sb.trust_until_reset()
        sb.reset()  # the first one restores in full and records the workspace
        for change in (rename, poke, poke):
            sb.trust_until_reset()
            assert sb.exec(change).exit_code == 0 and sb.read_file("/workspace/inventory/stats.py") != original
            sb.reset()
            assert sb.read_file("/workspace/inventory/stats.py") == original
        assert sb.stats.changed_only_resets == 3
        sb.exec(poke)
        sb.reset()  # not asked for: a full one
        assert sb.read_file("/workspace/inventory/stats.py") == original and sb.stats.changed_only_resets == 3


def test_snapshot_and_reset_to_it(docker_client, task_image):
    with Sandbox.start(docker_client, task_image) as sb:
        sb.exec("echo state-1 > progress.txt")
        snap = sb.snapshot()
        sb.exec("echo state-2 > progress.txt && rm -rf inventory")
        sb.reset(snap)
        assert sb.read_file("/workspace/progress.txt") == b"state-1\n"
        assert sb.exec("test -d inventory").exit_code == 0
        sb.reset(INITIAL)
        assert sb.exec("test -e progress.txt").exit_code != 0


def test_agent_death_falls_back_to_docker_exec(docker_client, task_image):
    with Sandbox.start(docker_client, task_image) as sb:
        agent_pid = sb.container.exec_run(["pgrep", "-u", "root", "-x", "python3"], user="0").output.split()[0]
        sb.container.exec_run(["kill", "-9", agent_pid.decode()], user="0")
        with pytest.raises(InfraError) as info:
            sb.exec("echo hi")
        assert info.value.cause in ("agent_died", "agent_hung")
        assert sb.tainted and not sb.agent_alive
        res = sb.exec("echo still here; id -u")
        assert res.text() == "still here\n1000\n"
        assert sb.stats.fallback_execs == 1 and "agent died" in sb.stats.agent_failure
        slow = sb.exec("sleep 10", timeout_s=1)
        assert slow.timed_out
        sb.reset()  # the exec-based reset still works for the initial state
        assert sb.exec("git status --porcelain").text() == ""


def test_async_api_drives_sandboxes_concurrently(docker_client, task_image):
    async def scenario() -> list[str]:
        boxes = await asyncio.gather(*(Sandbox.astart(docker_client, task_image) for _ in range(4)))
        try:
            results = await asyncio.gather(*(sb.aexec(f"echo {i}") for i, sb in enumerate(boxes)))
            await asyncio.gather(*(sb.areset() for sb in boxes))
            return [r.text().strip() for r in results]
        finally:
            await asyncio.gather(*(sb.aclose() for sb in boxes))

    assert asyncio.run(scenario()) == ["0", "1", "2", "3"]


def test_a_patched_copy_lists_what_git_apply_wrote_from_stat_data(docker_client, task_image):
    """The grader lists a patched copy's changed paths from stat data (only files whose mtime or size differ
    from the template's index are hashed): a same-size edit, an added and a deleted file are all seen, as the
    full read sees them; and `git apply` refuses a path inside .git, so .git needs restoring only after the
    `patch` fallback."""
    with Sandbox.start(docker_client, task_image) as sb:
        sb.exec("sed -i '1s/./X/' inventory/stats.py && echo new > added.txt && rm inventory/stock.py")
        patch = sb.diff()
        sb.reset()
        assert sb.changed_paths(patched_copy=True) == []
        assert sb.apply_patch(patch) == "git_apply"
        listed = sorted(sb.changed_paths(patched_copy=True))
        assert listed == sorted(sb.changed_paths()) == ["added.txt", "inventory/stats.py", "inventory/stock.py"]
        sb.reset()
        into_git = "--- a/.git/description\n+++ b/.git/description\n@@ -1 +1 @@\n-x\n+y\n"
        res = sb.exec("git apply --check -", stdin=into_git.encode())
        assert res.exit_code != 0 and ".git" in res.err_text(), res.err_text()
