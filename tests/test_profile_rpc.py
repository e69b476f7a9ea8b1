"""The RPC runner against a real TVM tracker with two servers on loopback: four candidates are
measured in parallel on both servers; an unreachable tracker, a silent port and an unknown key
are clean UserErrors within bounded time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from functools import lru_cache

import pytest

from tests.helpers import TINY_CPU, matmul
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.profile.rpc import connect_rpc, parse_tracker, probe_tracker
from workbench.profile.runner import Timing
from workbench.profile.session import build_library, profile_candidates

KEY = "workbench-test"
START_WAIT_S = 60  # the tracker and servers each import TVM; a loaded 2-core machine is slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(args: list[str], log_path) -> subprocess.Popen:
    # Own process group: the server forks a worker per session; killpg ends them all.
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def servers_registered(port: int) -> int:
    from tvm import rpc

    try:
        probe_tracker("127.0.0.1", port, timeout_s=2)
    except UserError:
        return 0
    session = rpc.connect_tracker("127.0.0.1", port)
    try:
        summary = session.summary()
    finally:
        session.close()
    return sum(s["key"] == f"server:{KEY}" for s in summary["server_info"])


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
    pytest.importorskip("cloudpickle", reason="TVM's RPC server needs cloudpickle")
    logs = tmp_path_factory.mktemp("rpc")
    port = free_port()
    procs = []
    try:
        procs.append(launch(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                             "--port-end", str(port + 1)], logs / "tracker.log"))
        for i in range(2):
            server_port = free_port()
            procs.append(launch(["tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", KEY,
                                 "--host", "127.0.0.1", "--port", str(server_port), "--port-end", str(server_port + 1)],
                                logs / f"server{i}.log"))
        deadline = time.monotonic() + START_WAIT_S
        while servers_registered(port) < 2:
            assert time.monotonic() < deadline, "the RPC tracker and servers did not come up"
            assert all(p.poll() is None for p in procs), "an RPC process exited"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", logs
    finally:
        for proc in procs:
            stop(proc)


@lru_cache(maxsize=None)
def mm64():
    return construct(matmul(64, 64, 64), TINY_CPU, options=Options(topk=4))


def test_four_candidates_are_measured_on_both_servers(tracker):
    address, logs = tracker
    c = mm64()
    assert len(c.candidates) == 4
    result = profile_candidates(c.expr, TINY_CPU, c.candidates, runner="rpc", tracker=address, key=KEY,
                                timing=Timing(repeat=2, min_repeat_ms=1, timeout_s=60))
    assert [m.correct for m in result.measurements] == [True] * 4, [m.error for m in result.measurements]
    assert all(m.best_seconds > 0 and m.runner == f"rpc:{KEY}@{address}" for m in result.measurements)
    sessions = [(logs / f"server{i}.log").read_text().count("connected from") for i in range(2)]
    assert sum(sessions) == 4 and all(sessions), sessions


def test_an_unknown_key_is_a_user_error(tracker):
    address, _ = tracker
    with pytest.raises(UserError, match=f"no server registered with key 'nope' \\(keys: {KEY}\\)"):
        connect_rpc(address, "nope")


def test_an_unreachable_tracker_is_refused_at_once():
    port = free_port()  # bound then released: nothing listens there
    start = time.monotonic()
    with pytest.raises(UserError, match=f"^rpc tracker 127.0.0.1:{port}: connection refused$"):
        connect_rpc(f"127.0.0.1:{port}", KEY)
    assert time.monotonic() - start < 5


def test_a_silent_port_times_out():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # the kernel accepts the connection; nobody ever answers
        port = listener.getsockname()[1]
        with pytest.raises(UserError, match="no answer within 0.3 s"):
            probe_tracker("127.0.0.1", port, timeout_s=0.3)


def test_tracker_addresses_are_checked():
    assert parse_tracker("10.0.0.1:9190") == ("10.0.0.1", 9190)
    for bad in ("", "host", "host:", ":9190", "host:port", "host:70000"):
        with pytest.raises(UserError, match="expected HOST:PORT"):
            parse_tracker(bad)
    with pytest.raises(UserError, match="--key"):
        connect_rpc("127.0.0.1:9190", "")


def test_a_library_the_server_cannot_load_fails_alone(tracker, tmp_path):
    address, _ = tracker
    c = mm64()
    good = build_library(c.expr, c.candidates[0].program, TINY_CPU, 1, 1e-6, str(tmp_path / "good.so"))
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not a shared library")
    bad = replace(good, rank=2, library=str(garbage))
    got = []
    start = time.monotonic()
    connect_rpc(address, KEY).measure(c.expr, [bad, good], Timing(repeat=2, min_repeat_ms=1), got.append)
    assert time.monotonic() - start < 30
    by_rank = {m.rank: m for m in got}
    assert by_rank[1].correct is True
    assert by_rank[2].correct is None and by_rank[2].error.startswith("rpc: ")
    assert "Failed to load dynamic shared library" in by_rank[2].error
