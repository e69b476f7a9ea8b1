"""What a GPU runner needs to compute a catalog operator's result with torch: the manifest's
`reference` (docs/gpu.md). The semantics are the catalog's (`ops.catalog`, its OpInfo
descriptions); this names them in torch's terms, with the kernel's argument names in the order
the torch call takes them. An operator the catalog does not have (a model's fused operator) has
no reference: the runner cannot check it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from workbench.errors import UserError
from workbench.ops.tensor_expr import KernelArg

_CONVS = ("conv2d", "group_conv2d", "depthwise_conv2d")
_POOLS = ("avgpool", "maxpool")
_ELEMENTWISE = {"relu": "torch.relu(X)", "add": "A + B",
                "gelu": "torch.nn.functional.gelu(X, approximate='tanh')"}
_REDUCES = {"reduce_sum": "torch.sum", "reduce_mean": "torch.mean"}


def reference(op: str, params: Mapping[str, object], args: Sequence[KernelArg]) -> dict:
    """The reference of catalog operator `op` with its normalized `params` and kernel `args`:
    {"kind": op, "inputs": [names, in the torch call's order], "output": name, "torch": the
    call in words, ...the parameters the call needs}. UserError for an operator not in the
    catalog."""
    inputs = [a.name for a in args if a.role == "input"]
    output = next(a.name for a in args if a.role == "output")
    doc = {"kind": op, "inputs": inputs, "output": output}
    if op == "matmul":
        return doc | {"batch": params["B"], "trans_a": params["trans_a"], "trans_b": params["trans_b"],
                      "torch": "torch.matmul(A.mT if trans_a else A, B.mT if trans_b else B); "
                               "A [B,]M,K (K,M with trans_a), B [B,]K,N (N,K with trans_b)"}
    if op == "gemv":
        return doc | {"torch": "torch.mv(A, x); A [M,K], x [K]"}
    if op in _CONVS:
        groups = {"conv2d": 1, "group_conv2d": params.get("groups"), "depthwise_conv2d": params["C"]}[op]
        out = next(a for a in args if a.role == "output")
        return doc | {"layout": "NCHW", "weight_layout": "OIHW", "stride": params["stride"], "padding": params["pad"],
                      "dilation": params.get("dilation", 1), "groups": groups,
                      "output_shape": list(out.shape),
                      "torch": "torch.nn.functional.conv2d(data, kernel, stride=stride, padding=padding, "
                               "dilation=dilation, groups=groups).reshape(output_shape)"}
    if op in _POOLS:
        call = ("torch.nn.functional.avg_pool2d(data, K, stride, pad, count_include_pad=True)" if op == "avgpool"
                else "torch.nn.functional.max_pool2d(data, K, stride, pad)")
        return doc | {"kernel_size": params["K"], "stride": params["stride"], "padding": params["pad"],
                      "count_include_pad": True, "torch": call}
    if op in _ELEMENTWISE:
        return doc | {"torch": _ELEMENTWISE[op]}
    if op in _REDUCES:
        return doc | {"dims": list(params["axes"]), "torch": f"{_REDUCES[op]}(X, dim=dims)"}
    raise UserError(f"operator {op!r} has no torch reference: a GPU pack takes catalog operators only")
