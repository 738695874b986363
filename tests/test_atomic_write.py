"""safefs.write_atomic / atomic_writer: the one way envforge replaces a file that others may be reading."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from envforge.quality.corpora import CorpusRegistry
from envforge.safefs import atomic_writer, write_atomic

SIZE = 1 << 20  # large enough that a plain write is visible half-done


def _content(writer: int, round_: int) -> bytes:
    head = f"{writer}:{round_}:".encode()
    return head + bytes([65 + writer]) * (SIZE - len(head) - 4) + b"END\n"


def _write_many(path: str, writer: int, rounds: int) -> None:
    for r in range(rounds):
        write_atomic(Path(path), _content(writer, r))


def test_concurrent_writers_never_leave_a_torn_file_or_a_temp_file(tmp_path):
    path = tmp_path / "state.bin"
    write_atomic(path, _content(0, 0))
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_write_many, args=(str(path), w, 15)) for w in range(4)]
    for p in writers:
        p.start()
    reads = 0
    while any(p.is_alive() for p in writers) or reads == 0:
        data = path.read_bytes()
        writer, round_ = (int(x) for x in data.split(b":", 2)[:2])
        assert data == _content(writer, round_), "a reader saw a torn or half-written file"
        reads += 1
    for p in writers:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert reads > 1
    assert sorted(os.listdir(tmp_path)) == ["state.bin"]  # no temporary file left behind


def test_text_and_bytes_and_the_usual_permissions(tmp_path):
    text = write_atomic(tmp_path / "a.json", '{"é": 1}\n')
    assert text.read_text(encoding="utf-8") == '{"é": 1}\n'
    write_atomic(tmp_path / "a.json", b"\x00\x01")
    assert (tmp_path / "a.json").read_bytes() == b"\x00\x01"
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temp(tmp_path):
    path = write_atomic(tmp_path / "index.npz", b"old")
    with pytest.raises(RuntimeError):
        with atomic_writer(path) as fh:
            fh.write(b"half of the new")
            raise RuntimeError("crash mid-write")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["index.npz"]


def test_numpy_writes_through_the_file_object_to_the_exact_name(tmp_path):
    path = tmp_path / "bands.npz"
    with atomic_writer(path) as fh:
        np.savez(fh, a=np.arange(3))
    with np.load(path) as z:
        assert z["a"].tolist() == [0, 1, 2]
    assert os.listdir(tmp_path) == ["bands.npz"]


def test_corpus_registry_written_from_many_threads_stays_whole(tmp_path):
    """The registry used one fixed `corpora.tmp`: two writers renamed each other's file away."""
    registry = CorpusRegistry(tmp_path)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(40):
                registry._write({f"corpus-{n}": f"/data/{n}/{i}.jsonl"})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(registry.load()) == 1
    assert os.listdir(tmp_path) == ["corpora.json"]
