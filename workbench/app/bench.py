"""Benchmark: how long a Next click on the Construction page takes to re-render, server side.

`python -m workbench.app.bench [--workload SUITE:ID] [--device NAME] [--policy P] [--topk K]`
drives the page with Streamlit's AppTest: it constructs the workload, moves the slider to
`clicks` steps before the end (where the graph is largest) and times each Next click, every one
a step not seen before (no figure cache hit). What it times: the script rerun (stepper, graph,
figures) and the serialisation of every element, the plotly JSON included; not the websocket
transfer or the browser drawing the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "page_construction.py"
NEXT = 2  # index of the Next button: Reset, Back, Next, Play to end


def next_click_seconds(workload: str, device: str, policy: str = "roller", topk: int = 200,
                       max_steps: int = 30_000, clicks: int = 20) -> dict:
    """Timings (seconds) of `clicks` Next clicks near the end of the construction, and its size."""
    from streamlit.testing.v1 import AppTest

    from workbench import pipeline

    at = AppTest.from_file(str(PAGE), default_timeout=600)
    at.session_state["selection"] = pipeline.request(workload, device, policy,
                                                     pipeline.Options(topk=topk, max_steps=max_steps))
    at.run()
    stepper = at.session_state["stepper"]
    at.slider[0].set_value(max(0, len(stepper.steps) - clicks - 1)).run()
    times = []
    for _ in range(clicks):
        start = time.perf_counter()
        at.button[NEXT].click().run()
        times.append(time.perf_counter() - start)
    if at.exception:
        raise RuntimeError(at.exception[0].message)
    counts = stepper.graph().counts()
    return {"workload": workload, "device": device, "policy": policy, "steps": len(stepper.steps), **counts,
            "clicks": clicks, "median_seconds": statistics.median(times), "max_seconds": max(times)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cpu-core:bmm-attn")
    parser.add_argument("--device", default="xeon-avx512")
    parser.add_argument("--policy", default="roller")
    parser.add_argument("--topk", type=int, default=200)
    parser.add_argument("--clicks", type=int, default=20)
    args = parser.parse_args(argv)
    print(json.dumps(next_click_seconds(args.workload, args.device, args.policy, args.topk, clicks=args.clicks), indent=2))


if __name__ == "__main__":
    main()
