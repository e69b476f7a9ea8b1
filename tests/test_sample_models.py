"""The sample models: the generator reproduces the committed files byte for byte, they are valid
ONNX, small, and compute what their names say (checked with onnxruntime where installed)."""

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"


def _generator():
    spec = importlib.util.spec_from_file_location("make_models", SAMPLES / "make_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_gives_the_committed_bytes(tmp_path):
    written = _generator().write_all(tmp_path)
    assert [p.name for p in written] == [
        "mlp.onnx", "bert_layer.onnx", "resnet_block.onnx", "mobilenet_block.onnx", "shufflenet_block.onnx",
        "mlp_dynamic.onnx", "decoder_dynamic.onnx",
    ]  # fmt: skip
    for path in written:
        assert path.read_bytes() == (SAMPLES / path.name).read_bytes(), path.name


def test_the_generator_refuses_an_unknown_option_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        _generator().main(["--bogus"])
    assert exit_.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert _generator().main([str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out").glob("*.onnx"))) == 7


def test_the_decoder_block_is_written_at_the_sizes_asked_and_refuses_bad_ones(tmp_path, capsys):
    """`--decoder PATH --sizes SEQ,HIDDEN,HEADS,FFN`: a user's odd sizes (77 tokens, 300 wide, 6
    heads of 50); sizes that are not four positive integers, heads that do not divide the width,
    or sizes without `--decoder` are a usage error (exit 2) that writes nothing."""
    out = tmp_path / "d.onnx"
    assert _generator().main(["--decoder", str(out), "--sizes", "77,300,6,1200"]) == 0
    model = onnx.load(out)
    onnx.checker.check_model(model)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert shape == [1, 77, 300]
    widths = {tuple(i.dims) for i in model.graph.initializer if len(i.dims) == 2}
    assert {(300, 300), (300, 1200), (1200, 300)} <= widths
    for bad in (["--decoder", str(tmp_path / "x.onnx"), "--sizes", "77,300,7,1200"],
                ["--decoder", str(tmp_path / "x.onnx"), "--sizes", "77,300,6"],
                ["--sizes", "77,300,6,1200"]):
        with pytest.raises(SystemExit) as exit_:
            _generator().main(bad)
        assert exit_.value.code == 2 and "--sizes" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.onnx"]


def test_the_odd_models_are_valid_onnx_whose_declared_output_is_what_they_compute(tmp_path):
    """`--odd DIR` writes the eight models of odd sizes and operators (`ODD_MODELS`): each passes
    ONNX's checker with strict shape inference, infers the output shape it declares, and, where
    ONNX Runtime is installed, runs to a finite output of that shape."""
    generator = _generator()
    assert generator.main(["--odd", str(tmp_path)]) == 0
    written = sorted(p.stem for p in tmp_path.glob("*.onnx"))
    assert written == sorted(generator.ODD_MODELS) and len(written) == 8
    models = {name: onnx.load(tmp_path / f"{name}.onnx") for name in written}
    declared = {}
    for name, model in models.items():
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        declared[name] = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
        out = next(v for v in inferred.graph.output if v.name == model.graph.output[0].name)
        assert [d.dim_value for d in out.type.tensor_type.shape.dim] == declared[name], name
    ort = pytest.importorskip("onnxruntime")  # every model's shapes checked first
    for name, model in models.items():
        x = model.graph.input[0]
        data = np.random.RandomState(0).standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim])
        (y,) = ort.InferenceSession(str(tmp_path / f"{name}.onnx")).run(None, {x.name: data.astype(np.float32)})
        assert list(y.shape) == declared[name] and np.isfinite(y).all(), name


def test_models_are_small_checked_onnx_with_fixed_header():
    gen = _generator()
    paths = sorted(SAMPLES.glob("*.onnx"))
    assert len(paths) == 7
    assert sum(p.stat().st_size for p in paths) < 4 * 2**20
    assert (SAMPLES / "decoder_dynamic.onnx").stat().st_size < 2**20 / 2
    for path in paths:
        model = onnx.load(path)
        onnx.checker.check_model(model)
        assert (model.ir_version, model.opset_import[0].version) == (gen.IR_VERSION, gen.OPSET)
        assert model.producer_name == gen.PRODUCER


@pytest.mark.parametrize(
    "name, ops",
    [
        ("mlp", {"Gemm", "Relu"}),
        ("bert_layer", {"MatMul", "Softmax", "LayerNormalization", "Erf", "Transpose", "Reshape"}),
        ("resnet_block", {"Conv", "BatchNormalization", "Relu", "MaxPool", "Add"}),
        ("mobilenet_block", {"Conv", "Clip", "GlobalAveragePool", "Add"}),
        ("shufflenet_block", {"Conv", "Reshape", "Transpose", "Split", "Concat", "Flatten", "Dropout", "Gemm"}),
        ("mlp_dynamic", {"MatMul", "Add", "Relu", "LayerNormalization"}),
        ("decoder_dynamic", {"LayerNormalization", "MatMul", "Reshape", "Transpose", "Trilu", "Where", "Softmax", "Erf"}),
    ],
)
def test_models_hold_the_operators_of_their_kind(name, ops):
    model = onnx.load(SAMPLES / f"{name}.onnx")
    assert ops <= {n.op_type for n in model.graph.node}


def test_depthwise_conv_is_grouped_per_channel():
    model = onnx.load(SAMPLES / "mobilenet_block.onnx")
    groups = [a.i for n in model.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"]
    assert groups == [96]


def test_shufflenet_block_has_grouped_convs_shuffles_and_a_dropout_mask():
    model = onnx.load(SAMPLES / "shufflenet_block.onnx")
    groups = [a.i for n in model.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"]
    assert groups == [3, 12, 3, 12, 2]  # v1 unit: grouped 1x1, depthwise, grouped 1x1; v2: depthwise; AlexNet-style 2
    transposes = [list(a.ints) for n in model.graph.node if n.op_type == "Transpose" for a in n.attribute]
    assert transposes == [[0, 2, 1, 3, 4]] * 2  # two channel shuffles
    (dropout,) = [n for n in model.graph.node if n.op_type == "Dropout"]
    assert len(dropout.output) == 2  # the mask is declared, as exporters write it


def test_mlp_matches_a_numpy_evaluation_under_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load(SAMPLES / "mlp.onnx")
    w = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(0).uniform(-1, 1, (8, 256)).astype(np.float32)
    h = np.maximum(x @ w["w0"] + w["w1"], 0)
    h = np.maximum(h @ w["w2"] + w["w3"], 0)
    expected = h @ w["w4"].T + w["w5"]
    session = ort.InferenceSession(str(SAMPLES / "mlp.onnx"))
    (out,) = session.run(None, {"x": x})
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_mlp_dynamic_declares_symbolic_batch_and_seq_dims():
    model = onnx.load(SAMPLES / "mlp_dynamic.onnx")

    def dims(info):
        return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]

    assert [dims(i) for i in model.graph.input] == [["batch", "seq", 128]]
    assert [dims(o) for o in model.graph.output] == [["batch", "seq", 128]]
    assert not [n for n in model.graph.node if n.op_type == "Reshape"]  # any binding of the two is valid


def _dims(info):
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def test_decoder_dynamic_declares_a_symbolic_seq_and_computes_its_shapes_from_the_input():
    model = onnx.load(SAMPLES / "decoder_dynamic.onnx")
    assert [_dims(i) for i in model.graph.input] == [[1, "seq", 96]]
    assert [_dims(o) for o in model.graph.output] == [[1, "seq", 96]]
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    shapes = [consts.get(n.input[1]) for n in model.graph.node if n.op_type == "Reshape"]
    # the head split's shape is computed (Shape, Slice, Concat); the merge's is [0, -1, 96]
    assert [s is None for s in shapes] == [True] * 3 + [False] and list(shapes[-1]) == [0, -1, 96]
    assert sum(n.op_type == "Shape" for n in model.graph.node) == 2  # the heads' shape, the mask's length


@pytest.mark.parametrize("seq", [5, 77])
def test_decoder_dynamic_is_causal_at_any_length_under_onnxruntime(seq):
    """Changing the inputs after position t leaves the outputs up to t as they were: the mask
    has the input's length and hides the future from every head."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(SAMPLES / "decoder_dynamic.onnx"))
    x = np.random.default_rng(seq).uniform(-1, 1, (1, seq, 96)).astype(np.float32)
    t = seq // 2
    changed = x.copy()
    changed[:, t + 1:] += 1.0
    (y,) = session.run(None, {"x": x})
    (y2,) = session.run(None, {"x": changed})
    assert y.shape == (1, seq, 96)
    np.testing.assert_allclose(y2[:, : t + 1], y[:, : t + 1], rtol=1e-5, atol=1e-6)
    assert np.abs(y2[:, t + 1:] - y[:, t + 1:]).min() > 0
