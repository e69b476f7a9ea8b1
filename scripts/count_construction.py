"""The construction workload whose instructions docs/benchmarks.md ("Construction time") counts:
the 31 top-10 Roller constructions of roller-table1 on the v100 preset and cpu-core on an AVX2
core with the development machine's caches (`tests/test_invariants.detected_cpu("avx2", 2, 32
KiB, 512 KiB)`), each expression read from tests/fixtures/tensor_exprs.json as the fast test lane
reads it (no TVM). Counted by callgrind, whose count does not move with the machine's load:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.run python scripts/count_construction.py
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.load python scripts/count_construction.py --load-only

The construction's instructions are the first count less the second (imports and expressions).
`--policy markov` counts Gensor's walk instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["WORKBENCH_TEST_LANE"] = "fast"  # tests/conftest.py: expressions from the fixture, no TVM
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers import device, suite_workloads, workload_expr  # noqa: E402
from test_invariants import KIB, detected_cpu  # noqa: E402

from workbench.construct.space import Options  # noqa: E402
from workbench.construct.stepper import construct  # noqa: E402


def jobs() -> list:
    """(expression, device) of every construction counted, in the order they run."""
    cpu = detected_cpu("avx2", 2, 32 * KIB, 512 * KIB)
    return ([(workload_expr(w), device("v100")) for w in suite_workloads("roller-table1")]
            + [(workload_expr(w), cpu) for w in suite_workloads("cpu-core")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-only", action="store_true", help="build the expressions and devices, construct nothing")
    parser.add_argument("--policy", default="roller")
    args = parser.parse_args()
    work = jobs()
    if not args.load_only:
        for expr, dev in work:
            construct(expr, dev, args.policy, Options(topk=10))


if __name__ == "__main__":
    main()
