"""The dashboard server idles: started as `make app` starts it (in the repository root, so it
reads .streamlit/config.toml), with no browser connected, it uses under 2% of a core, also after
a burst of file changes in the checkout (a build or `pip install` into .venv makes one)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from helpers import stat_cpu_ticks
from test_browser import server  # noqa: F401  (the fixture: `streamlit run app.py` on a free port)

IDLE_S = 30.0
# At most this share of one core while idle (issue: the file watcher kept a core at 100%).
IDLE_CPU_SHARE = 0.02
SETTLE_S = 3.0  # after the health check answers, the server finishes starting up
ROOT = Path(__file__).resolve().parent.parent
# Files created and removed in the checkout: more events than Linux queues for one inotify
# watcher by default (fs.inotify.max_queued_events = 16384), as a `pip install` into .venv makes.
BURST_FILES = 20_000


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` and its waited-for children (/proc/PID/stat)."""
    return stat_cpu_ticks(f"/proc/{pid}/stat", children=True) / os.sysconf("SC_CLK_TCK")


def file_burst() -> None:
    folder = Path(tempfile.mkdtemp(prefix=".idle-test-", dir=ROOT))
    try:
        for i in range(BURST_FILES):
            (folder / f"{i}.txt").write_text("x")
    finally:
        shutil.rmtree(folder)


def test_an_idle_dashboard_uses_almost_no_cpu(server):  # noqa: F811
    url, pid = server
    time.sleep(SETTLE_S)
    file_burst()
    time.sleep(SETTLE_S)
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(IDLE_S)
    share = (cpu_seconds(pid) - before) / (time.monotonic() - start)
    assert share < IDLE_CPU_SHARE, f"{url}: the idle server used {share:.1%} of a core"
