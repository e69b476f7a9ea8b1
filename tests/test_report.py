"""`workbench report`: one self-contained HTML file of a stored run or of a comparison, which
Debian's headless chromium, with every network request sent to a proxy that does not exist,
opens from disk and draws every figure of."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import fake_runs_store
from workbench.cli import main
from workbench.profile.fake import FakeRunner
from workbench.profile.store import RunStore

CHROMIUM = Path("/usr/bin/chromium")
# No network: every request, loopback included, goes to a proxy on the discard port where nothing
# listens, so a report that fetched anything (plotly from a CDN, a font) would draw nothing.
OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--proxy-server=http://127.0.0.1:9",
           "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=15000", "--dump-dom"]
RENDER_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """"base" and "slow" (every kernel 10 % slower) runs of two matmuls, and one run whose
    candidate of rank 2 computed a wrong result."""
    path = tmp_path_factory.mktemp("report") / "runs.sqlite3"
    return fake_runs_store(path, [("base", FakeRunner(seed=5, incorrect=frozenset({2}))),
                                  ("slow", FakeRunner(seed=5, scale=2.2))])


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rendered(path: Path, tmp_path: Path) -> str:
    """The DOM chromium has once it ran the page's scripts, opened from the file."""
    done = subprocess.run([str(CHROMIUM), *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}", path.as_uri()],
                          capture_output=True, text=True, timeout=RENDER_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def figures_drawn(dom: str, count: int) -> None:
    """Each of the `count` figures became a plotly plot with an SVG and drawn points."""
    starts = [dom.index(f'id="figure-{i}"') for i in range(count)] + [len(dom)]
    assert f'id="figure-{count}"' not in dom
    for i in range(count):
        part = dom[starts[i]:starts[i + 1]]
        assert "js-plotly-plot" in part and 'class="main-svg"' in part, f"figure {i} was not drawn"
        assert re.search(r'class="point[ "]', part), f"figure {i} has no points"


def self_contained(page: str) -> None:
    assert page.count("<script") == page.count("<script type=\"text/javascript\">") + page.count("<script>")
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page), "the report fetches something"


def test_a_run_report_is_one_file_chromium_draws_offline(capsys, store_path, tmp_path):
    with RunStore(store_path) as store:
        run_id = store.runs()[0].id
    out = tmp_path / "run.html"
    code, text, _ = run(capsys, "report", "--db", str(store_path), "--run", str(run_id), "--out", str(out))
    assert code == 0 and text.strip() == f"wrote {out}: run {run_id}"
    page = out.read_text()
    self_contained(page)
    for section in ("Workload", "Device", "Provenance", "Candidates", "Predicted vs measured", "Roofline", "Diagnosis"):
        assert f"<h2>{section}</h2>" in page
    assert "spec_sha256" in page and "git_commit" in page and "% peak compute" in page
    assert "wrong result: fake" in page  # the incorrect candidate's row says why it has no time
    assert "of peak compute (" in page and "binds" in page
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (`make test` installs it)")
    figures_drawn(rendered(out, tmp_path), 2)


def test_a_comparison_report_draws_the_forest_plot_offline(capsys, store_path, tmp_path):
    out = tmp_path / "compare.html"
    code, text, _ = run(capsys, "report", "--db", str(store_path), "--a", "label=base", "--b", "label=slow",
                        "--drift", "0.3", "--out", str(out), "--json")  # fake runs do not drift
    assert code == 0 and '"bytes"' in text
    page = out.read_text()
    self_contained(page)
    assert page.count("<td>slower</td>") == 2 and "B / A per workload" in page
    assert "drift prior of 0.3%" in page and page.count("<td>1 / 1</td>") == 2 and page.count("<td>drift floor</td>") == 2
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (`make test` installs it)")
    dom = rendered(out, tmp_path)
    figures_drawn(dom, 1)
    assert len(re.findall(r'class="point[ "]', dom)) >= 2  # a marker per workload


def test_a_report_of_several_runs_has_a_section_and_figures_each(capsys, store_path, tmp_path):
    """A whole model's operators profiled under one label (`model --run --pick measured --label`)
    report together: a summary row and the sections of each run."""
    out = tmp_path / "runs.html"
    code, text, _ = run(capsys, "report", "--db", str(store_path), "--runs", "label=slow", "--out", str(out))
    assert code == 0 and text.strip() == f"wrote {out}: runs label=slow"
    page = out.read_text()
    self_contained(page)
    with RunStore(store_path) as store:
        slow = [r for r in store.runs() if r.label == "slow"]
    assert page.count("<h2>Roofline</h2>") == 2 and 'id="figure-3"' in page and 'id="figure-4"' not in page
    assert all(f"Run {r.id}: {r.workload} on tiny-cpu" in page for r in slow)
    assert page.count("plotly.js v") == 1  # plotly's source inlined once, for every figure


@pytest.mark.parametrize("argv, needle", [
    (("--out", "x.html"), "give one of --run ID, --runs SEL, or both --a SEL and --b SEL"),
    (("--run", "1", "--a", "label=base", "--out", "x.html"), "give one of --run ID"),
    (("--run", "1", "--runs", "label=base", "--out", "x.html"), "give one of --run ID"),
    (("--runs", "label=none", "--out", "x.html"), "--runs 'label=none': no run in"),
    (("--a", "label=base", "--out", "x.html"), "needs both --a SEL and --b SEL"),
    (("--run", "999", "--out", "x.html"), "--run 999: no such run"),
    (("--a", "label=base", "--b", "labl=x", "--out", "x.html"), "unknown key 'labl'"),
])
def test_report_bad_input_is_one_line_exit_2(capsys, store_path, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "report", "--db", str(store_path), *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.html").exists()
