"""The model operator graph figure: depths follow the dataflow, colours the predicted times."""

from workbench.viz.dataflow import dataflow_figure, depths


def test_depth_is_the_longest_path_from_an_input():
    #   0 -> 1 -> 3 ; 0 -> 2 -> 3 ; 2 -> 4
    assert depths([(), (0,), (0,), (1, 2), (2,)]) == [0, 1, 1, 2, 2]


def test_figure_draws_every_operator_and_edge_and_greys_unsupported():
    fig = dataflow_figure(["a", "b", "c"], [(), (0,), (0, 1)], [1e-6, None, 3e-6])
    edges, nodes = fig.data
    assert list(nodes.customdata) == [0, 1, 2]
    assert list(nodes.x) == [0, 1, 2]
    assert sum(v is None for v in edges.x) == 3  # three edges, each ended by a gap
    assert nodes.marker.cmax == 3.0
    assert "unsupported" in nodes.hovertext[1]
