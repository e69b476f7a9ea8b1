"""Workload selection shared by every face: a catalog op, an expression, or a suite entry.

A `Workload` is the user's choice as plain values (what the CLI flags, a dashboard form or a
notebook cell hold); `Workload.build()` turns it into a TensorExpr.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from workbench.errors import UserError
from workbench.files import read_user_text
from workbench.ops import random_suite
from workbench.ops.catalog import normalize_params
from workbench.ops.shapes import check_dtype
from workbench.ops.tensor_expr import TensorExpr

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SUITES_DIR = Path(__file__).resolve().parent.parent / "specs" / "suites"
_SUITE_KEYS = {"id", "op", "dtype"}
# The suites are a few kilobytes; a bigger file is not a suite.
MAX_SUITE_BYTES = 2**20


@dataclass(frozen=True)
class Workload:
    op: str | None = None  # a catalog operator
    params: tuple[tuple[str, object], ...] = ()  # its parameters, or the expression's extents
    expr: str | None = None  # the expression language, instead of `op`
    dtype: str = "float32"
    label: str = ""  # e.g. "cpu-core:mm-512"
    model: str | None = None  # an ONNX file, with `operator` the index of one of its operators
    operator: int = -1
    dims: tuple[tuple[str, int], ...] = ()  # the model's symbolic dims as bound (`--dim`); unnamed ones are 1

    def build(self) -> TensorExpr:
        from workbench.ops import catalog, expr_lang

        if self.model is not None:
            return model_operator_expr(self.model, self.operator, self.dims)
        if self.expr is not None:
            return expr_lang.build_expr(self.expr, dict(self.params), self.dtype)
        if self.op is None:
            raise UserError("no workload: give --op, --expr or --workload")
        return catalog.build(self.op, dict(self.params), self.dtype)

    @classmethod
    def from_dict(cls, data: object) -> "Workload":
        """The workload `TensorExpr.workload_dict()` describes (op, dtype and the parameters; an
        expression is op "expr" with its text in the parameter `expr`); UserError names what is
        malformed. A model's operator cannot come back this way: its dict has no model."""
        if not isinstance(data, dict):
            raise UserError(f"workload must be a table of op, dtype and parameters, got {data!r:.60}")
        for key in ("op", "dtype"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise UserError(f"workload.{key} must be a non-empty string, got {data.get(key)!r:.60}")
        params = {k: v for k, v in data.items() if k not in ("op", "dtype")}
        for key, value in params.items():
            if not _plain(value):
                raise UserError(f"workload.{key} must be a number, boolean, string or list of them, got {value!r:.60}")
        if data["op"] != "expr":
            return cls(op=data["op"], params=_frozen(params), dtype=data["dtype"])
        text = params.pop("expr", None)
        if not isinstance(text, str):
            raise UserError(f"workload.expr must be the expression's text, got {text!r:.60}")
        return cls(expr=text, params=_frozen(params), dtype=data["dtype"])

    def describe(self) -> str:
        if self.label:
            return self.label
        if self.model is not None:
            bound = "".join(f",{k}={v}" for k, v in self.dims)
            return f"{Path(self.model).name}#{self.operator}" + (f" ({bound[1:]})" if bound else "")
        body = self.expr if self.expr is not None else self.op
        return f"{body} " + ",".join(f"{k}={_fmt(v)}" for k, v in self.params)


@lru_cache(maxsize=8)
def _imported(path: str, mtime_ns: int, dims: tuple[tuple[str, int], ...]):
    from workbench.models.onnx_import import import_model

    return import_model(path, dict(dims))


def imported_model(path: str, dims: tuple[tuple[str, int], ...] = ()):
    """The ONNX model at `path` imported with its symbolic dims bound to `dims`, once per file
    version and binding (`models.onnx_import.ImportedModel`)."""
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as err:
        raise UserError(f"model {path}: {err.strerror}") from None
    return _imported(path, mtime, tuple(dims))


def model_operator_expr(path: str, index: int, dims: tuple[tuple[str, int], ...] = ()) -> TensorExpr:
    """The TensorExpr of operator `index` of an ONNX model with its symbolic dims bound to `dims`
    (imported once per file version and binding)."""
    operators = imported_model(path, dims).operators
    if not 0 <= index < len(operators):
        raise UserError(f"model {path}: no operator {index} (it has {len(operators)})")
    op = operators[index]
    if op.expr is None:
        raise UserError(f"model {path}: operator {index} ({op.name}) is unsupported: {op.reason}")
    return op.expr


def _fmt(value) -> str:
    return "x".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _freeze(value):
    return tuple(value) if isinstance(value, list) else value


def _frozen(params: dict) -> tuple[tuple[str, object], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in params.items()))


def suite_path(name: str) -> Path:
    path = Path(name)
    if path.suffix == ".toml":
        return path
    return SUITES_DIR / f"{name}.toml"


def list_suites() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SUITES_DIR.glob("*.toml")))


def load_suite(name: str, seed: int | None = None) -> tuple[str, tuple[Workload, ...]]:
    """(suite name, workloads) of `specs/suites/NAME.toml`, a TOML path, or a random suite
    `random:N` / `random-conv:N` drawn with `seed` (`ops.random_suite`; its name is then
    `KIND@SEED` and its ids r0 ..; UserError without a seed). `seed` is ignored for a TOML suite."""
    if random_suite.is_random(name):
        parsed = random_suite.parse_name(name)
        if seed is None:
            raise UserError(f"suite '{name}' is drawn at random: give its seed")
        suite = random_suite.suite_name(parsed.kind, seed)
        return suite, tuple(_entry_workload(suite, e) for e in random_suite.draw(parsed.kind, parsed.count, seed))
    path = suite_path(name)
    if not path.exists():
        raise UserError(f"suite '{name}' not found (known: {', '.join(list_suites() + tuple(random_suite.KINDS))})")
    text = read_user_text(path, "suite", MAX_SUITE_BYTES)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"suite '{name}': invalid TOML: {err}") from None
    try:
        suite, entries = _suite_doc(doc, path.stem)
    except UserError as err:
        raise UserError(f"suite '{name}': {err}") from None
    workloads = tuple(_entry_workload(suite, entry) for entry in entries)
    for w, entry in zip(workloads, entries):
        try:  # every entry's operator, parameters and dtype, before a bench runs any of them
            normalize_params(w.op, dict(w.params))
            check_dtype(w.dtype)
        except UserError as err:
            raise UserError(f"suite '{name}': workload '{entry['id']}': {err}") from None
    return suite, workloads


def _entry_workload(suite: str, entry: dict) -> Workload:
    """The Workload of one checked [[workload]] table (or a drawn entry of the same form)."""
    params = tuple(sorted((k, _freeze(v)) for k, v in entry.items() if k not in _SUITE_KEYS))
    return Workload(op=entry["op"], params=params, dtype=entry.get("dtype", "float32"), label=f"{suite}:{entry['id']}")


def _suite_doc(doc: dict, default_name: str) -> tuple[str, list[dict]]:
    """The suite's name and its checked [[workload]] tables; UserError names what is malformed."""
    head = doc.get("suite", {})
    if not isinstance(head, dict):
        raise UserError(f"'suite' must be a table ([suite] with name and source), got {head!r:.60}")
    suite = head.get("name", default_name)
    if not isinstance(suite, str) or not suite.strip() or ":" in suite:
        raise UserError(f"suite.name must be a non-empty string without ':', got {suite!r:.60}")
    entries = doc.get("workload")
    if not isinstance(entries, list) or not entries:
        raise UserError("no [[workload]] entries")
    seen = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "id" not in entry or "op" not in entry:
            raise UserError(f"workload[{i}] needs 'id' and 'op'")
        for key in sorted(_SUITE_KEYS & set(entry)):
            value = entry[key]
            if not isinstance(value, str) or not value.strip() or (key == "id" and ":" in value):
                raise UserError(f"workload[{i}].{key} must be a non-empty string{' without :' if key == 'id' else ''}, "
                                f"got {value!r:.60}")
        if entry["id"] in seen:
            raise UserError(f"workload[{i}].id {entry['id']!r} is used by an earlier workload")
        seen.add(entry["id"])
        for key, value in entry.items():
            if key not in _SUITE_KEYS and not _plain(value):
                raise UserError(f"workload[{i}].{key} must be a number, boolean or list of numbers, got {value!r:.60}")
    return suite, entries


def _plain(value) -> bool:
    """A parameter value the catalog can check: a scalar, or a flat list of scalars."""
    scalar = (int, float, bool, str)
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))


def suite_workload(ref: str) -> Workload:
    """`SUITE:ID`, `PATH.toml:ID`, or a drawn workload `KIND@SEED:rI` (as `bench` labels it)."""
    suite, sep, wid = ref.rpartition(":")
    if not sep or not suite or not wid:
        raise UserError(f"--workload '{ref}': expected SUITE:ID (e.g. cpu-core:mm-512)")
    if random_suite.is_random(suite):
        try:
            kind, seed = random_suite.parse_suite_name(suite)
            index = random_suite.parse_index(wid)
        except UserError as err:
            raise UserError(f"--workload '{ref:.80}': {err}") from None
        return _entry_workload(suite, random_suite.draw_one(kind, seed, index))
    name, workloads = load_suite(suite)
    for w in workloads:
        if w.label == f"{name}:{wid}":
            return w
    known = ", ".join(w.label.split(":", 1)[1] for w in workloads)
    raise UserError(f"--workload '{ref}': no workload '{wid}' in suite '{name}' (known: {known})")


def workload_from_args(op: str | None, shape: str | None, expr: str | None, workload: str | None, dtype: str) -> Workload:
    """The CLI's workload selection (CLI.md): exactly one of --op, --expr, --workload."""
    chosen = [x for x in (op, expr, workload) if x]
    if len(chosen) != 1:
        raise UserError("choose one workload: --op NAME --shape ..., --expr TEXT --shape ..., or --workload SUITE:ID")
    if workload:
        w = suite_workload(workload)
        return w if dtype == "float32" else Workload(w.op, w.params, w.expr, dtype, w.label)
    if not (shape or "").strip():
        if expr:
            raise UserError("--expr needs --shape with each index's extent, such as i=64,j=64,k=64")
        normalize_params(op, {})  # an unknown operator, or the first parameter it needs, in one line
    params = tuple(sorted(parse_shape(shape or "").items()))
    if expr:
        return Workload(expr=expr, params=params, dtype=dtype)
    return Workload(op=op, params=params, dtype=dtype)


def parse_shape(text: str) -> dict[str, object]:
    """`--shape K=V,K=V` as `ops.shapes.parse_kv` reads it, where V may also be `dyn`: a dynamic
    extent (`catalog.DYN`) of a catalog parameter or an expression's axis, which only `workbench
    vortex` accepts (the catalog and the expression language refuse it elsewhere)."""
    from workbench.ops.catalog import DYN
    from workbench.ops.shapes import parse_kv

    dynamic, rest = {}, []
    for item in text.split(","):
        key, sep, value = (s.strip() for s in item.partition("="))
        if sep and value.lower() == DYN:
            if key in dynamic:
                raise UserError(f"--shape: {key} is given twice")
            dynamic[key] = DYN
        else:
            rest.append(item)
    static = parse_kv(",".join(rest)) if rest or not dynamic else {}
    both = sorted(set(static) & set(dynamic))
    if both:
        raise UserError(f"--shape: {both[0]} is given twice")
    return {**static, **dynamic}


def construction_expr_of(workload: dict, spec) -> TensorExpr:
    """The expression a construction of a stored `workload` (op, dtype and parameters, as
    `TensorExpr.workload_dict` writes them; a label is ignored) tiles on `spec`: its GEMM view on a
    CPU, its axes fused, as `construct.stepper.Stepper` makes it, so the axes the stored programs
    name. UserError when the workload is malformed."""
    return _construction_expr(json.dumps({k: v for k, v in workload.items() if k != "label"}, sort_keys=True), spec)


def stored_program(workload: dict, program: dict, spec):
    """The stored `program` (`RProgram.to_dict`) of `workload` rebuilt for its construction
    expression on `spec` (`construction_expr_of`); ValueError when the program names other axes
    (constructed over another view, since changed), KeyError or TypeError when it is malformed,
    UserError when the workload is."""
    from workbench.rtile.rprogram import RProgram

    expr = construction_expr_of(workload, spec)
    names = [a.name for a in expr.axes]
    if list(program["axes"]) != names:
        raise ValueError(f"the stored program's axes {list(program['axes'])} are not the construction's {names}")
    return RProgram.from_dict(program, expr)


@lru_cache(maxsize=64)
def _construction_expr(workload_json: str, spec) -> TensorExpr:
    from workbench.construct.stepper import construction_view, tiled_expr

    return tiled_expr(construction_view(Workload.from_dict(json.loads(workload_json)).build(), spec).expr, spec)
