"""ONNX Runtime's own per-node times, mapped onto the workbench's operators (fused groups).

ONNX Runtime profiles a session when `SessionOptions.enable_profiling` is set: a Chrome-trace
JSON with one `Node` event per node run (`NAME_kernel_time`, its duration in microseconds).
Its nodes are those of the graph it optimised (a Conv with its Relu is one `FusedConv`
node, a weights-only subgraph is folded away), so they are read off the optimised graph it
writes (`optimized_model_filepath`), in the same session.

The workbench's operators come from TVM's fusion, which names no ONNX node. An operator is
matched to the ONNX tensors it computes by value: the original model is run once more by ONNX
Runtime with every node output made a graph output, and an operator's output is each tensor
of the same shape whose values agree within the model's tolerance (`execute.RTOL`, `ATOL`).
Each of ONNX Runtime's nodes goes to the operator whose output it writes, or, when its
outputs were fused away inside a larger group (a Conv's output before its Relu), to the
operator of the first node downstream that is matched; a node matched to nothing is listed
apart. A tensor of constant value (all zeros) matches by accident and is never used as a
match.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

UNMATCHED = ""  # the operator name of ONNX Runtime's nodes that no operator computes


@dataclass(frozen=True)
class OrtNode:
    name: str
    op_type: str
    seconds: float  # the best of the profiled runs


@dataclass(frozen=True)
class OrtProfile:
    nodes: tuple[OrtNode, ...]  # in the order ONNX Runtime ran them
    by_operator: tuple[tuple[str, tuple[str, ...]], ...]  # operator name -> its ORT nodes (UNMATCHED: none)

    def seconds(self, operator: str) -> float | None:
        """ONNX Runtime's time for the nodes mapped to `operator`, None when none is."""
        names = dict(self.by_operator).get(operator)
        if not names:
            return None
        times = {n.name: n.seconds for n in self.nodes}
        return sum(times[n] for n in names)

    def nodes_of(self, operator: str) -> tuple[str, ...]:
        return dict(self.by_operator).get(operator, ())


def profile(path: str | Path, inputs: Mapping[str, np.ndarray], threads: int, runs: int,
            outputs: Sequence[tuple[str, np.ndarray]]) -> OrtProfile:
    """Profile `runs` runs of the model at `path` on `inputs` with `threads` intra-op threads
    and map each node onto the workbench operator whose output (`outputs`: (operator name,
    its output array), in dataflow order) it computes (module docstring)."""
    import onnx
    import onnxruntime

    model = _named(onnx.load(str(path)))
    with tempfile.TemporaryDirectory(prefix="workbench-ort-") as tmp:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 3  # not its warning that an optimised model is for this machine only
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, dict(inputs))  # warm-up, as the timed runs are
        for _ in range(runs):
            session.run(None, dict(inputs))
        trace = json.loads(Path(session.end_profiling()).read_text())
        optimized = onnx.load(str(Path(tmp) / "optimized.onnx"), load_external_data=False)
    nodes = _node_times(trace, runs + 1)
    values = _intermediates(model, inputs)
    owner = _owners(outputs, values)
    return OrtProfile(nodes, _assign(optimized.graph, [n.name for n in nodes], owner, [name for name, _ in outputs]))


def _node_times(trace: list, runs: int) -> tuple[OrtNode, ...]:
    """Per node of the trace, its best duration over the runs (the first run is the warm-up
    and is dropped); order of first appearance."""
    times: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    for event in trace:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        times[name].append(event["dur"] * 1e-6)
        ops[name] = event.get("args", {}).get("op_name", "")
    return tuple(OrtNode(n, ops[n], min(t[1:] if len(t) >= runs else t)) for n, t in times.items())


def _named(model):
    """`model` with a name on every node: ONNX Runtime names an unnamed node in its profile but
    not in the optimised graph it writes, where the profile's names are looked up."""
    used = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)
    return model


def _intermediates(model, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of `model` (an `onnx.ModelProto`, left as it is) on `inputs`, by tensor
    name (ONNX Runtime with all of them made graph outputs, graph optimisations off so that none
    is fused away)."""
    import onnx
    import onnxruntime

    model = onnx.ModelProto.FromString(model.SerializeToString())
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    declared = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for out in node.output:
            if out and out not in declared and out in types:
                model.graph.output.append(types[out])
                declared.add(out)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs))))


def _owners(outputs: Sequence[tuple[str, np.ndarray]], values: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Tensor name -> the operator computing it: the first operator (dataflow order) whose
    output has the tensor's shape (or its size, for a reshape TVM folded into the producer)
    and values."""
    from workbench.models.execute import ATOL, RTOL

    owner: dict[str, str] = {}
    for tensor, value in values.items():
        value = np.asarray(value)
        if value.size == 0 or not np.issubdtype(value.dtype, np.floating) or np.ptp(value) <= ATOL:
            continue
        for name, out in outputs:
            if out.size == value.size and out.dtype == value.dtype and np.allclose(
                    out.reshape(value.shape), value, rtol=RTOL, atol=ATOL):
                owner[tensor] = name
                break
    return owner


def _assign(graph, order: Sequence[str], owner: Mapping[str, str], operators: Sequence[str]):
    """Operator -> the optimised graph's nodes (of `order`, the profiled ones) mapped to it."""
    consumers: dict[str, list] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    by_name = {node.name: node for node in graph.node}

    def operator_of(node, seen: set) -> str:
        for out in node.output:
            if out in owner:
                return owner[out]
        for out in node.output:  # fused away: the first matched node downstream
            for nxt in consumers.get(out, ()):
                if nxt.name not in seen:
                    seen.add(nxt.name)
                    found = operator_of(nxt, seen)
                    if found:
                        return found
        return UNMATCHED

    groups: dict[str, list[str]] = {name: [] for name in operators}
    groups[UNMATCHED] = []
    for name in order:
        node = by_name.get(name)
        groups[operator_of(node, {name}) if node is not None else UNMATCHED].append(name)
    return tuple((name, tuple(nodes)) for name, nodes in groups.items())
