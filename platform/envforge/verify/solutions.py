"""Run a known solution (the task's reference, or the empty one) in a fresh sandbox and grade it.

This is how a task proves its verifier before it is used: the reference must pass and the
empty solution must fail. Both start from a fresh container of the task image.
"""

from __future__ import annotations

import time
from typing import Literal

import docker

from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.task import Task
from envforge.verify.checkpoints import install_verifier_files, run_shell_checkpoint, run_tests
from envforge.verify.result import VerificationResult

SolutionKind = Literal["reference", "empty"]


def apply_reference(sandbox: Sandbox, task: Task) -> tuple[str | None, list[str]]:
    """Apply the task's reference solution; returns (patch method, failure reasons)."""
    ref = task.spec.reference_solution
    if task.reference_patch is not None:
        try:
            return sandbox.apply_patch(task.reference_patch), []
        except ValueError:
            return None, ["patch_failed"]
    reasons = []
    for i, cmd in enumerate(ref.commands or []):
        res = sandbox.exec(cmd)
        if res.exit_code != 0 or res.timed_out:
            reasons.append(f"solution_command_failed:{i}")
    return ("commands" if not reasons else None), reasons


def grade(sandbox: Sandbox, task: Task) -> tuple[dict[str, str], list, list[str]]:
    """Run every check of the task in the sandbox's current state."""
    install_verifier_files(sandbox, task)
    reasons: list[str] = []
    tests: dict[str, str] = {}
    if task.spec.verification.tests is not None:
        tests, test_reasons = run_tests(sandbox, task.spec.verification.tests)
        reasons += test_reasons
    checkpoints = [run_shell_checkpoint(sandbox, c) for c in task.spec.verification.checkpoints]
    for c in checkpoints:
        if not c.passed:
            reasons.append(f"checkpoint_failed:{c.name}")
        if c.timed_out and "timeout" not in reasons:
            reasons.append("timeout")
    return tests, checkpoints, reasons


def run_solution(client: docker.DockerClient, task: Task, image: str, solution: SolutionKind = "reference",
                 options: SandboxOptions | None = None) -> VerificationResult:
    """Start a fresh sandbox, apply the solution, grade, and always remove the container."""
    started = time.perf_counter()
    options = options or SandboxOptions(limits=task.spec.environment.limits, network=task.spec.environment.network)
    with Sandbox.start(client, image, options, labels={"envforge.task": task.id}) as sandbox:
        method, reasons = (None, [])
        if solution == "reference":
            method, reasons = apply_reference(sandbox, task)
        tests, checkpoints, check_reasons = grade(sandbox, task)
    reasons += check_reasons
    resolved = not reasons
    return VerificationResult(task_id=task.id, solution=solution, reward=1.0 if resolved else 0.0,
                              resolved=resolved, tests=tests, checkpoints=checkpoints, reasons=reasons,
                              patch_method=method, duration_s=time.perf_counter() - started, image=image)
