"""Content hashing for files and trees: image tags, task versions and task-set versions
all derive from these, so a change anywhere in a recipe or a task changes its identity."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Iterable


def iter_tree(root: Path) -> Iterable[Path]:
    """Files under root in a stable order (symlinks are listed, not followed)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name


def tree_digest(root: Path) -> str:
    """sha256 over relative paths, modes and bytes of every file under root.

    Only regular files are read (a FIFO or a socket is hashed by its type, never opened), so
    hashing a folder someone else controls cannot hang.
    """
    h = hashlib.sha256()
    for path in iter_tree(root):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        h.update(rel.encode() + b"\0" + oct(st.st_mode & 0o777).encode() + b"\0")
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(path).encode())
        elif stat.S_ISREG(st.st_mode):
            h.update(path.read_bytes())
        else:
            h.update(f"<special {stat.S_IFMT(st.st_mode):o}>".encode())
        h.update(b"\0")
    return h.hexdigest()


def digest_parts(*parts: str | bytes) -> str:
    """sha256 of several values, unambiguously separated."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()
