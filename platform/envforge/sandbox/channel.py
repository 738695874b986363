"""The host end of the agent protocol: JSON lines over a container's attach socket.

The attach stream of a non-TTY container multiplexes stdout and stderr in frames (an 8-byte
header: stream id, three zero bytes, big-endian length). Requests go to the agent's stdin
raw. One request is in flight per channel; callers serialise with the lock.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import threading
import time
from typing import Any, Callable

import docker

_HEADER = struct.Struct(">BxxxL")
STDOUT, STDERR = 1, 2


class AgentDead(Exception):
    """The agent's stream ended or broke: the agent process (or its container) is gone."""


class AgentTimeout(Exception):
    """No response within the host-side deadline."""


class AgentChannel:
    def __init__(self, client: docker.DockerClient, container_id: str):
        self._sock_wrapper = client.api.attach_socket(
            container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        self._sock: socket.socket = getattr(self._sock_wrapper, "_sock", self._sock_wrapper)
        self._buf = bytearray()  # undecoded frame bytes
        self._lines = bytearray()  # decoded stdout bytes not yet split into lines
        self.stderr_tail = bytearray()  # the agent's own stderr (tracebacks), for diagnostics
        self._next_id = 1
        self.lock = threading.Lock()
        self.closed = False

    def request(
        self, payload: dict[str, Any], deadline_s: float, on_chunk: Callable[[str, bytes], None] | None = None
    ) -> dict[str, Any]:
        """Send one request and wait for its final response (chunk messages go to on_chunk)."""
        if self.closed:
            raise AgentDead("channel closed")
        with self.lock:
            rid = self._next_id
            self._next_id += 1
            line = json.dumps({**payload, "id": rid}, separators=(",", ":")).encode() + b"\n"
            try:
                self._sock.sendall(line)
            except OSError as exc:
                self._mark_dead()
                raise AgentDead(f"send failed: {exc}") from None
            end = time.monotonic() + deadline_s
            while True:
                msg = self._read_message(end)
                if msg.get("agent_exit"):
                    self._mark_dead()
                    tail = self.stderr_tail.decode(errors="replace").strip()[-500:]
                    raise AgentDead("agent exited" + (f"; agent stderr: {tail}" if tail else ""))
                if msg.get("id") != rid:
                    continue  # the startup banner, or a late reply to an abandoned request
                if "chunk" in msg:
                    if on_chunk is not None:
                        on_chunk(msg["chunk"], base64.b64decode(msg["data"]))
                    continue
                return msg

    def _read_message(self, end: float) -> dict[str, Any]:
        while True:
            nl = self._lines.find(b"\n")
            if nl >= 0:
                raw = bytes(self._lines[:nl])
                del self._lines[: nl + 1]
                try:
                    return json.loads(raw)
                except ValueError:
                    continue  # not ours (cannot happen unless the agent is broken): skip it
            self._fill(end)

    def _fill(self, end: float) -> None:
        """Read at least one frame's worth of bytes into the line buffer."""
        while True:
            if len(self._buf) >= _HEADER.size:
                stream, size = _HEADER.unpack_from(self._buf)
                if len(self._buf) >= _HEADER.size + size:
                    data = bytes(self._buf[_HEADER.size : _HEADER.size + size])
                    del self._buf[: _HEADER.size + size]
                    if stream == STDOUT:
                        self._lines += data
                        return
                    if stream == STDERR:
                        self.stderr_tail = (self.stderr_tail + data)[-4000:]
                    continue
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise AgentTimeout("no response from the agent before the deadline")
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(1 << 20)
            except (socket.timeout, TimeoutError):
                raise AgentTimeout("no response from the agent before the deadline") from None
            except OSError as exc:
                self._mark_dead()
                raise AgentDead(f"receive failed: {exc}") from None
            if not chunk:
                self._mark_dead()
                tail = self.stderr_tail.decode(errors="replace").strip()[-500:]
                raise AgentDead("agent stream closed" + (f"; agent stderr: {tail}" if tail else ""))
            self._buf += chunk

    def _mark_dead(self) -> None:
        self.closed = True
        self.close()

    def close(self) -> None:
        self.closed = True
        for obj in (self._sock, self._sock_wrapper):
            try:
                obj.close()
            except (OSError, AttributeError):
                pass
