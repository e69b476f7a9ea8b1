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
A tensor of constant value (all zeros) matches by accident and is never used as a match.

Each of ONNX Runtime's nodes is then tied to the tensor of the original graph it computes, by
the graph's structure (`_computed`): a tensor it writes under its original name; else, for a
Conv or pool its CPU provider moved to the NCHWc domain (outputs renamed `reorder_token_N`,
blocked [N, C/b, H, W, b], b 8 or 16 by the CPU's vectors), the tensor its name carries (ONNX
Runtime names it after the output it replaces, `r2` -> `r2_nchwc`), taken only when the tensor
its first input carries (followed through the ReorderInput/ReorderOutput layout changes and the
nodes already tied) is upstream of that tensor in the original graph; else, for a node
rewritten in place (a Concat or Sum moved onto blocked tensors keeps its name), the original
node of its name and type. Blocked tensors are not matched by value: the optimised model is
written for its session, not to be run again (the light models' `__SHAPE` inputs, which
initializers give in the original, are inputs without them there); nor by initializer names,
which ConvBnFusion renames and shares across convs. The names ONNX Runtime gives are what is
left to follow, and the upstream check refuses a name that does not fit the graph. The node
goes to the operator owning that tensor, or, when the tensor was fused away inside a larger
group (a Conv's output before its Relu, a Conv whose Sum and Relu ONNX Runtime fused into it),
to that of the first owned tensor downstream of it in the original graph. A node tied to no
tensor (a ReorderInput, a Reshape ONNX Runtime inserted) is a layout change for its consumers
and goes to the operator of its first mapped consumer. A node mapped to nothing is listed apart
with the reason.
"""

from __future__ import annotations

import json
import re
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
    unmatched: tuple[tuple[str, str], ...]  # (ORT node, why no operator computes it), those under UNMATCHED

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
    unmatchable = {tensor for tensor, value in values.items() if not _matchable(value)}
    by_operator, unmatched = _assign(optimized.graph, model.graph, [n.name for n in nodes], owner, unmatchable,
                                     [name for name, _ in outputs])
    return OrtProfile(nodes, by_operator, unmatched)


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
        if not _matchable(value):
            continue
        for name, out in outputs:
            if out.size == value.size and out.dtype == value.dtype and np.allclose(
                    out.reshape(value.shape), value, rtol=RTOL, atol=ATOL):
                owner[tensor] = name
                break
    return owner


def _matchable(value: np.ndarray) -> bool:
    """Whether a tensor can be matched by value: floating, not empty and not constant (a
    constant tensor, all zeros say, agrees with any operator output of its size and value)."""
    from workbench.models.execute import ATOL

    return value.size > 0 and np.issubdtype(value.dtype, np.floating) and float(np.ptp(value)) > ATOL


def _assign(graph, original, order: Sequence[str], owner: Mapping[str, str], unmatchable: set,
            operators: Sequence[str]):
    """Operator -> the optimised graph's nodes (of `order`, the profiled ones) mapped to it, and
    (node, why) for each node mapped to none (`graph`: the optimised graph, `original`: the graph
    it was optimised from, `unmatchable`: its tensors that `_matchable` refuses; module
    docstring)."""
    consumers, graph_consumers = _consumers(original), _consumers(graph)
    computed = _computed(graph, original)
    by_name = {node.name: node for node in graph.node}

    def downstream(tensor: str) -> str:
        """The operator owning `tensor`, else that of the first owned tensor downstream of it in
        the original graph, depth first (`tensor` fused away inside a larger group)."""
        stack, seen = [tensor], {tensor}
        while stack:
            name = stack.pop()
            if name in owner:
                return owner[name]
            after = [out for nxt in consumers.get(name, ()) for out in nxt.output if out and out not in seen]
            seen.update(after)
            stack.extend(reversed(after))
        return UNMATCHED

    def operator_of(node, seen: set) -> str:
        if node.name in computed:
            return downstream(computed[node.name])
        for out in node.output:  # a node of ONNX Runtime's own (a layout change): its first mapped consumer
            for nxt in graph_consumers.get(out, ()):
                if nxt.name not in seen:
                    seen.add(nxt.name)
                    found = operator_of(nxt, seen)
                    if found:
                        return found
        return UNMATCHED

    groups: dict[str, list[str]] = {name: [] for name in operators}
    groups[UNMATCHED] = []
    why: list[tuple[str, str]] = []
    for name in order:
        node = by_name.get(name)
        operator = operator_of(node, {name}) if node is not None else UNMATCHED
        groups[operator].append(name)
        if operator == UNMATCHED:
            tensor = computed.get(name)
            why.append((name, "not in the optimised graph ONNX Runtime wrote" if node is None else
                        "computes no tensor of the model, and no node it feeds is mapped" if tensor is None else
                        f"computes {tensor}, constant or not floating, so matched by no value, nor any tensor"
                        " downstream" if tensor in unmatchable else
                        f"computes {tensor}, which no operator's output matches, nor any tensor downstream"))
    return tuple((name, tuple(nodes)) for name, nodes in groups.items()), tuple(why)


def _consumers(graph) -> dict[str, list]:
    """Tensor name -> the nodes of `graph` that read it."""
    out: dict[str, list] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            out[name].append(node)
    return out


NCHWC_DOMAIN = "com.microsoft.nchwc"
# ONNX Runtime's name of a Conv or pool it moved to NCHWc: the name of the tensor it computes with
# "_nchwc" appended (`NchwcTransformerImpl::TransformConv`, `TransformPool`), with "_token_N" after
# it when that name is taken (`Graph::GenerateNodeName`).
NCHWC_NAME = re.compile(r"(.+)_nchwc(?:_token_\d+)?")
LAYOUT_OPS = ("ReorderInput", "ReorderOutput")  # NCHWc's layout changes: the same values, reordered


def _computed(graph, original) -> dict[str, str]:
    """The optimised graph's node name -> the tensor of the original graph it computes (what is
    fused into it after that tensor is found downstream), for each node where one is known: a
    tensor it writes under its original name; for a node moved to the NCHWc domain, whose
    outputs are renamed blocked copies, the tensor its name gives when the tensor its first input
    carries is upstream of that one (`NCHWC_NAME`); for a node rewritten in place (a Concat or Sum
    on blocked inputs, a FusedConv), the first output of the original node of its name and type."""
    producer = {out: node for node in original.node for out in node.output if out}
    originals = {node.name: node for node in original.node}
    carries = {name: name for name in producer}  # optimised tensor -> the original tensor whose values it holds
    carries.update((i.name, i.name) for i in original.input)

    def upstream(tensor: str | None, of: str) -> bool:
        stack, seen = [of], set()
        while stack:
            name = stack.pop()
            if name == tensor:
                return True
            if name in producer and name not in seen:
                seen.add(name)
                stack.extend(producer[name].input)
        return False

    computed: dict[str, str] = {}
    for node in graph.node:  # in topological order, as ONNX Runtime writes it
        tensor = next((out for out in node.output if out in producer), None)
        nchwc = NCHWC_NAME.fullmatch(node.name)
        same = originals.get(node.name)
        if tensor is None and node.domain == NCHWC_DOMAIN and nchwc and nchwc[1] in producer:
            tensor = nchwc[1] if upstream(carries.get(node.input[0]), nchwc[1]) else None
        elif tensor is None and same is not None and node.op_type in (same.op_type, "Fused" + same.op_type):
            tensor = same.output[0]
        if tensor is not None:
            computed[node.name] = tensor
            carries.setdefault(node.output[0], tensor)
        elif node.domain == NCHWC_DOMAIN and node.op_type in LAYOUT_OPS and node.input[0] in carries:
            carries[node.output[0]] = carries[node.input[0]]  # ReorderInput: computes nothing of its own
    return computed
