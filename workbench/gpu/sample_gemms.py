"""The suite `sample-gemms`: the GEMMs of the ONNX sample models as plain catalog matmuls, and
fp16 matmuls for the tensor-core template.

Each MatMul / Gemm node of `sample_models/*.onnx` becomes a catalog `matmul` of its M, K, N
(ONNX shape inference; a symbolic dim is 1, as `workbench model` binds a dim not given), batched
(`B`) where both operands carry the same batch dims, with the batch folded into M where only
the left one does (ONNX broadcasts the right one). The node's layout is not kept (a Gemm's
`transB` weight is a plain [K,N] here) and neither is its bias: these are the shapes, for
comparing our GEMMs with cuBLAS. Each shape comes once, named after the first model that has it.
"""

from __future__ import annotations

from functools import lru_cache
from math import prod
from pathlib import Path

from workbench.workload import Workload

SAMPLE_GEMMS = "sample-gemms"
SAMPLE_MODELS = Path(__file__).resolve().parent.parent.parent / "sample_models"
# fp16 matmuls for the WMMA template (`codegen.cuda_mma`, dtype float16 on tensor cores): the
# square GEMM cuBLAS is usually quoted at, and the catalog's BERT-base feed-forward shape.
FP16_GEMMS = (("fp16-mm-4096", 4096, 4096, 4096), ("fp16-bert-ffn", 128, 768, 3072))


@lru_cache(maxsize=1)
def sample_gemms() -> tuple[Workload, ...]:
    """The suite's workloads (labels `sample-gemms:<model>-mm<n>` and `sample-gemms:fp16-...`)."""
    seen: dict[tuple[int, int, int, int], str] = {}
    for path in sorted(SAMPLE_MODELS.glob("*.onnx")):
        for n, shape in enumerate(_model_gemms(path)):
            seen.setdefault(shape, f"{path.stem}-mm{n}")
    workloads = [_matmul(wid, *shape, "float32") for shape, wid in seen.items()]
    workloads += [_matmul(wid, 0, m, k, n, "float16") for wid, m, k, n in FP16_GEMMS]
    return tuple(workloads)


def _matmul(wid: str, batch: int, m: int, k: int, n: int, dtype: str) -> Workload:
    params = (("B", batch), ("K", k), ("M", m), ("N", n), ("trans_a", False), ("trans_b", False))
    return Workload(op="matmul", params=params, dtype=dtype, label=f"{SAMPLE_GEMMS}:{wid}")


def _model_gemms(path: Path) -> list[tuple[int, int, int, int]]:
    """(B, M, K, N) of each MatMul / Gemm node of the model, in graph order (B 0: unbatched)."""
    import onnx
    from onnx import shape_inference

    graph = shape_inference.infer_shapes(onnx.load(str(path))).graph
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
              for vi in [*graph.value_info, *graph.input, *graph.output]}
    shapes |= {init.name: list(init.dims) for init in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or any(i not in shapes for i in node.input[:2]):
            continue
        a, b = shapes[node.input[0]], shapes[node.input[1]]
        attrs = {at.name: at.i for at in node.attribute}
        if node.op_type == "Gemm":
            (m, k), n = (a[::-1] if attrs.get("transA") else a), (b[0] if attrs.get("transB") else b[1])
            found.append((0, m, k, n))
            continue
        m, k, n = a[-2], a[-1], b[-1]
        lead_a, lead_b = prod(a[:-2]), prod(b[:-2])
        if len(b) > 2 and lead_b > 1:
            found.append((lead_b, m, k, n))
        else:
            found.append((0, m * lead_a, k, n))
    return found
