"""The RPC runner: time kernels on remote machines through a TVM RPC tracker.

The standard TVM way: `tvm.rpc.connect_tracker(host, port).request(key, priority,
session_timeout)` gives a session on a free server registered under `key`; the library built
here is uploaded (`remote.upload`), loaded (`remote.load_module`), checked against numpy and timed
with `time_evaluator` on the remote device. One thread per registered server measures one
candidate per session, so several candidates are timed at once on different servers.

Every wait is bounded: TVM's tracker client retries a refused connection for a minute and waits
for a free server forever, so the tracker is probed with a timeout first, and requests run with
a socket timeout and a single try.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Sequence

from workbench.codegen import targets
from workbench.errors import UserError, first_line
from workbench.profile.runner import BuiltCandidate, Measurement, Report, Timing, check_and_time, measurement_from_check
from workbench.versions import versions
from workbench.workers import fan_out

# tvm.rpc.base.RPC_TRACKER_MAGIC: the tracker answers a client's magic with the same four bytes.
TRACKER_MAGIC = 0x2F271
PROBE_TIMEOUT_S = 10.0
# How long a request may wait for a free server before the candidate is recorded as not run.
REQUEST_WAIT_S = 120.0


def parse_tracker(text: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); UserError otherwise."""
    host, sep, port = (text or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--tracker '{text}': expected HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)


def probe_tracker(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise UserError unless a TVM RPC tracker answers at host:port within `timeout_s`."""
    where = f"rpc tracker {host}:{port}"
    magic = struct.pack("<i", TRACKER_MAGIC)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(magic)
            reply = sock.recv(4)
    except ConnectionRefusedError:
        raise UserError(f"{where}: connection refused") from None
    except socket.timeout:
        raise UserError(f"{where}: no answer within {timeout_s:g} s") from None
    except OSError as err:
        raise UserError(f"{where}: {err.strerror or err}") from None
    if reply != magic:
        raise UserError(f"{where}: not a TVM RPC tracker")


def connect_rpc(tracker: str, key: str, *, wait_s: float = REQUEST_WAIT_S) -> "RpcRunner":
    """An RpcRunner for `key` on the tracker at `tracker` (HOST:PORT), after checking that the
    tracker answers and has at least one server under `key`; UserError otherwise."""
    if not key:
        raise UserError("--key: the RPC runner needs the device key its servers registered with")
    host, port = parse_tracker(tracker)
    probe_tracker(host, port)
    session = _tracker_session(host, port, PROBE_TIMEOUT_S)
    try:
        summary = session.summary()
    finally:
        session.close()
    keys = [str(s.get("key", "")).removeprefix("server:") for s in summary.get("server_info", [])]
    servers = keys.count(key)
    if not servers:
        known = ", ".join(sorted(set(keys))) or "none"
        raise UserError(f"rpc tracker {host}:{port}: no server registered with key '{key}' (keys: {known})")
    return RpcRunner(host, port, key, servers, wait_s)


def rpc_error(err: BaseException) -> str:
    """One line of an RPC error: TVM puts the remote's message after an "Error caught from RPC
    call:" header line."""
    _, _, remote = str(err).partition("Error caught from RPC call:")
    return first_line(remote.strip() or err)


def _tracker_session(host: str, port: int, timeout_s: float):
    from tvm import rpc

    session = rpc.connect_tracker(host, port)
    # TrackerSession has no timeout of its own; its socket is the only handle on the wait.
    session._sock.settimeout(timeout_s)
    return session


class RpcRunner:
    """Times kernels on the servers registered under `key`, `servers` candidates at a time."""

    needs_library = True

    def __init__(self, host: str, port: int, key: str, servers: int, wait_s: float = REQUEST_WAIT_S):
        self.host, self.port, self.key = host, port, key
        self.servers = servers
        self.wait_s = wait_s
        self.name = f"rpc:{key}@{host}:{port}"

    def measure(self, expr, built: Sequence[BuiltCandidate], timing: Timing, report: Report) -> None:
        slots = list(range(min(self.servers, len(built))))
        fan_out(built, slots, lambda _slot, b: self.measure_one(expr, b, timing), lambda _i, m: report(m))

    def measure_one(self, expr, built: BuiltCandidate, timing: Timing) -> Measurement:
        """Check and time one candidate in its own session (runs in a fan-out thread)."""
        try:
            remote = self._request(timing.timeout_s)
        except (RuntimeError, OSError) as err:
            return Measurement(built.rank, self.name, error=f"rpc: no session: {rpc_error(err)}")
        try:
            name = os.path.basename(built.library)
            # The bytes, not the path: TVM's upload(path) leaves the file open.
            remote.upload(bytearray(Path(built.library).read_bytes()), target=name)
            module = remote.load_module(name)
            kind = built.target_kind
            dev = remote.device(targets.target(kind).runtime_device, 0)
            if not dev.exist:
                return Measurement(built.rank, self.name, error=f"rpc: the server has no {kind} device")
            check, seconds = check_and_time(module, built, dev, expr, timing)
        except Exception as err:  # TVM's RPC errors have many types; each is this candidate's failure
            return Measurement(built.rank, self.name, error=f"rpc: {rpc_error(err)}")
        return measurement_from_check(built.rank, self.name, check, seconds, tuple(sorted(versions().items())))

    def _request(self, session_timeout_s: float):
        """A session on a free server; the server ends it after `session_timeout_s`."""
        tracker = _tracker_session(self.host, self.port, self.wait_s)
        try:
            return tracker.request(self.key, priority=1, session_timeout=session_timeout_s, max_retry=1)
        finally:
            tracker.close()
