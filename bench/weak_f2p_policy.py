"""Where the weak FAIL_TO_PASS policy (GateConfig.weak_fail_to_pass) can flag a real task, without Docker.

    .venv/bin/python bench/weak_f2p_policy.py [--out FILE]

The policy flags a task only where the weak-form probe applies: a FAIL_TO_PASS test asserts only a form of the result
of a function the reference changes. This reads, with the probe's own functions (weak_form.weak_forms /
weak_form_sources), (1) every real-repository ticket's hand-checked FAIL_TO_PASS tests (`expected.yaml`) on its fix
commit, and (2) every commit of the real-repository and history bundles that changes test and source files, each
changed test function read alone (an over-approximation of the FAIL_TO_PASS tests a derivation would find). Per task:
the forms answered and those that assert a shape (what `shape` flags; `any` flags every answered form).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))
sys.path.insert(0, str(REPO))

from bench.gate import print_json  # noqa: E402
from envforge.verify.mutants import SourceChange, changed_lines  # noqa: E402
from envforge.verify.special_case import split_test_id  # noqa: E402
from envforge.verify.weak_form import WeakForm, weak_form_sources, weak_forms  # noqa: E402

EXAMPLES = REPO / "task_sources" / "examples"


def _git(repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, errors="surrogateescape")


def _show(repo: str, rev: str, path: str) -> str | None:
    r = _git(repo, "show", f"{rev}:{path}")
    return r.stdout if r.returncode == 0 else None


def _clone(bundle: Path) -> str:
    tmp = tempfile.mkdtemp(prefix="weak-f2p-")
    subprocess.run(["git", "clone", "-q", str(bundle), tmp], check=True)
    return tmp


def _is_test(path: str) -> bool:
    return "test" in Path(path).name or "/tests/" in f"/{path}" or "/test/" in f"/{path}"


def _probe(repo: str, rev: str, forms: dict[str, WeakForm], tests: set[str]) -> dict:
    """The forms the probe answers at the functions the commit changes, and those that assert a shape."""
    files = _git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", f"{rev}^", rev).stdout.split()
    changes = [
        SourceChange(p, _show(repo, f"{rev}^", p), after)
        for p in files
        if p.endswith(".py") and p not in tests and (after := _show(repo, rev, p)) is not None
    ]
    _, answered = weak_form_sources(changes, forms) if forms else ({}, [])
    return {
        "weak_forms": [f.describe() for f in forms.values()],
        "answered": answered,
        "shapes": [f.describe() for f in forms.values() if f.shape and f.describe() in answered],
    }


def tickets() -> dict[str, dict]:
    """Every real-repository ticket, read on its hand-checked FAIL_TO_PASS tests (as strength._weak_form reads them)."""
    out = {}
    for project in sorted(p for p in (EXAMPLES / "real-repos").iterdir() if (p / "expected.yaml").is_file()):
        repo = _clone(next(project.glob("*.bundle")))
        sha_map = json.loads((project / "sha-map.json").read_text())
        for ticket, entry in yaml.safe_load((project / "expected.yaml").read_text())["tickets"].items():
            rev = sha_map.get(entry["upstream"], entry["upstream"])
            by_file: dict[str, list[str]] = {}
            for test_id in entry.get("fail_to_pass", []):
                if split := split_test_id(test_id, "pytest"):
                    by_file.setdefault(split[0], []).append(split[1])
            forms: dict[str, WeakForm] = {}
            skipped: dict[str, str] = {}
            for path, names in by_file.items():
                found, why = weak_forms(_show(repo, rev, path) or "", names)
                skipped.update(why)
                forms.update(found)
            forms = {n: f for n, f in forms.items() if n not in skipped}
            out[f"{project.name}-{ticket}"] = _probe(repo, rev, forms, set(by_file))
    return out


def _changed_tests(before: str | None, after: str) -> list[str]:
    lines = changed_lines(before or "", after)
    try:
        tree = ast.parse(after)
    except SyntaxError:
        return []
    return [
        n.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.name.startswith("test")
        and any(n.lineno <= line <= (n.end_lineno or n.lineno) for line in lines)
    ]


def history() -> dict[str, dict]:
    """Every commit of the bundles that changes test and source files, each changed test function read alone."""
    out = {}
    for bundle in sorted([*(EXAMPLES / "real-repos").glob("*/*.bundle"), *(EXAMPLES / "history").glob("*/*.bundle")]):
        repo = _clone(bundle)
        for rev in _git(repo, "rev-list", "--no-merges", "--all").stdout.split():
            files = _git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", f"{rev}^", rev).stdout.split()
            tests = {f for f in files if f.endswith(".py") and _is_test(f)}
            if not tests or not any(f.endswith(".py") and f not in tests for f in files):
                continue
            forms: dict[str, WeakForm] = {}
            for path in sorted(tests):
                after = _show(repo, rev, path)
                for name in _changed_tests(_show(repo, f"{rev}^", path), after) if after else []:
                    forms.update(weak_forms(after, [name])[0])  # type: ignore[arg-type]
            out[f"{bundle.stem}@{rev[:10]}"] = _probe(repo, rev, forms, tests)
    return out


def _counts(rows: dict[str, dict]) -> dict:
    return {
        "tasks": len(rows),
        "weak_forms": sum(bool(r["weak_forms"]) for r in rows.values()),
        "probe_applies": sum(bool(r["answered"]) for r in rows.values()),
        "flagged_shape": sum(bool(r["shapes"]) for r in rows.values()),
        "applies": {k: r for k, r in rows.items() if r["answered"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    print_json({"benchmark": "weak_f2p_policy", "tickets": _counts(tickets()), "history": _counts(history())}, args.out)


if __name__ == "__main__":
    main()
