"""Files and folders from places envforge does not trust (task sources written by other teams), and
files envforge writes that readers must never see half-written (`write_atomic`, `atomic_writer`).

Three rules hold everywhere a source's files are read or copied:
- a path resolves (symlinks followed) inside the folders it is allowed to reach, or it is refused;
- inside a tree, a symlink is kept as a link only when its target stays inside that tree;
  absolute targets and targets that leave the tree are refused, never followed;
- only regular files are read: a FIFO, a socket or a device is refused by its type before it
  is opened, and files are opened non-blocking, so reading never hangs.

Functions raise `UnsafePath` (a ValueError) with a message naming the path and the rule; the
source parsers turn it into a reject naming the record and the field.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

PAGE = 4096


class UnsafePath(ValueError):
    """A path breaks a confinement rule, or is not a regular file where one is needed."""


def real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def within(path: Path, root: Path) -> bool:
    """Whether path (already real) is root or below it."""
    return path == root or root in path.parents


def confine(base: Path, rel: str, roots: Iterable[Path] = ()) -> Path:
    """The real path `rel` names relative to `base`, if it lies inside base or one of roots."""
    if "\0" in rel:
        raise UnsafePath(f"{rel!r} contains a NUL character")
    target = real(base / rel)
    allowed = [real(base), *(real(r) for r in roots)]
    if not any(within(target, a) for a in allowed):
        shown = ", ".join(str(r) for r in allowed[1:]) or "none"
        raise UnsafePath(
            f"{rel!r} resolves to {target}, outside the source's folder {allowed[0]} and the allowed "
            f"roots ({shown}); set ENVFORGE_SOURCE_ROOTS to allow another folder"
        )
    return target


def kind_of(mode: int) -> str:
    """What a file is, in words, from its st_mode."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"


def read_regular(path: Path, cap: int) -> bytes:
    """The bytes of a regular file of at most `cap` bytes; never blocks, never follows the last link."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UnsafePath(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} is {kind_of(st.st_mode)}, not a regular file")
    if st.st_size > cap:
        raise UnsafePath(f"{path} is {st.st_size} bytes, over the {cap}-byte limit")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnsafePath(f"cannot open {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between stat and open
            raise UnsafePath(f"{path} is not a regular file")
        chunks, size = [], 0
        while size <= cap:
            chunk = fh.read(min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > cap:
        raise UnsafePath(f"{path} is over the {cap}-byte limit")
    return b"".join(chunks)


def decode_utf8(data: bytes, what: str) -> str:
    """UTF-8 text with a leading byte-order mark dropped; names the offset of an invalid byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsafePath(f"{what} is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None


@dataclass
class TreeScan:
    """What a folder holds, once every entry passed the rules."""

    files: list[str] = field(default_factory=list)  # regular files, relative posix paths, sorted
    links: dict[str, str] = field(default_factory=dict)  # symlink -> its (relative, inside) target
    bytes: int = 0
    footprint: int = 0  # tmpfs bytes the tree needs in a sandbox: pages of each file and of its git object


def _roundup(n: int) -> int:
    return max(PAGE, -(-n // PAGE) * PAGE)


def scan_tree(root: Path, max_problems: int = 10) -> TreeScan:
    """Walk a folder without following links; UnsafePath lists every entry that breaks a rule."""
    root_real = real(root)
    if not root_real.is_dir():
        raise UnsafePath(f"{root} is not a directory")
    scan = TreeScan()
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root_real):
        dirnames.sort()
        here = Path(dirpath)
        kept = []
        for name in sorted(dirnames) + sorted(filenames):
            path = here / name
            rel = path.relative_to(root_real).as_posix()
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                kept.append(name)
                scan.footprint += 2 * PAGE
            elif stat.S_ISREG(st.st_mode):
                scan.files.append(rel)
                scan.bytes += st.st_size
                scan.footprint += 2 * _roundup(st.st_size)
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                if os.path.isabs(target):
                    problems.append(
                        f"{rel}: a symlink to the absolute path {target!r} (only relative links that "
                        "stay inside the folder are kept)"
                    )
                elif not within(real(path), root_real):
                    problems.append(f"{rel}: a symlink to {target!r}, which leaves the folder")
                else:
                    scan.links[rel] = target
                    scan.footprint += 2 * PAGE
            else:
                problems.append(f"{rel}: {kind_of(st.st_mode)} (only regular files, folders and inside links)")
        dirnames[:] = [d for d in dirnames if d in kept]
    if problems:
        more = f" (and {len(problems) - max_problems} more)" if len(problems) > max_problems else ""
        raise UnsafePath(f"{root}: " + "; ".join(problems[:max_problems]) + more)
    scan.files.sort()
    return scan


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a folder that passes `scan_tree`: regular files with their modes, inside links as links."""
    scan = scan_tree(src)
    src_real = real(src)
    dest.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, _ in os.walk(src_real):
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink():
                (dest / p.relative_to(src_real)).mkdir(parents=True, exist_ok=True)
    for rel in scan.files:
        data = read_regular(src_real / rel, cap=1 << 34)
        out = dest / rel
        out.write_bytes(data)
        shutil.copymode(src_real / rel, out)
    for rel, target in scan.links.items():
        os.symlink(target, dest / rel)


@contextmanager
def atomic_writer(path: Path | str, durable: bool = True) -> Iterator[IO[bytes]]:
    """A binary file whose bytes become `path` whole when the block ends, or not at all when it raises.

    The bytes go to a temporary file next to `path` (a dot-file with a random name, so concurrent
    writers never share one and globs like `*.json` never see it), are flushed to disk, and the
    file is renamed over `path`: a reader sees the old content or the new, never part of either,
    and the last writer to finish wins. The data reaches the disk before the rename, so a crash
    leaves the old content or the new, never an empty file; the directory is not synced, so a crash
    right after the rename may keep the old content. The file gets the usual permissions (0666
    less the umask). `durable=False` skips the fsync (about 4.5 ms a file here): for files written
    by the thousand that a resumed run redoes anyway (one rollout trajectory each), where the
    rename alone keeps readers from ever seeing a partial file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, data: str | bytes, encoding: str = "utf-8", durable: bool = True) -> Path:
    """Make `path` hold `data` (text is encoded), never visible half-written (see `atomic_writer`)."""
    with atomic_writer(path, durable) as fh:
        fh.write(data.encode(encoding) if isinstance(data, str) else data)
    return Path(path)


__all__ = [
    "TreeScan",
    "UnsafePath",
    "atomic_writer",
    "confine",
    "copy_tree",
    "decode_utf8",
    "kind_of",
    "read_regular",
    "real",
    "scan_tree",
    "within",
    "write_atomic",
]
