"""Write the sample ONNX models of `workbench model` (run: python sample_models/make_models.py [DIR]).

Seven small networks in the shape of the ones the construction papers evaluate on (Roller,
Rammer): an MLP, a BERT-style encoder layer, a ResNet-style block, a MobileNet-style inverted
residual block, ShuffleNet-style units with grouped convolutions, channel shuffles and a
classifier head (Flatten, Dropout), a transformer feed-forward block whose input has
symbolic `batch` and `seq` dims, and a GPT-2-style decoder block whose input has a symbolic
`seq` (causal mask and head reshapes computed from it). Widths are kept small (hidden 96-256)
so that all seven together stay under 2.5 MB and a whole model constructs and runs in seconds.
A larger GPT-2-style decoder block with a fixed length (`decoder_block`, sequence 48, hidden
192) is written on request only (`--decoder PATH`): at 1.8 MB it is not committed; `--sizes
SEQ,HIDDEN,HEADS,FFN` writes it at other sizes (a user's odd ones: 77,300,6,1200). `--odd DIR`
writes eight more, not committed either, of sizes and operators the samples lack (`ODD_MODELS`:
squeeze-excite, hard-swish, grouped and dilated convs, 1-D convs, pools with `ceil_mode`, a
classifier's pooler), for judging a change on models nobody tuned for.

The files are reproducible byte for byte: weights come from a seeded `numpy.random.RandomState`
(whose stream numpy keeps stable across releases), and the IR version, opset, producer and every
name are fixed here rather than taken from the installed onnx package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization is in the default domain from opset 17
IR_VERSION = 8  # the IR version that opset 17 shipped with
PRODUCER = "tile-workbench sample_models/make_models.py"
PRODUCER_VERSION = "1"


class Graph:
    """Accumulates nodes and initializers under deterministic names."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.RandomState(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def weight(self, shape: tuple[int, ...], fan_in: int) -> str:
        """A random weight scaled by 1/sqrt(fan_in), so activations keep unit size."""
        return self.const(self.rng.standard_normal(shape) / np.sqrt(fan_in))

    def const(self, value) -> str:
        name = f"w{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def ints(self, values) -> str:
        name = f"w{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self.count += 1
        out = f"t{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"{op_type.lower()}_{self.count}", **attrs))
        return out

    def model(self, x: str, x_shape: tuple[int | str, ...], y: str, y_shape: tuple[int | str, ...]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, list(y_shape))],
            self.inits,
        )
        model = helper.make_model(
            graph,
            ir_version=IR_VERSION,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            producer_version=PRODUCER_VERSION,
        )
        onnx.checker.check_model(model)
        return model


def linear(g: Graph, x: str, n_in: int, n_out: int) -> str:
    return g.op("Add", g.op("MatMul", x, g.weight((n_in, n_out), n_in)), g.const(0.1 * g.rng.standard_normal(n_out)))


def mlp() -> onnx.ModelProto:
    """x[8,256] -> Gemm+Relu 256 -> Gemm+Relu 128 -> Gemm 10."""
    g = Graph("mlp", seed=1)
    h = "x"
    for n_in, n_out in ((256, 256), (256, 128)):
        h = g.op("Relu", g.op("Gemm", h, g.weight((n_in, n_out), n_in), g.const(0.1 * g.rng.standard_normal(n_out))))
    y = g.op("Gemm", h, g.weight((10, 128), 128), g.const(0.1 * g.rng.standard_normal(10)), transB=1)
    return g.model("x", (8, 256), y, (8, 10))


def layer_norm(g: Graph, x: str, width: int) -> str:
    scale = g.const(1.0 + 0.1 * g.rng.standard_normal(width))
    return g.op("LayerNormalization", x, scale, g.const(0.1 * g.rng.standard_normal(width)), axis=-1, epsilon=1e-5)


def gelu(g: Graph, x: str) -> str:
    """0.5 x (1 + erf(x / sqrt 2)): opset 17 has no Gelu operator."""
    erf = g.op("Erf", g.op("Div", x, g.const(np.sqrt(2.0))))
    return g.op("Mul", g.op("Mul", x, g.const(0.5)), g.op("Add", erf, g.const(1.0)))


def bert_layer(seq: int = 32, hidden: int = 128, heads: int = 2, ffn: int = 512) -> onnx.ModelProto:
    """One post-LN encoder layer: multi-head self-attention, add & norm, GELU FFN, add & norm."""
    g = Graph("bert_layer", seed=2)
    dh = hidden // heads
    split = g.ints((1, seq, heads, dh))
    q, k, v = (g.op("Reshape", linear(g, "x", hidden, hidden), split) for _ in range(3))
    q = g.op("Transpose", q, perm=(0, 2, 1, 3))
    k = g.op("Transpose", k, perm=(0, 2, 3, 1))
    v = g.op("Transpose", v, perm=(0, 2, 1, 3))
    scores = g.op("Mul", g.op("MatMul", q, k), g.const(1.0 / np.sqrt(dh)))
    ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    ctx = g.op("Reshape", g.op("Transpose", ctx, perm=(0, 2, 1, 3)), g.ints((1, seq, hidden)))
    h1 = layer_norm(g, g.op("Add", "x", linear(g, ctx, hidden, hidden)), hidden)
    ff = linear(g, gelu(g, linear(g, h1, hidden, ffn)), ffn, hidden)
    y = layer_norm(g, g.op("Add", h1, ff), hidden)
    return g.model("x", (1, seq, hidden), y, (1, seq, hidden))


def batch_norm(g: Graph, x: str, channels: int) -> str:
    """Inference batch norm, left unfolded (so the importer sees BatchNormalization)."""
    scale = g.const(1.0 + 0.1 * g.rng.standard_normal(channels))
    bias = g.const(0.1 * g.rng.standard_normal(channels))
    mean = g.const(0.1 * g.rng.standard_normal(channels))
    var = g.const(1.0 + 0.1 * g.rng.uniform(size=channels))
    return g.op("BatchNormalization", x, scale, bias, mean, var, epsilon=1e-5)


def resnet_block(c: int = 64, hw: int = 16) -> onnx.ModelProto:
    """Basic block: conv3x3+bias, BN, relu, conv3x3, BN, + identity, relu, maxpool 2x2."""
    g = Graph("resnet_block", seed=3)
    w1, b1 = g.weight((c, c, 3, 3), 9 * c), g.const(0.1 * g.rng.standard_normal(c))
    h = g.op("Relu", batch_norm(g, g.op("Conv", "x", w1, b1, pads=(1, 1, 1, 1)), c))
    h = batch_norm(g, g.op("Conv", h, g.weight((c, c, 3, 3), 9 * c), pads=(1, 1, 1, 1)), c)
    h = g.op("Relu", g.op("Add", h, "x"))
    y = g.op("MaxPool", h, kernel_shape=(2, 2), strides=(2, 2))
    return g.model("x", (1, c, hw, hw), y, (1, c, hw // 2, hw // 2))


def mobilenet_block(c: int = 32, expand: int = 3, hw: int = 16) -> onnx.ModelProto:
    """Inverted residual (MobileNetV2): 1x1 expand, ReLU6, 3x3 depthwise, ReLU6, 1x1 project,
    + identity, then global average pooling."""
    g = Graph("mobilenet_block", seed=4)
    e = c * expand
    lo, hi = g.const(0.0), g.const(6.0)
    h = g.op("Conv", "x", g.weight((e, c, 1, 1), c), g.const(0.1 * g.rng.standard_normal(e)))
    h = g.op("Clip", h, lo, hi)
    h = g.op("Conv", h, g.weight((e, 1, 3, 3), 9), g.const(0.1 * g.rng.standard_normal(e)), group=e, pads=(1, 1, 1, 1))
    h = g.op("Clip", h, lo, hi)
    h = g.op("Conv", h, g.weight((c, e, 1, 1), e), g.const(0.1 * g.rng.standard_normal(c)))
    y = g.op("GlobalAveragePool", g.op("Add", h, "x"))
    return g.model("x", (1, c, hw, hw), y, (1, c, 1, 1))


def channel_shuffle(g: Graph, x: str, groups: int, c: int, hw: int) -> str:
    """ShuffleNet's channel shuffle: reshape to [1, groups, c/groups, h, w], swap the two
    channel dimensions, reshape back (output channel i reads channel i % groups * c/groups +
    i // groups)."""
    x = g.op("Reshape", x, g.ints((1, groups, c // groups, hw, hw)))
    return g.op("Reshape", g.op("Transpose", x, perm=(0, 2, 1, 3, 4)), g.ints((1, c, hw, hw)))


def shufflenet_block(c: int = 24, hw: int = 16, classes: int = 10) -> onnx.ModelProto:
    """A ShuffleNet v1 unit (grouped 1x1 convs, channel shuffle, depthwise 3x3, + identity), a
    ShuffleNet v2 unit (channel split, branch, concat, shuffle), an AlexNet-style grouped 3x3
    conv (groups=2) with max pooling, and a classifier head: Flatten, Dropout (its mask output
    declared, as exporters write it), Gemm."""
    g = Graph("shufflenet_block", seed=5)
    groups, mid = 3, c // 2
    h = g.op("Relu", batch_norm(g, g.op("Conv", "x", g.weight((mid, c // groups, 1, 1), c // groups), group=groups), mid))
    h = channel_shuffle(g, h, groups, mid, hw)
    h = batch_norm(g, g.op("Conv", h, g.weight((mid, 1, 3, 3), 9), group=mid, pads=(1, 1, 1, 1)), mid)
    h = batch_norm(g, g.op("Conv", h, g.weight((c, mid // groups, 1, 1), mid // groups), group=groups), c)
    x = g.op("Relu", g.op("Add", h, "x"))
    half = c // 2
    g.count += 1
    left, right = f"t{g.count}a", f"t{g.count}b"
    g.nodes.append(helper.make_node("Split", [x, g.ints((half, half))], [left, right], name=f"split_{g.count}", axis=1))
    r = g.op("Relu", batch_norm(g, g.op("Conv", right, g.weight((half, half, 1, 1), half)), half))
    r = batch_norm(g, g.op("Conv", r, g.weight((half, 1, 3, 3), 9), group=half, pads=(1, 1, 1, 1)), half)
    r = g.op("Relu", batch_norm(g, g.op("Conv", r, g.weight((half, half, 1, 1), half)), half))
    x = channel_shuffle(g, g.op("Concat", left, r, axis=1), 2, c, hw)
    wide = 32
    x = g.op("Conv", x, g.weight((wide, c // 2, 3, 3), 9 * c // 2), g.const(0.1 * g.rng.standard_normal(wide)),
             group=2, pads=(1, 1, 1, 1))
    x = g.op("MaxPool", g.op("Relu", x), kernel_shape=(2, 2), strides=(2, 2))
    flat = g.op("Flatten", x, axis=1)
    g.count += 1
    dropped, mask = f"t{g.count}", f"t{g.count}_mask"
    g.nodes.append(helper.make_node("Dropout", [flat], [dropped, mask], name=f"dropout_{g.count}"))
    features = wide * (hw // 2) ** 2
    y = g.op("Gemm", dropped, g.weight((classes, features), features), g.const(0.1 * g.rng.standard_normal(classes)),
             transB=1)
    return g.model("x", (1, c, hw, hw), y, (1, classes))


def mlp_dynamic(hidden: int = 128, ffn: int = 256) -> onnx.ModelProto:
    """A transformer's feed-forward block on x[batch, seq, hidden] with symbolic `batch` and
    `seq` (dim_param, as exporters write a dynamic axis): MatMul+Add+ReLU to `ffn`, MatMul+Add
    back, + x, LayerNorm. No Reshape with a constant shape, so any binding of the two is valid."""
    g = Graph("mlp_dynamic", seed=6)
    h = g.op("Relu", linear(g, "x", hidden, ffn))
    y = layer_norm(g, g.op("Add", "x", linear(g, h, ffn, hidden)), hidden)
    return g.model("x", ("batch", "seq", hidden), y, ("batch", "seq", hidden))


def decoder_block(seq: int = 48, hidden: int = 192, heads: int = 3, ffn: int = 768) -> onnx.ModelProto:
    """A GPT-2-style decoder block, sizes unlike the samples' (not a committed sample: 1.8 MB at
    the default sizes; `python sample_models/make_models.py --decoder PATH` writes it): pre-
    LayerNorm, Q/K/V projections, scaled scores with a causal mask applied by Where (as GPT-2's
    export does), softmax, context, output projection + residual, LayerNorm, erf-GELU MLP +
    residual."""
    g = Graph("decoder_block", seed=7)
    dh = hidden // heads
    h = layer_norm(g, "x", hidden)
    split = g.ints((1, seq, heads, dh))
    q, k, v = (g.op("Reshape", linear(g, h, hidden, hidden), split) for _ in range(3))
    q = g.op("Transpose", q, perm=(0, 2, 1, 3))
    k = g.op("Transpose", k, perm=(0, 2, 3, 1))
    v = g.op("Transpose", v, perm=(0, 2, 1, 3))
    scores = g.op("Mul", g.op("MatMul", q, k), g.const(1.0 / np.sqrt(dh)))
    causal = f"w{len(g.inits)}"
    g.inits.append(numpy_helper.from_array(np.tril(np.ones((seq, seq), dtype=bool)), causal))
    scores = g.op("Where", causal, scores, g.const(-1e4))
    ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    ctx = g.op("Reshape", g.op("Transpose", ctx, perm=(0, 2, 1, 3)), g.ints((1, seq, hidden)))
    h1 = g.op("Add", "x", linear(g, ctx, hidden, hidden))
    ff = linear(g, gelu(g, linear(g, layer_norm(g, h1, hidden), hidden, ffn)), ffn, hidden)
    y = g.op("Add", h1, ff)
    return g.model("x", (1, seq, hidden), y, (1, seq, hidden))


def decoder_dynamic(hidden: int = 96, heads: int = 4, ffn: int = 384) -> onnx.ModelProto:
    """A GPT-2-style decoder block on x[1, seq, hidden] with a symbolic `seq` (sizes unlike the
    other samples': hidden 96 in 4 heads of 24, FFN 384): pre-LayerNorm, Q/K/V projections split
    into heads by a Reshape whose shape is computed from the input's (Shape, Slice, Concat, as
    exporters write a dynamic axis), scaled scores with a causal mask of the input's length
    (ConstantOfShape + Trilu, applied by Where), softmax, context, heads merged by a Reshape to
    [0, -1, hidden], output projection + residual, LayerNorm, erf-GELU MLP + residual."""
    g = Graph("decoder_dynamic", seed=8)
    dh = hidden // heads
    h = layer_norm(g, "x", hidden)
    split = g.op("Concat", g.op("Slice", g.op("Shape", h), g.ints([0]), g.ints([2])), g.ints((heads, dh)), axis=0)
    q, k, v = (g.op("Reshape", linear(g, h, hidden, hidden), split) for _ in range(3))
    q = g.op("Transpose", q, perm=(0, 2, 1, 3))
    k = g.op("Transpose", k, perm=(0, 2, 3, 1))
    v = g.op("Transpose", v, perm=(0, 2, 1, 3))
    scores = g.op("Mul", g.op("MatMul", q, k), g.const(1.0 / np.sqrt(dh)))
    seq = g.op("Slice", g.op("Shape", h), g.ints([1]), g.ints([2]))
    ones = g.op("ConstantOfShape", g.op("Concat", seq, seq, axis=0), value=numpy_helper.from_array(np.ones(1, bool)))
    scores = g.op("Where", g.op("Trilu", ones, upper=0), scores, g.const(-1e4))
    ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    ctx = g.op("Reshape", g.op("Transpose", ctx, perm=(0, 2, 1, 3)), g.ints((0, -1, hidden)))
    h1 = g.op("Add", "x", linear(g, ctx, hidden, hidden))
    ff = linear(g, gelu(g, linear(g, layer_norm(g, h1, hidden), hidden, ffn)), ffn, hidden)
    y = g.op("Add", h1, ff)
    return g.model("x", (1, "seq", hidden), y, (1, "seq", hidden))


MODELS = {
    "mlp": mlp,
    "bert_layer": bert_layer,
    "resnet_block": resnet_block,
    "mobilenet_block": mobilenet_block,
    "shufflenet_block": shufflenet_block,
    "mlp_dynamic": mlp_dynamic,
    "decoder_dynamic": decoder_dynamic,
}


def _conv(g: Graph, x: str, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1, **attrs) -> str:
    """A k x k conv (k-wide for 1-D, `dims=1`) with a bias, padded to keep the size at stride 1."""
    dims = attrs.pop("dims", 2)
    kernel = (c_out, c_in // group) + (k,) * dims
    pads = attrs.pop("pads", (k // 2,) * 2 * dims)
    return g.op("Conv", x, g.weight(kernel, c_in // group * k ** dims), g.const(0.1 * g.rng.standard_normal(c_out)),
                kernel_shape=(k,) * dims, strides=(stride,) * dims, pads=pads, group=group, **attrs)


def _silu(g: Graph, x: str) -> str:
    return g.op("Mul", x, g.op("Sigmoid", x))


def se_block(c: int = 24, expand: int = 88, out: int = 37, hw: int = 41) -> onnx.ModelProto:
    """EfficientNet-style MBConv: 1x1 expand + SiLU, 5x5 depthwise stride 2 + SiLU, squeeze and
    excite (global pool, 1x1 to 6 + SiLU, 1x1 back + sigmoid, scale), 1x1 project."""
    g = Graph("se_block", seed=11)
    h = _silu(g, _conv(g, "x", c, expand, 1))
    h = _silu(g, _conv(g, h, expand, expand, 5, stride=2, group=expand))
    s = _silu(g, _conv(g, g.op("GlobalAveragePool", h), expand, 6, 1))
    h = g.op("Mul", h, g.op("Sigmoid", _conv(g, s, 6, expand, 1)))
    side = (hw + 1) // 2
    return g.model("x", (1, c, hw, hw), _conv(g, h, expand, out, 1), (1, out, side, side))


def mobilenet_v3(hw: int = 111, classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV3-style: 3x3 stride-2 stem + hard-swish; an inverted residual 16 -> 72 -> 24
    (ReLU, 3x3 depthwise stride 2); one 24 -> 96 -> 24 with hard-swish, a 5x5 depthwise and
    squeeze-excite by a hard sigmoid, + identity; global pool and a 1000-class Gemm."""
    g = Graph("mobilenet_v3", seed=12)
    h = g.op("HardSwish", _conv(g, "x", 3, 16, 3, stride=2))
    h = g.op("Relu", _conv(g, g.op("Relu", _conv(g, h, 16, 72, 1)), 72, 72, 3, stride=2, group=72))
    p = _conv(g, h, 72, 24, 1)
    h = g.op("HardSwish", _conv(g, g.op("HardSwish", _conv(g, p, 24, 96, 1)), 96, 96, 5, group=96))
    s = _conv(g, g.op("Relu", _conv(g, g.op("GlobalAveragePool", h), 96, 24, 1)), 24, 96, 1)
    h = g.op("Mul", h, g.op("HardSigmoid", s, alpha=1 / 6, beta=0.5))
    h = g.op("Flatten", g.op("GlobalAveragePool", g.op("Add", _conv(g, h, 96, 24, 1), p)))
    y = g.op("Gemm", h, g.weight((24, classes), 24), g.const(0.1 * g.rng.standard_normal(classes)))
    return g.model("x", (1, 3, hw, hw), y, (1, classes))


def resnext_block(n: int = 2, c: int = 200, width: int = 104, groups: int = 8, hw: int = 19) -> onnx.ModelProto:
    """ResNeXt bottleneck without biases: 1x1, 3x3 in groups, 1x1, each batch norm unfolded, + x."""
    g = Graph("resnext_block", seed=13)
    h = g.op("Relu", batch_norm(g, g.op("Conv", "x", g.weight((width, c, 1, 1), c)), width))
    w = g.weight((width, width // groups, 3, 3), 9 * width // groups)
    h = g.op("Relu", batch_norm(g, g.op("Conv", h, w, pads=(1, 1, 1, 1), group=groups), width))
    h = batch_norm(g, g.op("Conv", h, g.weight((c, width, 1, 1), width)), c)
    return g.model("x", (n, c, hw, hw), g.op("Relu", g.op("Add", h, "x")), (n, c, hw, hw))


def segmentation_head(c: int = 45, hw: int = 33, classes: int = 21) -> onnx.ModelProto:
    """A dilated 3x3 conv to 64 + ReLU6 (Clip), a 1x1 conv to the classes, softmax over them."""
    g = Graph("segmentation_head", seed=14)
    h = g.op("Clip", _conv(g, "x", c, 64, 3, pads=(2, 2, 2, 2), dilations=(2, 2)), g.const(0.0), g.const(6.0))
    y = g.op("Softmax", _conv(g, h, 64, classes, 1), axis=1)
    return g.model("x", (1, c, hw, hw), y, (1, classes, hw, hw))


def conv1d_stack(n: int = 2, c: int = 40, steps: int = 997) -> onnx.ModelProto:
    """Audio-style 1-D convs: width 5 to 96 + ReLU, width 3 stride 2 to 128 + ReLU, mean over time."""
    g = Graph("conv1d_stack", seed=15)
    h = g.op("Relu", _conv(g, "x", c, 96, 5, dims=1))
    h = g.op("Relu", _conv(g, h, 96, 128, 3, stride=2, dims=1))
    return g.model("x", (n, c, steps), g.op("ReduceMean", h, axes=(2,), keepdims=0), (n, 128))


def norm_ffn(seq: int = 61, hidden: int = 300, ffn: int = 1111) -> onnx.ModelProto:
    """LayerNorm, then MatMul + bias, erf GELU, MatMul + bias, + x."""
    g = Graph("norm_ffn", seed=16)
    h = gelu(g, linear(g, layer_norm(g, "x", hidden), hidden, ffn))
    return g.model("x", (1, seq, hidden), g.op("Add", linear(g, h, ffn, hidden), "x"), (1, seq, hidden))


def pools(n: int = 3, c: int = 29, hw: int = 57) -> onnx.ModelProto:
    """A 3x3 stride-2 conv + ReLU, 3x3 stride-2 max pooling rounding up (`ceil_mode`), 2x2 average
    pooling padded at the bottom and right."""
    g = Graph("pools", seed=17)
    h = g.op("Relu", _conv(g, "x", c, 31, 3, stride=2, pads=(0, 0, 0, 0)))
    h = g.op("MaxPool", h, kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)
    y = g.op("AveragePool", h, kernel_shape=(2, 2), strides=(2, 2), pads=(0, 0, 1, 1))
    return g.model("x", (n, c, hw, hw), y, (n, 31, 7, 7))


def pooler(batch: int = 5, seq: int = 23, hidden: int = 144, classes: int = 7) -> onnx.ModelProto:
    """A sequence classifier's head: mean over the sequence, Gemm + tanh, Gemm, LogSoftmax."""
    g = Graph("pooler", seed=18)
    h = g.op("ReduceMean", "x", axes=(1,), keepdims=0)
    h = g.op("Tanh", g.op("Gemm", h, g.weight((hidden, hidden), hidden), g.const(0.1 * g.rng.standard_normal(hidden)), transB=1))
    y = g.op("Gemm", h, g.weight((classes, hidden), hidden), g.const(0.1 * g.rng.standard_normal(classes)), transB=1)
    return g.model("x", (batch, seq, hidden), g.op("LogSoftmax", y, axis=-1), (batch, classes))


# Written on request only (`--odd DIR`), not committed: sizes and operators the samples lack,
# for judging a change on models nobody tuned for (docs/benchmarks.md, whole models)
ODD_MODELS = {
    "se_block": se_block,
    "mobilenet_v3": mobilenet_v3,
    "resnext_block": resnext_block,
    "segmentation_head": segmentation_head,
    "conv1d_stack": conv1d_stack,
    "norm_ffn": norm_ffn,
    "pools": pools,
    "pooler": pooler,
}


def write_all(out_dir: Path, models: dict = MODELS) -> tuple[Path, ...]:
    """Write every model of `models` (default: the samples) as `out_dir/NAME.onnx`; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in models.items():
        path = out_dir / f"{name}.onnx"
        path.write_bytes(make().SerializeToString(deterministic=True))
        paths.append(path)
    return tuple(paths)


def _sizes(text: str) -> tuple[int, int, int, int]:
    """`--sizes SEQ,HIDDEN,HEADS,FFN`: four positive integers, HEADS dividing HIDDEN."""
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected four positive integers SEQ,HIDDEN,HEADS,FFN, got {text!r}")
    seq, hidden, heads, ffn = (int(p) for p in parts)
    if hidden % heads:
        raise argparse.ArgumentTypeError(f"HEADS ({heads}) must divide HIDDEN ({hidden})")
    return seq, hidden, heads, ffn


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Write the sample ONNX models.")
    parser.add_argument("dir", nargs="?", type=Path, default=Path(__file__).resolve().parent,
                        help="where to write the samples (default: this folder)")
    parser.add_argument("--decoder", type=Path, metavar="PATH",
                        help="write only the larger fixed-length decoder block, to PATH")
    parser.add_argument("--sizes", type=_sizes, metavar="SEQ,HIDDEN,HEADS,FFN",
                        help="the decoder block's sizes (default 48,192,3,768; HEADS divides HIDDEN)")
    parser.add_argument("--odd", type=Path, metavar="DIR",
                        help="write only the eight models of odd sizes and operators (ODD_MODELS), into DIR")
    args = parser.parse_args(argv)  # a wrong option: usage and exit 2, never a folder named after it
    if args.sizes is not None and args.decoder is None:
        parser.error("--sizes sizes the decoder block: give --decoder PATH too")
    if args.odd is not None:
        for written in write_all(args.odd, ODD_MODELS):
            print(f"wrote {written} ({written.stat().st_size} bytes)")
        return 0
    if args.decoder is not None:
        args.decoder.write_bytes(decoder_block(*(args.sizes or ())).SerializeToString(deterministic=True))
        print(f"wrote {args.decoder}")
        return 0
    for written in write_all(args.dir):
        print(f"wrote {written} ({written.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
