"""Random suites: drawn per seed, reproducible, inside the stated distributions and bounds; the
CLI reports the seed and refuses malformed names in one line."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.errors import UserError
from workbench.ops import random_suite
from workbench.ops.catalog import normalize_params
from workbench.ops.random_suite import BOUNDS, HEAD_N, draw, draw_one, is_prime, parse_name
from workbench.workload import load_suite, suite_workload

SEEDS = range(20)  # 240 shapes of each kind: every property below shows up in them


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _matmul_cost(e: dict) -> tuple[int, int]:
    b = max(e.get("B", 0), 1)
    return 2 * b * e["M"] * e["N"] * e["K"], max(b * e["M"] * e["K"], b * e["K"] * e["N"], b * e["M"] * e["N"])


def _conv_cost(e: dict) -> tuple[int, int]:
    oh = (e["H"] + 2 * e["pad"] - e["KH"]) // e["stride"] + 1
    ow = (e["W"] + 2 * e["pad"] - e["KW"]) // e["stride"] + 1
    flops = 2 * e["N"] * e["F"] * oh * ow * e["C"] * e["KH"] * e["KW"]
    return flops, max(e["N"] * e["C"] * e["H"] * e["W"], e["F"] * e["C"] * e["KH"] * e["KW"], e["N"] * e["F"] * oh * ow)


@pytest.mark.parametrize("kind", ["random", "random-tb", "random-conv"])
def test_a_draw_is_the_same_for_a_seed_and_differs_across_seeds(kind):
    assert draw(kind, 12, 7) == draw(kind, 12, 7)
    assert draw(kind, 12, 7) != draw(kind, 12, 8)
    assert draw(kind, 3, 7) == draw(kind, 12, 7)[:3]  # shape rI depends on the seed and I, not on N
    assert [e["id"] for e in draw(kind, 4, 2**64 - 1)] == ["r0", "r1", "r2", "r3"]


@pytest.mark.parametrize("kind", ["random", "random-tb"])
def test_matmul_shapes_are_inside_the_stated_distributions(kind):
    shapes = [e for s in SEEDS for e in draw(kind, 12, s)]
    bounds = BOUNDS[kind]
    # random-tb's B is stored transposed, every shape; random's never
    assert all(e.get("trans_b", False) == (kind == "random-tb") and "trans_a" not in e for e in shapes)
    for e in shapes:
        normalize_params("matmul", {k: v for k, v in e.items() if k not in ("id", "op", "dtype")})
        flops, elements = _matmul_cost(e)
        assert bounds.min_flops <= flops <= bounds.max_flops and elements <= bounds.max_elements, e
        assert 1 <= e["M"] <= 4096 and 8 <= e["K"] <= 16384 and (16 <= e["N"] <= 8192 or e["N"] in HEAD_N), e
        assert 1 <= e.get("B", 1) <= 8, e
    extents = [e[a] for e in shapes for a in "MKN"]
    assert any(is_prime(x) and x > 2 for x in extents) and any(x % 2 and not is_prime(x) for x in extents)
    assert any(e["M"] == 1 for e in shapes) and sum(e["M"] <= 64 for e in shapes) >= len(shapes) // 5  # skinny M
    assert any(e["K"] <= 128 for e in shapes) and any(e["K"] > 2048 for e in shapes)  # small and huge K
    assert {e["B"] for e in shapes if "B" in e} == set(range(1, 9)) and any("B" not in e for e in shapes)
    assert any(e["N"] in HEAD_N for e in shapes)


def test_conv_shapes_are_inside_the_stated_distributions():
    shapes = [e for s in SEEDS for e in draw("random-conv", 12, s)]
    bounds = BOUNDS["random-conv"]
    for e in shapes:
        normalize_params("conv2d", {k: v for k, v in e.items() if k not in ("id", "op", "dtype")})
        flops, elements = _conv_cost(e)
        assert bounds.min_flops <= flops <= bounds.max_flops and elements <= bounds.max_elements, e
        assert 1 <= e["N"] <= 4 and 3 <= e["C"] <= 512 and 8 <= e["F"] <= 512, e
        assert 7 <= e["H"] <= 224 and 7 <= e["W"] <= 224 and e["KH"] == e["KW"] in (1, 3, 5, 7), e
        assert e["stride"] in (1, 2) and 0 <= e["pad"] <= e["KH"] // 2, e
    assert {e["KH"] for e in shapes} == {1, 3, 5, 7} and {e["stride"] for e in shapes} == {1, 2}
    assert any(e["pad"] == 0 and e["KH"] > 1 for e in shapes) and any(e["pad"] == e["KH"] // 2 > 0 for e in shapes)
    assert any(e["H"] % 2 for e in shapes) and any(e["H"] != e["W"] for e in shapes)
    few = [e for s in range(3) for e in draw("random-conv", 12, s)]  # a few seeds already show them
    assert any(e["C"] % 8 for e in few) and any(e["F"] % 8 for e in few)


@pytest.mark.parametrize(
    "name, message",
    [
        ("random", "give the number of shapes, random:N"),
        ("random:", "give the number of shapes, random:N"),
        ("random:0", "N must be an integer from 1 to 1000, got '0'"),
        ("random:1001", "N must be an integer from 1 to 1000, got '1001'"),
        ("random:x", "N must be an integer from 1 to 1000, got 'x'"),
        ("random:-3", "N must be an integer from 1 to 1000"),
        ("random-foo:3", "unknown random suite 'random-foo' (known: random, random-tb, random-conv)"),
    ],
)
def test_malformed_random_names_are_refused(name, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_name(name)


def test_a_random_suite_loads_with_its_seed_and_each_shape_by_its_label():
    name, workloads = load_suite("random-conv:3", seed=11)
    assert name == "random-conv@11" and [w.label for w in workloads] == [f"random-conv@11:r{i}" for i in range(3)]
    assert suite_workload("random-conv@11:r2") == workloads[2]
    assert dict(workloads[0].params) == {k: v for k, v in draw_one("random-conv", 11, 0).items()
                                         if k not in ("id", "op", "dtype")}
    with pytest.raises(UserError, match="is drawn at random: give its seed"):
        load_suite("random:3")


@pytest.mark.parametrize(
    "ref, message",
    [
        ("random:12:r3", "a drawn workload is named KIND@SEED:rI"),
        ("random@x:r3", "the seed must be an integer from 0 to 2^64-1, got 'x'"),
        (f"random@{2**64}:r3", "the seed must be an integer from 0 to 2^64-1"),
        ("random@3:r1000", "no workload 'r1000': a random suite's ids are r0 to r999"),
        ("random@3:x", "no workload 'x'"),
    ],
)
def test_bad_drawn_workload_refs_are_one_line_exit_2(capsys, ref, message):
    code, out, err = run(capsys, "construct", "--workload", ref)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1
    assert lines[0].startswith(f"workbench: error: --workload '{ref}': {message}")


@pytest.mark.parametrize("name", ["random:", "random:0", "random:x", "random-foo:3"])
@pytest.mark.parametrize("command", ["construct", "kernels"])
def test_malformed_suite_names_are_one_line_exit_2(capsys, tmp_path, command, name):
    db = ["--db", str(tmp_path / "r.db")] if command == "kernels" else []
    code, out, err = run(capsys, "bench", command, "--suite", name, *db)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith(f"workbench: error: suite '{name}'")
    assert not (tmp_path / "r.db").exists()  # refused before anything was built or stored


def test_bench_reports_a_fresh_seed_and_reproduces_the_shapes_with_it(capsys, monkeypatch):
    monkeypatch.setattr(random_suite, "fresh_seed", lambda: 2**64 - 2)  # a fresh seed as large as they come
    code, out, err = run(capsys, "bench", "construct", "--suite", "random:2", "--device", "v100", "--topk", "1", "--json")
    assert code == 0
    # said on stderr as the run starts, so that a run stopped half-way can be reproduced
    assert f"random:2 drawn with a fresh seed {2**64 - 2} (labels random@{2**64 - 2}:rI; " \
           f"reproduce with --seed {2**64 - 2})" in err.splitlines()
    fresh = json.loads(out)
    assert (fresh["seed"], fresh["seed_drawn"], fresh["suite_name"]) == (2**64 - 2, True, f"random@{2**64 - 2}")
    code, out, _ = run(capsys, "bench", "construct", "--suite", "random:2", "--device", "v100", "--topk", "1",
                       "--seed", str(2**64 - 2), "--json")
    again = json.loads(out)
    assert again["seed_drawn"] is False and again["seed"] == fresh["seed"]
    assert [r["workload"] for r in again["results"]] == [r["workload"] for r in fresh["results"]]
    code, text, _ = run(capsys, "bench", "construct", "--suite", "random:2", "--device", "v100", "--topk", "1")
    assert code == 0 and f"reproduce with --seed {2**64 - 2}" in text.splitlines()[0]


def test_bench_without_a_seed_draws_a_different_one_each_run(capsys):
    seeds = set()
    for _ in range(2):
        code, out, _ = run(capsys, "bench", "construct", "--suite", "random:1", "--device", "v100", "--topk", "1",
                           "--json")
        seeds.add(json.loads(out)["seed"])
    assert len(seeds) == 2 and all(0 <= s < 2**64 for s in seeds)


def test_bench_kernels_on_a_random_conv_times_onnxruntime_and_reports_every_ratio(capsys, tmp_path):
    """One small drawn conv (the first seed whose r0 is under 2^22 FLOPs), top 1: the default
    baseline of a conv suite is ONNX Runtime's single operator."""
    seed = next(s for s in range(10_000) if _conv_cost(draw_one("random-conv", s, 0))[0] < 2**22)
    code, out, _ = run(capsys, "bench", "kernels", "--suite", "random-conv:1", "--seed", str(seed), "--topk", "1",
                       "--db", str(tmp_path / "r.db"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["suite"], doc["suite_name"], doc["seed"], doc["seed_drawn"]) == \
        ("random-conv:1", f"random-conv@{seed}", seed, False)
    (row,) = doc["results"]
    drawn = draw_one("random-conv", seed, 0)
    assert row["id"] == "r0" and all(row["workload"][k] == v for k, v in drawn.items() if k != "id")
    assert list(row["baselines"]) == ["onnxruntime"] and row["baselines"]["onnxruntime"] > 0
    assert row["best_rank"] == 1 and row["rank1_seconds"] == row["best_seconds"] > 0
    assert row["speed_ratio"]["onnxruntime"] == pytest.approx(row["baselines"]["onnxruntime"] / row["best_seconds"])
    assert row["rank1_speed_ratio"] == row["speed_ratio"]
    assert doc["speed_ratio_geomean"]["onnxruntime"] == pytest.approx(row["speed_ratio"]["onnxruntime"])
    assert doc["rank1_speed_ratio_geomean"]["onnxruntime"] == pytest.approx(row["rank1_speed_ratio"]["onnxruntime"])
