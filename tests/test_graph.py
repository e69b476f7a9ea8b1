"""The construction graph: what `add` records, and JSON round trips."""

import json

from helpers import device, expr, matmul

from workbench.construct.graph import ConstructionGraph, Edge, Node, node_key
from workbench.construct.stepper import construct


def _node(key, status="explored", score=None, tile=(1, 2)):
    return Node(key, 0, "registers", tile, 16, 384, 1024, score, status)


def test_node_key_names_the_tiles_above_then_this_one():
    assert node_key(1, (32, 64, 8), ((4, 8, 1),)) == "L1:4x8x1/32x64x8"
    assert node_key(0, (1, 1)) == "L0:1x1"


def test_add_counts_visits_and_keeps_the_most_specific_status():
    g = ConstructionGraph(("i", "j"), ("registers", "shared"))
    g.add(_node("a", score=1.0), None)
    g.add(_node("a", score=2.0), Edge("x", "a", "grow"))
    assert g.nodes["a"].score == 1.0 and g.visits["a"] == 2  # first data kept
    g.add(_node("a", status="over_capacity", score=3.0), None)
    assert g.nodes["a"].status == "over_capacity" and g.visits["a"] == 3
    g.add(_node("a", status="explored"), None)
    assert g.nodes["a"].status == "over_capacity"  # never back to explored
    g.add(None, Edge("a", "b", "descend"))
    assert g.counts() == {"nodes": 1, "edges": 2}
    g.add(_node("b", status="emitted"), None)
    assert [n.key for n in g.emitted()] == ["b"]


def test_round_trip_keeps_infinite_scores_and_visits(tmp_path):
    g = ConstructionGraph(("i",), ("registers",))
    g.add(_node("a", score=float("inf"), tile=(3,)), Edge("s", "a", "grow", score=float("inf")))
    g.add(_node("a", tile=(3,)), Edge("a", "a", "grow", probability=0.25))
    back = ConstructionGraph.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back == g
    path = tmp_path / "graph.json"
    g.save(path)
    assert ConstructionGraph.load(path) == g


def test_constructed_graphs_round_trip(tmp_path):
    for e, dev in ((matmul(512, 512, 512), "v100"), (expr("relu", shape=(17, 11, 3)), "tiny-cpu")):
        g = construct(e, device(dev)).graph
        assert g.counts()["nodes"] > 1 and g.emitted()
        assert ConstructionGraph.from_dict(json.loads(json.dumps(g.to_dict()))) == g
        g.save(tmp_path / "g.json")
        loaded = ConstructionGraph.load(tmp_path / "g.json")
        assert loaded == g and all(isinstance(n.tile, tuple) for n in loaded.nodes.values())
