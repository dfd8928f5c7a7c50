"""The native boundary: one definition (fastload/engine_abi.py) for the engine's enums and parameter
structs, the typed bindings generated from it, and the stub fastload/_engine.pyi."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest

from fastload import engine_abi, engine_structs

from conftest import REPO_ROOT, requires_engine


def _setup_namespace():
    """setup.py's module namespace up to its setup() call (the generators), run from the checkout."""
    ns = {"__file__": str(REPO_ROOT / "setup.py"), "__name__": "setup_under_test"}
    source = (REPO_ROOT / "setup.py").read_text()
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        exec(compile(source.split("\nsetup(")[0], "setup.py", "exec"), ns)
    finally:
        os.chdir(cwd)
    return ns


def _generated(name):
    ns = _setup_namespace()
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        return ns[name]()
    finally:
        os.chdir(cwd)


def _check_default(engine, ctype, value, default, where):
    """A native field's value against its declared default (enums as ints, arrays as tuples)."""
    if ctype in engine_abi.ENUMS:
        assert int(value) == int(engine_abi.ENUMS[ctype][default]), where
    elif ctype in engine_abi.STRUCTS:
        assert value == getattr(engine, ctype)(), where  # the nested struct's own defaults
    elif ctype.startswith("list["):
        assert value == [] and default == (), where
    elif "[" in ctype:
        assert tuple(value) == pytest.approx(tuple(default)), where
    else:
        assert value == pytest.approx(default), where


@requires_engine
@pytest.mark.parametrize("name", sorted(engine_abi.ENUMS))
def test_engine_enums_are_the_abi_enums(name):
    from fastload import _engine

    native = getattr(_engine, name)
    assert {k: int(v) for k, v in native.__members__.items()} == {m.name: int(m) for m in engine_abi.ENUMS[name]}
    for member in engine_abi.ENUMS[name]:
        assert getattr(native, member.name) == int(member)  # arithmetic enums compare with ints
        assert native(int(member)).name == member.name


@requires_engine
@pytest.mark.parametrize("name", sorted(engine_abi.STRUCTS))
def test_engine_structs_are_the_abi_structs(name):
    from fastload import _engine

    cls = getattr(_engine, name)
    fields = engine_abi.STRUCTS[name]
    bound = {k for k, v in vars(cls).items() if isinstance(v, property)}
    assert bound == {f[1] for f in fields}
    obj = cls()
    for ctype, field, default, _doc in fields:
        _check_default(_engine, ctype, getattr(obj, field), default, f"{name}.{field}")
    # Fields are typed: a wrong type is a TypeError at the boundary, not a silent conversion.
    with pytest.raises(TypeError):
        setattr(obj, fields[0][1], "not a value")
    assert repr(obj).startswith(f"{name}(") and fields[-1][1] in repr(obj)


def _stub_struct_fields(path):
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in engine_abi.STRUCTS:
            out[node.name] = {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and not n.target.id.startswith("__")
            }
    return out


def test_stub_declares_exactly_the_abi_fields():
    # stubtest flags what the engine has and the stub lacks; this catches the reverse for the structs.
    fields = _stub_struct_fields(REPO_ROOT / "fastload" / "_engine.pyi")
    assert fields == {name: {f[1] for f in table} for name, table in engine_abi.STRUCTS.items()}


@requires_engine
def test_stub_matches_the_engine():
    pytest.importorskip("mypy.stubtest")
    config = REPO_ROOT / "tools" / "stubtest.ini"  # what `make lint` runs it with
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fastload._engine", "--mypy-config-file", str(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_python_enums_need_no_extension():
    # The Pillow path imports the same definitions without fastload._engine.
    code = textwrap.dedent("""
        import sys
        sys.modules["fastload._engine"] = None  # importing it now fails, as on a build without it
        from fastload import decode, transforms
        assert decode.active_backend() == "pillow"
        assert decode.DecodeStatus is decode.engine_abi.Status
        assert transforms.OpKind is decode.engine_abi.GeometryKind
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_generated_header_follows_the_table():
    """setup.py's generator: every enum member and struct field appears with its value or default."""
    header = _generated("abi_header_text")
    for name, cls in engine_abi.ENUMS.items():
        for m in cls:
            camel = "k" + "".join(p.capitalize() for p in m.name.split("_"))
            assert f"{camel} = {int(m)}" in header and f'X({name}, {camel}, "{m.name}")' in header
    assert "long long max_pixels = 89478485;" in header
    assert "EntropyDecoder slice_entropy = EntropyDecoder::kFastload;" in header
    assert "std::array<double, 3> std_dev = {1.0, 1.0, 1.0};" in header
    assert "std::vector<std::vector<PolicyStep>> subpolicies = {};" in header
    assert "std::array<uint8_t, 3> fill = {0, 0, 0};" in header
    assert "float max_img_size = 10000000000.0f;" in header
    assert "Affine2 to_frame = {};" in header
    for name in engine_abi.STRUCTS:
        assert f"inline bool operator==(const {name}& a, const {name}& b)" in header
    # Every function's arguments, defaults included, and its docstring.
    assert (
        '#define FASTLOAD_ABI_ARGS__warp_affine_plan py::arg("spec"), py::arg("box"), py::arg("flip"), '
        'py::arg("out_h"), py::arg("out_w"), py::arg("key"), py::arg("crop_kernel") = WarpKernel::kLinear, '
        'py::arg("crop_antialias") = true'
    ) in header
    assert 'py::arg("mix") = py::none()' in header
    for name in engine_abi.FUNCTIONS:
        assert f"#define FASTLOAD_ABI_ARGS_{name} " in header or not engine_abi.FUNCTIONS[name].params
        assert f"constexpr const char {name}[] = " in header


def test_committed_stub_is_the_generated_one():
    """fastload/_engine.pyi is `setup.py abi_stub`'s output for the committed fastload/engine_abi.py."""
    assert (REPO_ROOT / "fastload" / "_engine.pyi").read_text() == _generated("abi_stub_text")


@requires_engine
def test_engine_functions_are_the_abi_functions():
    from fastload import _engine

    public = {n for n, v in vars(_engine).items() if callable(v) and not isinstance(v, type)}
    assert public == set(engine_abi.FUNCTIONS)
    for name, fn in engine_abi.FUNCTIONS.items():
        assert fn.doc in getattr(_engine, name).__doc__, name


@requires_engine
def test_to_native_builds_typed_structs_field_by_field():
    from fastload import _engine

    plan = engine_structs.to_native(
        _engine,
        "WarpPlan",
        {
            "out_h": 4,
            "to_frame": {"a": 2.0},
            "kernel": "CUBIC_CV",
            "border": engine_abi.WarpBorder.DROP,
            "fill": (1, 2, 3),
        },
    )
    assert plan.out_h == 4 and plan.to_frame.a == 2.0 and plan.to_frame.e == 1.0
    assert plan.kernel == _engine.WarpKernel.CUBIC_CV and plan.border == engine_abi.WarpBorder.DROP
    assert plan == engine_structs.to_native(_engine, "WarpPlan", engine_structs.from_native(plan, "WarpPlan"))
    assert plan != _engine.WarpPlan()
    assert engine_structs.from_native(plan, "WarpPlan")["fill"] == (1, 2, 3)
    ops = engine_structs.to_native(
        _engine,
        "PixelOpsSpec",
        {"ops": [{"kind": "AUTO_AUGMENT", "subpolicies": [[{"prim": 5, "prob": 0.5}], [{"prim": "INVERT"}]]}]},
    )
    assert ops.ops[0].subpolicies[1][0].prim == _engine.PixelPrim.INVERT
    with pytest.raises(ValueError, match="WarpPlan has no field 'kernal'"):
        engine_structs.to_native(_engine, "WarpPlan", {"kernal": 1})
    with pytest.raises(TypeError, match="WarpPlan.out_h"):
        engine_structs.to_native(_engine, "WarpPlan", {"out_h": 2.5})
    with pytest.raises(TypeError, match="WarpPlan.fill"):
        engine_structs.to_native(_engine, "WarpPlan", {"fill": (1, 2)})  # three values, no more, no less
    with pytest.raises(TypeError, match="WarpPlan.fill"):
        engine_structs.to_native(_engine, "WarpPlan", {"fill": (1, 2, 256)})  # uint8
    # A struct is passed, never an object read by attribute name or a dict.
    with pytest.raises(TypeError):
        _engine._warp_source_rect({"out_h": 4}, 1, 8, 8)
