"""The native boundary: one definition (fastload/engine_abi.py) for the engine's enums and parameter
structs, the typed bindings generated from it, and the stub fastload/_engine.pyi."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest

from fastload import engine_abi

from conftest import REPO_ROOT, requires_engine


def _native_value(value):
    """A field value of a native struct in the ABI table's terms (enums as ints, arrays as tuples)."""
    if hasattr(value, "__int__") and type(value).__module__ == "fastload._engine":
        return int(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def _table_default(ctype, default):
    if ctype in engine_abi.ENUMS:
        return int(engine_abi.ENUMS[ctype][default])
    return tuple(default) if isinstance(default, tuple) else default


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
        assert _native_value(getattr(obj, field)) == pytest.approx(_table_default(ctype, default)), field
    # Fields are typed: a wrong type is a TypeError at the boundary, not a silent conversion.
    with pytest.raises(TypeError):
        setattr(obj, fields[0][1], "not a value")
    assert repr(obj).startswith(f"{name}(") and fields[-1][1] in repr(obj)


def _stub_struct_fields(path):
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in engine_abi.STRUCTS:
            out[node.name] = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    return out


def test_stub_declares_exactly_the_abi_fields():
    # stubtest flags what the engine has and the stub lacks; this catches the reverse for the structs.
    fields = _stub_struct_fields(REPO_ROOT / "fastload" / "_engine.pyi")
    assert fields == {name: {f[1] for f in table} for name, table in engine_abi.STRUCTS.items()}


@requires_engine
def test_stub_matches_the_engine(tmp_path):
    pytest.importorskip("mypy.stubtest")
    config = tmp_path / "mypy.ini"
    # Only the stub is under test: imported project modules are analysed silently.
    config.write_text("[mypy]\nfollow_imports = silent\nignore_missing_imports = True\n")
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
    ns = {"__file__": str(REPO_ROOT / "setup.py"), "__name__": "setup_under_test"}
    source = (REPO_ROOT / "setup.py").read_text()
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        exec(compile(source.split("\nsetup(")[0], "setup.py", "exec"), ns)
        header = ns["abi_header_text"]()
    finally:
        os.chdir(cwd)
    for name, cls in engine_abi.ENUMS.items():
        for m in cls:
            camel = "k" + "".join(p.capitalize() for p in m.name.split("_"))
            assert f"{camel} = {int(m)}" in header and f'X({name}, {camel}, "{m.name}")' in header
    assert "long long max_pixels = 89478485;" in header
    assert "EntropyDecoder slice_entropy = EntropyDecoder::kFastload;" in header
    assert "std::array<double, 3> std_dev = {1.0, 1.0, 1.0};" in header
