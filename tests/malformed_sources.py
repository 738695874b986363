"""A case set of malformed and hostile task sources, one folder per case, across the five kinds.

Each case says what must happen to it: rejected with a reason (naming the field), accepted
(with a check of what was kept), or skipped with a reason. `run_cases` loads every case the
way `envforge ingest` does and tallies the outcome: rejected with the expected reason,
crash (an exception no check anticipated, which the loader turned into an `unexpected`
reject), hang (over the per-case deadline), wrong accept (a task came out of a case that must
be refused), or a reject that does not say what the case expects.

Used by tests/test_source_trust.py and bench/malformed_sources.py (the tally in JSON).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "task_sources" / "specs" / "inventory-median-even"
RUNBOOK = REPO / "task_sources" / "runbooks" / "log-rotation.md"
BIG_TEXT = "x" * (70 * 1024)  # over the 64 KiB text cap, under the 1 MiB YAML cap


@dataclass
class Fixture:
    """Shared material: a git repository (as a bundle each case copies) and its commits."""

    bundle: Path
    shas: dict[str, str]
    patch: str
    test_patch: str
    outside: Path  # a folder outside every case folder, holding a file and a git repository


@dataclass
class Case:
    name: str
    kind: str
    build: Callable[[Path, Fixture], Path]  # writes the case under its folder; returns the path to ingest
    expect: str = "reject"  # reject | accept | skip
    field: str = ""  # a reject's field must contain this
    reason: str = ""  # a reject's (or skip's) reason must contain this
    check: Callable[[object], bool] | None = None  # for accepts: what was kept
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass
class Outcome:
    case: str
    kind: str
    status: str  # rejected | accepted | skipped | crash | hang | wrong_accept | wrong_reason | missed
    detail: str = ""


# -- builders ---------------------------------------------------------------------------


def _spec(d: Path, **changes) -> Path:
    shutil.copytree(SPEC, d, symlinks=True)
    data = yaml.safe_load((d / "task.yaml").read_text())
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    (d / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return d / "task.yaml"


def _spec_raw(d: Path, text: str | bytes) -> Path:
    shutil.copytree(SPEC, d, symlinks=True)
    path = d / "task.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _spec_with(mutate: Callable[[Path], None], **changes) -> Callable[[Path, Fixture], Path]:
    def build(d: Path, fx: Fixture) -> Path:
        path = _spec(d, **changes)
        mutate(d)
        return path
    return build


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def make_socket(path: Path) -> None:
    """A UNIX socket file at path (bound from its folder: socket paths are limited to ~100 bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(cwd)


def _runbook(text: str | bytes, name: str = "rb.md") -> Callable[[Path, Fixture], Path]:
    def build(d: Path, fx: Fixture) -> Path:
        d.mkdir(parents=True)
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
        return d / name
    return build


GOOD_RUNBOOK = RUNBOOK.read_text()


def _front(front: str) -> str:
    return "---\n" + front + "\n---\n" + GOOD_RUNBOOK.split("---\n", 2)[2]


def _swe_record(fx: Fixture, **changes) -> dict:
    rec = {"repo": "acme/calc", "instance_id": "acme__calc-1", "base_commit": fx.shas["initial"], "patch": fx.patch,
           "test_patch": fx.test_patch, "problem_statement": "add() subtracts instead of adding; fix it.",
           "FAIL_TO_PASS": ["tests/test_calc.py::test_add"], "PASS_TO_PASS": ["tests/test_calc.py::test_mul"]}
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not _DROP}


_DROP = object()


def _swebench(records: Callable[[Fixture], list] | None = None, config: str | None = "repos:\n  acme/calc: calc.bundle\n",
              raw: bytes | None = None, bundle: bool = True) -> Callable[[Path, Fixture], Path]:
    def build(d: Path, fx: Fixture) -> Path:
        d.mkdir(parents=True)
        if bundle:
            shutil.copy(fx.bundle, d / "calc.bundle")
        if config is not None:
            (d / "swebench.yaml").write_text(config.replace("{outside}", str(fx.outside)))
        if raw is not None:
            (d / "instances.jsonl").write_bytes(raw)
        else:
            lines = [json.dumps(r) if not isinstance(r, str) else r for r in (records or (lambda f: [_swe_record(f)]))(fx)]
            (d / "instances.jsonl").write_text("\n".join(lines) + "\n")
        return d / "instances.jsonl"
    return build


def _tickets(config: str | None = None, rows: Callable[[Fixture], list] | None = None, csv_text: Callable[[Fixture], bytes] | None = None,
             prepare: Callable[[Path, Fixture], None] | None = None) -> Callable[[Path, Fixture], Path]:
    def build(d: Path, fx: Fixture) -> Path:
        d.mkdir(parents=True)
        shutil.copy(fx.bundle, d / "calc.bundle")
        cfg = config or ("repository: calc.bundle\nproject: calc\nexports:\n  - file: jira.jsonl\n    preset: jira\n"
                         "  - file: gh.csv\n    preset: github\n")
        (d / "tickets.yaml").write_text(cfg.replace("{outside}", str(fx.outside)))
        recs = rows(fx) if rows else [{"key": "CALC-1", "fields": {"summary": "add() subtracts",
                                                                   "fix_commit": fx.shas["fix"]}}]
        (d / "jira.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        (d / "gh.csv").write_bytes(csv_text(fx) if csv_text else b"number,title,body,closed_by_commit\n")
        if prepare:
            prepare(d, fx)
        return d / "tickets.yaml"
    return build


def _review_record(fx: Fixture, **changes) -> dict:
    rec = {"id": "PR-3#c1", "repository": "acme/calc", "base_commit": fx.shas["characterization"],
           "change_commit": fx.shas["change"], "follow_up_commit": fx.shas["follow_up"],
           "comment": {"author": "rev", "path": "calc.py", "line": 12, "body": "div by zero is not handled"}}
    rec.update(changes)
    return rec


def _reviews(config: str | None = None, records: Callable[[Fixture], list] | None = None,
             prepare: Callable[[Path, Fixture], None] | None = None) -> Callable[[Path, Fixture], Path]:
    def build(d: Path, fx: Fixture) -> Path:
        d.mkdir(parents=True)
        shutil.copy(fx.bundle, d / "calc.bundle")
        (d / "reviews.yaml").write_text((config or "repos:\n  acme/calc: calc.bundle\n").replace("{outside}", str(fx.outside)))
        recs = records(fx) if records else [_review_record(fx)]
        (d / "reviews.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        if prepare:
            prepare(d, fx)
        return d / "reviews.yaml"
    return build


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def _pinned(field: str, ref: str) -> Callable[[object], bool]:
    def check(loaded) -> bool:
        items = list(loaded.tasks) + list(loaded.candidates)
        return bool(items) and all(
            (getattr(i, "spec", None) and i.spec.metadata.get("resolved_refs", {}).get(field, {}).get("ref") == ref)
            or (getattr(i, "metadata", None) and i.metadata.get("resolved_refs", {}).get(field, {}).get("ref") == ref)
            for i in items)
    return check


def _instruction_clean(loaded) -> bool:
    items = list(loaded.tasks) + list(loaded.candidates)
    text = [getattr(i, "instruction", None) or i.spec.instruction for i in items]
    return bool(text) and all("\x00" not in t and "\x07" not in t for t in text)


def _count(n: int) -> Callable[[object], bool]:
    return lambda loaded: len(loaded.tasks) + len(loaded.candidates) == n


def cases() -> list[Case]:
    c: list[Case] = []
    add = c.append
    # ---- specs: confinement ----
    add(Case("spec-files-parent-escape", "spec", lambda d, fx: _spec(d, environment__files="../../outside-ws"),
             field="environment.files", reason="outside the source's folder"))
    add(Case("spec-files-absolute", "spec", lambda d, fx: _spec(d, environment__files="/etc/ssh"),
             field="environment.files", reason="outside the source's folder"))
    add(Case("spec-verifier-symlink-shadow", "spec",
             _spec_with(lambda d: (d / "verifier").mkdir() or os.symlink("/etc/shadow", d / "verifier" / "shadow"),
                        verification__files="verifier"), field="verification.files", reason="absolute path"))
    add(Case("spec-verifier-relative-escape", "spec",
             _spec_with(lambda d: (d / "verifier").mkdir() or os.symlink("../../../../../../etc/passwd",
                                                                         d / "verifier" / "p"),
                        verification__files="verifier"), field="verification.files", reason="leaves the folder"))
    add(Case("spec-verifier-dir-symlink", "spec",
             _spec_with(lambda d: os.symlink("/etc", d / "verifier"), verification__files="verifier"),
             field="verification.files", reason="outside the source's folder"))
    add(Case("spec-workspace-symlink-escape", "spec",
             _spec_with(lambda d: os.symlink("/etc/hostname", d / "workspace" / "host")),
             field="environment.files", reason="absolute path"))
    add(Case("spec-workspace-fifo", "spec", _spec_with(lambda d: _fifo(d / "workspace" / "pipe")),
             field="environment.files", reason="a FIFO"))
    add(Case("spec-workspace-socket", "spec", _spec_with(lambda d: make_socket(d / "workspace" / "s.sock")),
             field="environment.files", reason="a socket"))
    add(Case("spec-patch-outside", "spec",
             lambda d, fx: _spec(d, reference_solution__patch=str(fx.outside / "secret.txt")),
             field="reference_solution.patch", reason="outside the source's folder"))
    add(Case("spec-patch-fifo", "spec",
             _spec_with(lambda d: ((d / "solution.patch").unlink(), _fifo(d / "solution.patch"))),
             field="reference_solution.patch", reason="a FIFO"))
    add(Case("spec-test-patch-dev-zero", "spec", lambda d, fx: _spec(d, verification__test_patch="/dev/zero"),
             field="verification.test_patch", reason="outside the source's folder"))
    add(Case("spec-dockerfile-outside", "spec",
             lambda d, fx: _spec(d, environment__image=None, environment__dockerfile="../../../../etc/passwd"),
             field="environment.dockerfile", reason="outside the source's folder"))
    add(Case("spec-repository-outside", "spec",
             lambda d, fx: _spec(d, environment__files=None,
                                 environment__repository={"path": str(fx.outside / "repo"), "commit": "HEAD"}),
             field="environment.repository.path", reason="outside the source's folder"))
    add(Case("spec-file-is-fifo", "spec", lambda d, fx: (d.mkdir(), _fifo(d / "task.yaml"))[0] or d / "task.yaml",
             reason="a FIFO"))
    add(Case("spec-file-symlink-outside", "spec",
             lambda d, fx: (d.mkdir(), os.symlink(fx.outside / "task.yaml", d / "task.yaml"))[0] or d / "task.yaml",
             reason="outside the source's folder"))
    # ---- specs: limits and content ----
    add(Case("spec-alias-bomb", "spec", lambda d, fx: _spec_raw(d, BOMB), reason="nodes"))
    add(Case("spec-recursive-alias", "spec", lambda d, fx: _spec_raw(d, "id: &a [*a]\n"), reason="recursive"))
    add(Case("spec-yaml-too-big", "spec", lambda d, fx: _spec_raw(d, "instruction: " + "y" * (1100 * 1024) + "\n"),
             reason="limit"))
    add(Case("spec-instruction-too-long", "spec", lambda d, fx: _spec(d, instruction=BIG_TEXT),
             field="instruction", reason="character limit"))
    add(Case("spec-workspace-over-quota", "spec",
             _spec_with(lambda d: (d / "workspace" / "blob.bin").write_bytes(b"\0" * (70 << 20)),
                        environment__limits={"cpus": 1, "memory_mb": 512, "workspace_mb": 64, "tmp_mb": 64,
                                             "pids": 128}),
             field="environment.files", reason="workspace_mb"))
    add(Case("spec-test-id-tab", "spec",
             lambda d, fx: _spec(d, verification__tests__fail_to_pass=["tests/test_stats.py::test\tx; rm -rf /"]),
             field="fail_to_pass", reason="whitespace"))
    add(Case("spec-test-id-newline", "spec",
             lambda d, fx: _spec(d, verification__tests__fail_to_pass=["tests/a.py::t\n$(id)"]),
             field="fail_to_pass", reason="whitespace"))
    add(Case("spec-patch-does-not-apply", "spec",
             _spec_with(lambda d: (d / "solution.patch").write_text(
                 (d / "solution.patch").read_text().replace("-    return ordered[mid]", "-    return ordered[mid + 1]"))),
             field="reference_solution.patch", reason="does not apply"))
    add(Case("spec-not-utf8", "spec", lambda d, fx: _spec_raw(d, b"id: caf\xe9\n"), reason="UTF-8"))
    add(Case("spec-is-a-list", "spec", lambda d, fx: _spec_raw(d, "- a\n- b\n"), reason="mapping"))
    add(Case("spec-id-is-a-list", "spec", lambda d, fx: _spec(d, id=[1, 2]), field="id", reason="string"))
    add(Case("spec-nul-in-yaml", "spec", lambda d, fx: _spec_raw(d, b"id: a\x00b\n"), reason="YAML"))
    add(Case("spec-bom-accepted", "spec",
             lambda d, fx: _spec_raw(d, b"\xef\xbb\xbf" + (SPEC / "task.yaml").read_bytes()), expect="accept",
             check=_count(1)))
    add(Case("spec-control-chars-stripped", "spec",
             lambda d, fx: _spec(d, instruction="Fix the median\x07 please, it is wrong for even input.\x1b"),
             expect="accept", check=_instruction_clean))
    # ---- runbooks ----
    add(Case("runbook-metadata-string", "runbook", _runbook(_front("id: rb-x\nmetadata: oops")),
             field="front matter.metadata", reason="dictionary"))
    add(Case("runbook-metadata-list", "runbook", _runbook(_front("id: rb-x\nmetadata: [1, 2]")),
             field="front matter.metadata", reason="dictionary"))
    add(Case("runbook-front-matter-list", "runbook", _runbook(_front("- id\n- rb-x")),
             field="front matter", reason="mapping"))
    add(Case("runbook-front-matter-bomb", "runbook", _runbook(_front("id: rb-x\n" + BOMB)),
             field="front matter", reason="nodes"))
    add(Case("runbook-limits-string", "runbook", _runbook(_front("id: rb-x\nlimits: big")),
             field="front matter.limits", reason="valid"))
    add(Case("runbook-tags-dict", "runbook", _runbook(_front("id: rb-x\ntags: {a: 1}")),
             field="front matter.tags", reason="list"))
    add(Case("runbook-max-turns-string", "runbook", _runbook(_front("id: rb-x\nmax_turns: many")),
             field="front matter.max_turns", reason="integer"))
    add(Case("runbook-not-utf8", "runbook", _runbook(_front("id: rb-x").encode() + b"\n\xff\xfe broken\n"),
             reason="UTF-8"))
    add(Case("runbook-instruction-too-long", "runbook",
             _runbook(_front("id: rb-x").replace("# Runbook", BIG_TEXT + "\n# Runbook", 1)),
             field="instruction", reason="character limit"))
    add(Case("runbook-too-big", "runbook", _runbook(_front("id: rb-x") + "z" * (5 << 20)), reason="limit"))
    add(Case("runbook-checks-bomb", "runbook",
             _runbook(_front("id: rb-x").replace("## Checks\n```yaml\n", "## Checks\n```yaml\n" + BOMB + "x:\n", 1)),
             field="Checks", reason=""))
    add(Case("runbook-fifo", "runbook", lambda d, fx: (d.mkdir(), _fifo(d / "rb.md"))[0] or d / "rb.md",
             reason="a FIFO"))
    add(Case("runbook-bom-accepted", "runbook", _runbook(b"\xef\xbb\xbf" + GOOD_RUNBOOK.encode()), expect="accept",
             check=_count(1)))
    add(Case("runbook-crlf-accepted", "runbook", _runbook(GOOD_RUNBOOK.replace("\n", "\r\n")), expect="accept",
             check=_count(1)))
    add(Case("runbook-no-front-matter-skipped", "runbook",
             lambda d, fx: (_runbook(GOOD_RUNBOOK)(d / "runbooks", fx), (d / "runbooks" / "notes.md").write_text(
                 "# Notes\nno front matter here\n"))[0].parent, expect="skip", reason="front matter"))
    # ---- SWE-bench ----
    add(Case("swe-repo-list", "swebench", _swebench(lambda fx: [_swe_record(fx, repo=["acme/calc"])]),
             field="repo", reason="valid"))
    add(Case("swe-instance-id-dict", "swebench", _swebench(lambda fx: [_swe_record(fx, instance_id={"a": 1})]),
             field="instance_id", reason="valid"))
    add(Case("swe-patch-number", "swebench", _swebench(lambda fx: [_swe_record(fx, patch=12)]),
             field="patch", reason="string"))
    add(Case("swe-repo-path-outside", "swebench",
             _swebench(lambda fx: [_swe_record(fx, repo="x/y", repo_path=str(fx.outside / "repo"))]),
             field="repo_path", reason="outside the source's folder"))
    add(Case("swe-repo-path-relative-escape", "swebench",
             _swebench(lambda fx: [_swe_record(fx, repo="x/y", repo_path="../../../../../../../")]),
             field="repo_path", reason="outside the source's folder"))
    add(Case("swe-config-yaml-error", "swebench", _swebench(config="repos: [unclosed\n"), reason="YAML"))
    add(Case("swe-config-list", "swebench", _swebench(config="- acme/calc\n"), reason="mapping"))
    add(Case("swe-config-repos-outside", "swebench", _swebench(config="repos:\n  acme/calc: {outside}/repo\n"),
             field="repos.acme/calc", reason="outside the source's folder"))
    add(Case("swe-config-unknown-field", "swebench", _swebench(config="repos: {acme/calc: calc.bundle}\nrepoz: 1\n"),
             field="repoz", reason="unknown field"))
    add(Case("swe-fail-to-pass-trailing-space", "swebench",
             _swebench(lambda fx: [_swe_record(fx, FAIL_TO_PASS=["tests/test_calc.py::test_add "])]),
             field="FAIL_TO_PASS", reason="ends with a space"))
    add(Case("swe-fail-to-pass-not-json", "swebench",
             _swebench(lambda fx: [_swe_record(fx, FAIL_TO_PASS="[not json")]), field="FAIL_TO_PASS", reason="list"))
    add(Case("swe-problem-too-long", "swebench", _swebench(lambda fx: [_swe_record(fx, problem_statement=BIG_TEXT)]),
             field="problem_statement", reason="character limit"))
    add(Case("swe-base-commit-moving-refused", "swebench", _swebench(lambda fx: [_swe_record(fx, base_commit="main~5")]),
             field="base_commit", reason="moving ref", env={"ENVFORGE_MOVING_REFS": "refuse"}))
    add(Case("swe-base-commit-moving-pinned", "swebench", _swebench(lambda fx: [_swe_record(fx, base_commit="main~5")]),
             expect="accept", check=_pinned("base_commit", "main~5")))
    add(Case("swe-base-commit-dash", "swebench", _swebench(lambda fx: [_swe_record(fx, base_commit="--output=/x")]),
             field="base_commit", reason="'-'"))
    add(Case("swe-deeply-nested", "swebench", _swebench(lambda fx: ["[" * 100000 + "]" * 100000]), reason="JSON"))
    add(Case("swe-not-an-object", "swebench", _swebench(lambda fx: ["[1, 2]"]), reason="JSON object"))
    add(Case("swe-bad-utf8-costs-one-record", "swebench",
             lambda d, fx: _swebench(raw=(json.dumps(_swe_record(fx)) + "\n").encode()
                                     + b'{"repo": "caf\xe9"}\n'
                                     + (json.dumps(_swe_record(fx, instance_id="acme__calc-2")) + "\n").encode())(d, fx),
             expect="accept", check=_count(2), reason="UTF-8"))
    add(Case("swe-bom-accepted", "swebench",
             lambda d, fx: _swebench(raw=b"\xef\xbb\xbf" + (json.dumps(_swe_record(fx)) + "\n").encode())(d, fx),
             expect="accept", check=_count(1)))
    add(Case("swe-nul-stripped", "swebench",
             _swebench(lambda fx: [_swe_record(fx, problem_statement="add()\x00 subtracts\x07 instead of adding")]),
             expect="accept", check=_instruction_clean))
    add(Case("swe-jsonl-is-fifo", "swebench",
             lambda d, fx: (d.mkdir(), (d / "swebench.yaml").write_text("repos: {}\n"), _fifo(d / "x.jsonl"))[0]
             or d / "x.jsonl", reason="a FIFO"))
    add(Case("swe-series-repo-yaml-error", "swebench",
             _swebench(config="repos:\n  acme/calc: proj\n", bundle=False), reason="YAML",
             check=None))
    add(Case("swe-series-repo-yaml-list", "swebench",
             _swebench(config="repos:\n  acme/calc: proj\n", bundle=False), reason="mapping"))
    # ---- tickets ----
    add(Case("ticket-config-yaml-error", "ticket", _tickets(config="repository: [\n"), reason="YAML"))
    add(Case("ticket-config-list", "ticket", _tickets(config="- repository\n"), reason="mapping"))
    add(Case("ticket-repository-outside", "ticket",
             _tickets(config="repository: {outside}/repo\nexports:\n  - file: jira.jsonl\n    preset: jira\n"),
             field="repository", reason="outside the source's folder"))
    add(Case("ticket-export-outside", "ticket",
             _tickets(config="repository: calc.bundle\nexports:\n  - file: ../../../../../../etc/passwd\n"
                             "    preset: github\n"), field="exports[0].file", reason="outside the source's folder"))
    add(Case("ticket-export-fifo", "ticket",
             _tickets(config="repository: calc.bundle\nexports:\n  - file: pipe.csv\n    preset: github\n",
                      prepare=lambda d, fx: _fifo(d / "pipe.csv")), reason="a FIFO"))
    add(Case("ticket-export-file-not-string", "ticket",
             _tickets(config="repository: calc.bundle\nexports:\n  - file: [a]\n    preset: github\n"),
             field="exports[0].file", reason="string"))
    add(Case("ticket-title-list", "ticket",
             _tickets(rows=lambda fx: [{"key": "C-1", "fields": {"summary": ["a"], "fix_commit": fx.shas["fix"]}}]),
             field="fields.summary", reason="string"))
    add(Case("ticket-id-dict", "ticket",
             _tickets(rows=lambda fx: [{"key": {"a": 1}, "fields": {"summary": "t", "fix_commit": fx.shas["fix"]}}]),
             field="key", reason="valid"))
    add(Case("ticket-fix-commit-number", "ticket",
             _tickets(rows=lambda fx: [{"key": "C-1", "fields": {"summary": "t", "fix_commit": 1234567}}]),
             field="fields.fix_commit", reason="string"))
    add(Case("ticket-fix-moving-refused", "ticket",
             _tickets(rows=lambda fx: [{"key": "C-1", "fields": {"summary": "add() subtracts", "fix_commit": "main~4"}}]),
             field="fields.fix_commit", reason="moving ref", env={"ENVFORGE_MOVING_REFS": "refuse"}))
    add(Case("ticket-fix-moving-pinned", "ticket",
             _tickets(rows=lambda fx: [{"key": "C-1", "fields": {"summary": "add() subtracts", "fix_commit": "main~4"}}]),
             expect="accept", check=_pinned("fields.fix_commit", "main~4")))
    add(Case("ticket-title-too-long", "ticket",
             _tickets(rows=lambda fx: [{"key": "C-1", "fields": {"summary": BIG_TEXT, "fix_commit": fx.shas["fix"]}}]),
             field="fields.summary", reason="character limit"))
    add(Case("ticket-labels-dict", "ticket",
             _tickets(rows=lambda fx: [{"key": "C-1", "fields": {"summary": "t", "labels": {"a": 1},
                                                                 "fix_commit": fx.shas["fix"]}}]),
             field="fields.labels", reason="valid"))
    add(Case("ticket-csv-nul-stripped", "ticket",
             _tickets(rows=lambda fx: [], csv_text=lambda fx: f"number,title,body,closed_by_commit\n7,add()\x00 "
                                                              f"subtracts,b\x00ody,{fx.shas['fix']}\n".encode()),
             expect="accept", check=_instruction_clean))
    add(Case("ticket-csv-bad-utf8-costs-one-row", "ticket",
             _tickets(rows=lambda fx: [], csv_text=lambda fx: (
                 f"number,title,body,closed_by_commit\n7,add() subtracts,x,{fx.shas['fix']}\n".encode()
                 + b"8,caf\xe9,x," + fx.shas["fix"].encode() + b"\n"
                 + f"9,add() really subtracts,x,{fx.shas['fix']}\n".encode())),
             expect="accept", check=_count(2), reason="UTF-8"))
    add(Case("ticket-csv-unterminated-quote", "ticket",
             _tickets(rows=lambda fx: [], csv_text=lambda fx: f'number,title,body,closed_by_commit\n7,"add,x,{fx.shas["fix"]}\n'.encode()),
             reason="required field is missing"))
    # ---- reviews ----
    add(Case("review-config-list", "review", _reviews(config="- a\n"), reason="mapping"))
    add(Case("review-repos-outside", "review", _reviews(config="repos:\n  acme/calc: {outside}/repo\n"),
             field="repos.acme/calc", reason="outside the source's folder"))
    add(Case("review-comment-number", "review", _reviews(records=lambda fx: [_review_record(fx, comment=42)]),
             field="comment", reason="valid"))
    add(Case("review-comment-body-list", "review",
             _reviews(records=lambda fx: [_review_record(fx, comment={"body": ["x"]})]), field="comment", reason="valid"))
    add(Case("review-id-list", "review", _reviews(records=lambda fx: [_review_record(fx, id=["x"])]),
             field="id", reason="valid"))
    add(Case("review-repository-dict", "review", _reviews(records=lambda fx: [_review_record(fx, repository={"a": 1})]),
             field="repository", reason="valid"))
    add(Case("review-files-outside", "review",
             _reviews(config="repos:\n  acme/calc: calc.bundle\nfiles: [../../../../../../etc/passwd]\n"),
             field="files[0]", reason="outside the source's folder"))
    add(Case("review-change-moving-refused", "review",
             _reviews(records=lambda fx: [_review_record(fx, change_commit="main~1", base_commit=None)]),
             field="change_commit", reason="moving ref", env={"ENVFORGE_MOVING_REFS": "refuse"}))
    add(Case("review-comment-too-long", "review", _reviews(records=lambda fx: [_review_record(fx, comment=BIG_TEXT)]),
             field="comment", reason="character limit"))
    return c


# -- running ----------------------------------------------------------------------------


def _series_fixups(case: Case, d: Path, fx: Fixture) -> None:
    """The two patch-series cases need a project folder with a broken repo.yaml."""
    if case.name.startswith("swe-series-repo-yaml"):
        proj = d / "proj"
        (proj / "patches").mkdir(parents=True)
        subprocess.run(["git", "-C", str(fx.outside / "repo"), "format-patch", "-q", "--root", "-o",
                        str(proj / "patches"), "HEAD"], check=True, capture_output=True)
        (proj / "repo.yaml").write_text("committer: [\n" if case.name.endswith("error") else "- a\n")


def make_fixture(root: Path) -> Fixture:
    from envforge.sources.gitrepo import split_change
    from tests.test_history_sources import make_calc_repo

    outside = root / "outside"
    outside.mkdir(parents=True)
    shas = make_calc_repo(outside / "repo")
    (outside / "secret.txt").write_text("--- a/x\n+++ b/x\nsecret\n")
    shutil.copytree(SPEC, outside / "spec")
    (outside / "task.yaml").write_text((SPEC / "task.yaml").read_text())
    bundle = outside / "calc.bundle"
    subprocess.run(["git", "-C", str(outside / "repo"), "bundle", "create", str(bundle), "--all"], check=True,
                   capture_output=True)
    change = split_change(outside / "repo", shas["initial"], shas["fix"])
    return Fixture(bundle, shas, change.source_patch, change.test_patch, outside)


class _Deadline(Exception):
    pass


def _alarm(signum, frame):
    raise _Deadline()


def run_case(case: Case, root: Path, fx: Fixture, deadline_s: int = 20) -> Outcome:
    """Build and load one case as `envforge ingest` would, and judge the outcome."""
    from envforge.sources import LoadResult, load_source, scan_sources
    from envforge.sources.guard import UNEXPECTED

    d = root / case.name
    target = case.build(d, fx)
    _series_fixups(case, d, fx)
    saved = {k: os.environ.get(k) for k in case.env}
    os.environ.update(case.env)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(deadline_s)
    try:
        found = scan_sources([target])
        loaded = LoadResult(rejects=list(found.problems))
        for ref in found.refs:
            loaded.extend(load_source(ref))
    except _Deadline:
        return Outcome(case.name, case.kind, "hang", f"over {deadline_s}s")
    except Exception as exc:  # noqa: BLE001 - what the tally is for
        return Outcome(case.name, case.kind, "crash", f"{type(exc).__name__}: {exc}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    unexpected = [p for p in loaded.rejects if UNEXPECTED in p.reason]
    if unexpected:
        return Outcome(case.name, case.kind, "crash", str(unexpected[0]))
    got = len(loaded.tasks) + len(loaded.candidates)
    reasons = "; ".join(str(p) for p in loaded.rejects)
    if case.expect == "skip":
        ok = any(case.reason in p.reason for p in found.skipped)
        return Outcome(case.name, case.kind, "skipped" if ok else "missed",
                       "; ".join(str(p) for p in found.skipped) or "not reported as skipped")
    if case.expect == "accept":
        if case.check is not None and not case.check(loaded):
            return Outcome(case.name, case.kind, "wrong_reason", f"accepted wrongly: {got} item(s); {reasons}")
        if case.reason and not any(case.reason in p.reason for p in loaded.rejects):
            return Outcome(case.name, case.kind, "wrong_reason", f"expected a reject mentioning {case.reason!r}: "
                                                                  f"{reasons}")
        return Outcome(case.name, case.kind, "accepted", reasons)
    if got:
        return Outcome(case.name, case.kind, "wrong_accept", f"{got} task(s) accepted; rejects: {reasons}")
    match = [p for p in loaded.rejects if case.field in p.field and case.reason in p.reason]
    if not match:
        return Outcome(case.name, case.kind, "wrong_reason", reasons or "no reject at all")
    return Outcome(case.name, case.kind, "rejected", str(match[0])[:300])


def run_cases(root: Path) -> list[Outcome]:
    """Every case, each under its own folder; sources are confined to their folders (no extra roots)."""
    saved = os.environ.get("ENVFORGE_SOURCE_ROOTS")
    os.environ["ENVFORGE_SOURCE_ROOTS"] = ""
    try:
        fx = make_fixture(root)
        return [run_case(case, root / "cases", fx) for case in cases()]
    finally:
        os.environ.pop("ENVFORGE_SOURCE_ROOTS") if saved is None else os.environ.__setitem__("ENVFORGE_SOURCE_ROOTS",
                                                                                             saved)


def tally(outcomes: list[Outcome]) -> dict:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    by_kind: dict[str, int] = {}
    for o in outcomes:
        by_kind[o.kind] = by_kind.get(o.kind, 0) + 1
    return {"cases": len(outcomes), "by_kind": by_kind, "outcomes": counts,
            "rejected_with_reason": counts.get("rejected", 0), "crashes": counts.get("crash", 0),
            "hangs": counts.get("hang", 0), "wrong_accepts": counts.get("wrong_accept", 0),
            "wrong_reasons": counts.get("wrong_reason", 0) + counts.get("missed", 0),
            "accepted_as_expected": counts.get("accepted", 0), "skipped_with_reason": counts.get("skipped", 0)}
