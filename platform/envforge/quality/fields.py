"""What of a task is compared with the reference corpora: everything the policy sees or the
verifier holds, one field at a time, so a verdict can say which part matched.

Fields:
- `instruction`: the text the policy is given;
- `workspace`: the workspace's source files, one comparable text per file (test files and
  test configuration go to `tests`);
- `solution`: the reference solution, the added lines of each file of its patch (or its commands);
- `tests`: the test patch, the workspace's test files and the names of the required tests;
- `verifier`: verifier files and checkpoint commands.

Workspaces can be whole repositories, so scanning is bounded: vendored and generated
directories, binary files, lock and media files are skipped, each file is read up to a cap,
and the workspace up to a total; everything left out is counted and named in a `ScanReport`.
Symlinks are never followed (a source's files stay inside its folder).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from envforge import gitstore
from envforge.quality.code import is_python_path
from envforge.quality.params import WorkspaceScan
from envforge.sources.gitrepo import repository_dir
from envforge.task import Task
from envforge.verify.protect import matches, protected_globs, split_diff

FIELDS = ("instruction", "workspace", "solution", "tests", "verifier")
_SNIFF = 8192
_NOT_READ_FACTOR = 64  # a blob this many times the per-file cap is not even read from git
_EXAMPLES = 5


@dataclass(frozen=True)
class FieldText:
    """One comparable text of a task: a field, the file in it (if any), and how to read it."""

    field: str
    text: str
    path: str | None = None
    python: bool | None = None  # True: Python source; None: look for code in free text; False: plain text

    @property
    def key(self) -> str:
        """Identical texts are compared once, whichever tasks and fields they belong to."""
        return hashlib.sha1(f"{self.python}\0{self.text}".encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.field}:{self.path}" if self.path else self.field


@dataclass
class ScanReport:
    """What a workspace scan read and what it left out, and why."""

    files: int = 0
    bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, path: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < _EXAMPLES:
            ex.append(path)

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "skipped": dict(self.skipped),
            "examples": {k: list(v) for k, v in self.examples.items()},
        }

    def summary(self) -> str:
        left = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
        return f"{self.files} files ({self.bytes} bytes) read" + (f"; skipped: {left}" if left else "")


def _added_lines(section_text: str) -> str:
    return "\n".join(ln[1:] for ln in section_text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))


def patch_fields(field_name: str, patch: str | None) -> list[FieldText]:
    """One text per file of a diff: its added lines (what the patch brings in)."""
    if not patch:
        return []
    out = []
    for section in split_diff(patch):
        body = _added_lines(section.text)
        if body.strip():
            path = section.paths[-1] if section.paths else None
            out.append(FieldText(field_name, body, path, True if path and is_python_path(path) else None))
    if not out and patch.strip():  # not a diff we can split: compare it as text
        out.append(FieldText(field_name, patch, None, None))
    return out


def _decode(data: bytes) -> str | None:
    """Text of a file, or None when it is binary (a NUL byte, or not UTF-8/Latin-1 text)."""
    if b"\0" in data[:_SNIFF]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
        printable = sum(c.isprintable() or c in "\n\r\t" for c in text[:_SNIFF])
        return text if printable >= 0.95 * min(len(text), _SNIFF) else None


def _skipped_by_name(rel: str, scan: WorkspaceScan) -> str | None:
    parts = rel.split("/")
    if any(p in scan.skip_dirs for p in parts[:-1]):
        return "vendored or generated directory"
    if parts[-1].lower().endswith(scan.skip_suffixes):
        return "lock, minified, compiled or media file"
    return None


class WorkspaceReader:
    """Reads workspaces within the scan limits; a file's text is read once per content digest
    (tasks of one repository share most of their files)."""

    def __init__(self, scan: WorkspaceScan, data_dir: Path | None = None) -> None:
        self.scan = scan
        self.data_dir = data_dir  # its commit store, where history tasks' trees are kept since ingest
        self._cache: dict[tuple[str, str], tuple[list[tuple[str, str]], ScanReport]] = {}

    def _accept(self, rel: str, files: int, nbytes: int, report: ScanReport) -> bool:
        reason = _skipped_by_name(rel, self.scan)
        if reason:
            report.skip(reason, rel)
            return False
        if files >= self.scan.max_files:
            report.skip(f"over the {self.scan.max_files}-file limit", rel)
            return False
        if nbytes >= self.scan.max_total_bytes:
            report.skip(f"over the {self.scan.max_total_bytes}-byte workspace limit", rel)
            return False
        return True

    def _text(self, rel: str, data: bytes, size: int, report: ScanReport) -> str | None:
        text = _decode(data)
        if text is None:
            report.skip("binary", rel)
            return None
        if size > self.scan.max_file_bytes:
            report.skip(f"truncated at {self.scan.max_file_bytes} bytes", rel)
        report.files += 1
        report.bytes += len(data)
        return text

    def from_directory(self, root: Path, report: ScanReport) -> list[tuple[str, str]]:
        out = []
        root = Path(root)
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            here = Path(dirpath)
            kept = []
            for d in sorted(dirnames):
                rel = (here / d).relative_to(root).as_posix()
                if (here / d).is_symlink():
                    report.skip("symlink (not followed)", rel)
                elif d in self.scan.skip_dirs:
                    report.skip("vendored or generated directory", rel + "/")
                else:
                    kept.append(d)
            dirnames[:] = kept
            for name in sorted(filenames):
                p = here / name
                rel = p.relative_to(root).as_posix()
                if p.is_symlink():
                    report.skip("symlink (not followed)", rel)
                    continue
                if not p.is_file():
                    continue
                size = p.stat().st_size
                if not self._accept(rel, report.files, report.bytes, report):
                    continue
                with open(p, "rb") as fh:
                    data = fh.read(self.scan.max_file_bytes)
                text = self._text(rel, data, size, report)
                if text is not None:
                    out.append((rel, text))
        return out

    def from_git(self, repo: Path, commit: str, report: ScanReport) -> list[tuple[str, str]]:
        listing = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-l", "-z", commit], capture_output=True)
        if listing.returncode != 0:
            raise ValueError(
                f"environment.repository: cannot list {commit} in {repo}: "
                f"{listing.stderr.decode(errors='replace').strip()}"
            )
        wanted: list[tuple[str, str, int]] = []
        projected = 0
        for entry in filter(None, listing.stdout.split(b"\0")):
            meta, _, path = entry.partition(b"\t")
            mode, kind, sha, size = meta.split()
            rel = path.decode(errors="replace")
            if kind == b"commit":
                report.skip("submodule (not read)", rel)
                continue
            if kind != b"blob":
                continue
            if mode == b"120000":
                report.skip("symlink (not followed)", rel)
                continue
            n = int(size) if size.isdigit() else 0
            if n > _NOT_READ_FACTOR * self.scan.max_file_bytes:
                report.skip(f"over {_NOT_READ_FACTOR * self.scan.max_file_bytes} bytes (not read)", rel)
                continue
            if self._accept(rel, len(wanted), projected, report):
                wanted.append((rel, sha.decode(), n))
                projected += min(n, self.scan.max_file_bytes)
        if not wanted:
            return []
        batch = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "--batch"],
            input="".join(f"{sha}\n" for _, sha, _ in wanted).encode(),
            capture_output=True,
        )
        data, pos, out = batch.stdout, 0, []
        for rel, _, size in wanted:
            header_end = data.index(b"\n", pos)
            header = data[pos:header_end].split()
            if len(header) < 3:  # "<sha> missing": a shallow or partial clone
                report.skip("blob missing from the repository", rel)
                pos = header_end + 1
                continue
            n = int(header[2])
            body = data[header_end + 1 : header_end + 1 + n]
            pos = header_end + 1 + n + 1
            text = self._text(rel, body[: self.scan.max_file_bytes], size, report)
            if text is not None:
                out.append((rel, text))
        return out

    def files(self, task: Task) -> tuple[list[tuple[str, str]], ScanReport]:
        """(relative path, text) of the workspace's files, and the scan report (cached per workspace)."""
        src = task.workspace_path()
        repo = task.spec.environment.repository
        if src is not None and src.is_dir():
            key = (str(src.resolve()), task.workspace_digest)
        elif repo is not None:
            key = ("commit", repo.commit)  # a commit's tree is the same wherever it is read
        else:
            return [], ScanReport()
        if key not in self._cache:
            report = ScanReport()
            if repo is None:
                found = self.from_directory(src, report)
            else:
                found = self.from_git(self._git_dir(task.base_dir, repo.path, repo.commit), repo.commit, report)
            self._cache[key] = (found, report)
        return self._cache[key]

    def _git_dir(self, base_dir: str, path: str, commit: str) -> Path:
        def source() -> Path:
            return repository_dir(base_dir, path)

        return source() if self.data_dir is None else gitstore.commit_dir(self.data_dir, commit, source)


def task_fields(task: Task, reader: WorkspaceReader) -> tuple[list[FieldText], ScanReport]:
    """Every comparable text of a task, and what its workspace scan left out."""
    spec = task.spec
    out = [FieldText("instruction", spec.instruction, None, None)]
    files, report = reader.files(task)
    globs = protected_globs(task)
    for rel, text in files:
        kind = "tests" if matches(rel, globs) else "workspace"
        out.append(FieldText(kind, text, rel, is_python_path(rel) or False))
    ref = spec.reference_solution
    out += patch_fields("solution", task.reference_patch)
    if ref.commands:
        out.append(FieldText("solution", "\n".join(ref.commands), None, None))
    out += patch_fields("tests", task.test_patch)
    v = spec.verification
    if v.tests is not None:
        out.append(FieldText("tests", " ".join(t.split("::")[-1] for t in v.tests.ids), "required test names", False))
    for rel, data in sorted(task.verifier_bytes().items()):
        text = _decode(data[: reader.scan.max_file_bytes])
        if text is None:
            report.skip("binary", f"verifier/{rel}")
        else:
            out.append(FieldText("verifier", text, rel, is_python_path(rel) or False))
    commands = [c.run for c in v.checkpoints] + [c.stdout_pattern for c in v.checkpoints if c.stdout_pattern]
    if commands:
        out.append(FieldText("verifier", "\n".join(commands), "checkpoints", None))
    return [f for f in out if f.text.strip()], report


def dedup_text(task: Task) -> str:
    """What task-vs-task dedup compares: what makes a task this task. Not the workspace, which
    tasks of one repository share."""
    parts = [task.spec.instruction]
    parts += [f.text for f in patch_fields("solution", task.reference_patch)]
    if task.spec.reference_solution.commands:
        parts.append("\n".join(task.spec.reference_solution.commands))
    parts += [f.text for f in patch_fields("tests", task.test_patch)]
    tests = task.spec.verification.tests
    if tests is not None:
        parts.append(" ".join(t.split("::")[-1] for t in tests.ids))
    return "\n".join(p for p in parts if p)
