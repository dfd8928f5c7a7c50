"""The package's shape and manners: imports point down the data path, library code leaves the
process alone, one error policy, and the command line works without the checkout's bench/.

The import checks read the source (every ``import`` statement, module level and inside functions),
so a lazy import that closes a cycle or reaches up a layer is caught as well as a top-level one.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.errors import OnError, UserError

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "fastload"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The fastload modules ``path`` imports (``from pkg import sub`` names the submodule), with lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fastload"):
                    yield alias.name, node.lineno
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("fastload")
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                # An extension module (fastload._engine) has no .py: it is a leaf, not the package face.
                if sub in modules or alias.name.startswith("_engine"):
                    yield sub, node.lineno
                else:
                    yield node.module, node.lineno


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {target for target, _ in _imports(path, modules) if target in modules and target != name}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle, or [] (depth-first search with colours)."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if colour.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = 2
        return []

    for node in sorted(graph):
        if colour.get(node) is None:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycle_inside_fastload():
    graph = _graph()
    assert len(graph) > 40  # the walk saw the package
    # The package face only hands names on lazily; nothing below it may import it.
    assert not [m for m, targets in graph.items() if "fastload" in targets], "a module imports the package face"
    assert _cycle(graph) == []


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("fastload.records", "fastload.pack"),  # read never imports write
        ("fastload.records", "fastload.cli"),
        ("fastload.pack", "fastload.cli"),
        ("fastload.records", "fastload.loader"),
        ("fastload.pack", "fastload.loader"),
        ("fastload.errors", "fastload.records"),
    ],
)
def test_arrows_point_down(lower, higher):
    wrong = sorted(
        (m, t)
        for m, targets in _graph().items()
        for t in targets
        if (m == lower or m.startswith(lower + ".")) and (t == higher or t.startswith(higher + "."))
    )
    assert wrong == []


#: The object-store transport of the scale-out package: below every reader, writer and command that
#: use it (it knows shards and checksums, never datasets, packs or loaders).
_REMOTE_TRANSPORT = ("storage", "spawned", "fetch", "cache")


def test_scale_out_package_layers():
    """fastload/records/remote/ holds the scale-out code. Its transport imports only the folder's
    names, checksums, errors and itself; the remote dataset and the node-local copy sit on it;
    the pack reaches object storage through the transport only, and the command line through the
    package's public modules."""
    graph = _graph()
    base = "fastload.records.remote"
    transport = {f"{base}.{name}" for name in _REMOTE_TRANSPORT}
    allowed = transport | {"fastload.errors", "fastload.checksum", "fastload.folder"}
    assert transport <= graph.keys()
    assert {m: sorted(graph[m] - allowed) for m in transport} == {m: [] for m in transport}
    # Who outside the package uses it, and what.
    outside = {
        m: sorted(t for t in targets if t.startswith(base + "."))
        for m, targets in graph.items()
        if not m.startswith(base) and any(t.startswith(base + ".") for t in targets)
    }
    assert outside["fastload.pack.remote_io"] and set(outside["fastload.pack.remote_io"]) <= transport
    assert set(outside) >= {"fastload.records.dataset", "fastload.cli.copy", "fastload.cli.pack"}
    # Nothing of it is left where it was scattered before.
    assert not [m for m in graph if m == "fastload.stage" or m.split(".")[:2] == ["fastload", "remote"]]


def test_the_transport_loads_without_the_readers():
    """What a spawned storage helper imports (a fresh interpreter, on a forked worker's first
    storage call) is the transport alone: no reader, no numpy, so the helper starts fast."""
    script = textwrap.dedent("""
        import sys
        import fastload.records.remote.cache, fastload.records.remote.spawned
        print(" ".join(sorted(m for m in sys.modules if m.startswith(("fastload", "numpy")))))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(proc.stdout.split())
    transport = {f"fastload.records.remote.{name}" for name in _REMOTE_TRANSPORT}
    faces = {"fastload", "fastload.records", "fastload.records.remote"}
    below = {"fastload.errors", "fastload.checksum", "fastload.folder", "fastload.version"}
    assert transport <= loaded <= transport | faces | below, loaded


def test_only_the_storage_client_imports_obstore():
    """One module talks to object storage; every other reaches it through RemoteStore."""
    users = sorted(
        _module_name(p)
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "obstore" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "obstore")
    )
    assert sorted(set(users)) == ["fastload.records.remote.storage"]


def _private_imports(path: Path, modules: dict[str, Path]) -> list[str]:
    """``from fastload.x import _name`` where ``_name`` is not a submodule: another module's internals."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fastload"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if alias.name.startswith("_") and name not in modules and not alias.name.startswith("_engine"):
                    found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_scale_out_code_uses_no_private_names_of_other_modules(tmp_path):
    modules = _modules()
    graph = _graph()
    base = "fastload.records.remote"
    mine = [p for m, p in modules.items() if m.startswith(base)]
    users = [p for m, p in modules.items() if any(t.startswith(base) for t in graph[m])]
    assert len(mine) >= 7 and users
    assert [hit for p in {*mine, *users} for hit in _private_imports(p, modules)] == []
    # The check sees what it looks for.
    planted = tmp_path / "planted.py"
    planted.write_text("from fastload.records.remote.cache import _FileLock, ShardCache\n")
    assert len(_private_imports(planted, modules)) == 1


def test_one_module_loads_the_engine():
    """fastload/engine.py alone imports the extension, and it imports nothing of fastload: every
    stage that calls the engine (records, pack, transforms, decode) sits above it."""
    modules = _modules()
    loaders = sorted(
        name for name, path in modules.items() if any(t == "fastload._engine" for t, _ in _imports(path, modules))
    )
    assert loaders == ["fastload.engine"]
    assert _graph()["fastload.engine"] == set()


def test_only_the_cli_parses_arguments():
    """Every ``argparse`` use in the package is in fastload/cli/ (bench/ registers its own parser)."""
    users = sorted(
        _module_name(p)
        for p in PACKAGE.rglob("*.py")
        if "argparse" in p.read_text() and "cli" not in p.relative_to(PACKAGE).parts
    )
    assert users == []


# Calls that change what the whole process sees: library code must not make them.
_PROCESS_WIDE = {
    ("os", "umask"),
    ("sys", "setswitchinterval"),
    ("os", "chdir"),
    ("signal", "signal"),
    ("os", "putenv"),
    ("sys", "setrecursionlimit"),
    ("gc", "freeze"),
    ("gc", "disable"),
}


def _process_wide_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) in _PROCESS_WIDE
        ):
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.func.value.id}.{node.func.attr}")
        # os.environ[...] = ..., os.environ.setdefault / update / pop
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == "os.environ"
        ):
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} os.environ[...] =")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "os.environ"
            and node.func.attr in ("setdefault", "update", "pop", "clear")
        ):
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} os.environ.{node.func.attr}")
    return found


def test_library_code_changes_no_process_wide_state():
    library = [p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts]
    assert [hit for p in library for hit in _process_wide_calls(p)] == []
    # The check sees what it looks for: the CLI (the command's own process) may and does set such state.
    assert any(_process_wide_calls(p) for p in (PACKAGE / "cli").glob("*.py"))


def test_pack_respects_the_umask_and_leaves_process_state_alone(tiny_folder, tmp_path):
    # In a child: the umask is process-wide, and the child's imports must be fresh.
    script = textwrap.dedent(f"""
        import os, sys
        calls = []
        real_umask = os.umask
        os.umask(0o027)
        os.umask = lambda mask: calls.append(mask) or real_umask(mask)
        sys.setswitchinterval(0.004)
        from fastload.pack.packer import pack_folder
        from fastload.pack.arrays import ArraysPackConfig, pack_arrays
        import numpy as np
        pack_folder({str(tiny_folder)!r}, {str(tmp_path / "out")!r}, progress=False, workers=2)
        np.save({str(tmp_path / "x.npy")!r}, np.zeros((4, 2)))
        pack_arrays(ArraysPackConfig(data={{"x": {str(tmp_path / "x.npy")!r}}}, out={str(tmp_path / "arrays")!r}))
        assert calls == [], calls
        assert sys.getswitchinterval() == 0.004, sys.getswitchinterval()
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert modes["fastload.json"] == 0o640  # the umask applied: neither mkstemp's 0600 nor world-readable
    assert modes["fastload-index.npy"] == 0o640
    assert all(mode == 0o640 for name, mode in modes.items() if name.endswith((".rec", ".idx")))
    assert (tmp_path / "arrays").stat().st_mode & 0o777 == 0o750  # not mkdtemp's private 0700


def test_one_on_error_policy_for_pack_and_loader(odd_folder, tmp_path):
    from fastload.loader import LoaderConfig
    from fastload.loader import OnError as LoaderOnError
    from fastload.pack.options import PackOptions
    from fastload.pack.packer import pack_folder

    assert LoaderOnError is OnError
    assert OnError("fail") is OnError.RAISE and OnError("FAIL") is OnError.RAISE  # `--on-error fail`
    assert PackOptions(on_error="fail").on_error is OnError.RAISE
    assert LoaderConfig(on_error="fail").on_error is OnError.RAISE
    with pytest.raises(ValueError, match="ignore"):
        OnError("ignore")
    with pytest.raises(UserError, match="on_error='raise'"):
        pack_folder(odd_folder, str(tmp_path / "out"), on_error="raise", progress=False)


def _installed_copy(tmp_path: Path) -> Path:
    """fastload's package folder alone in a site folder, as a wheel installs it (no bench/ beside it)."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "fastload", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_cli_from_an_install_without_the_checkout(tmp_path):
    site = _installed_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fastload", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(tmp_path),
            timeout=120,
        )

    listing = run("--help")
    assert listing.returncode == 0 and "bench" in listing.stdout and "pack-arrays" in listing.stdout
    bench = run("bench", "--quick")
    assert bench.returncode == 2
    assert "source checkout" in bench.stderr and "Traceback" not in bench.stderr
    info = run("info")
    assert info.returncode == 0 and info.stdout.startswith("decoder: backend=")


def test_bench_command_from_the_checkout():
    from fastload.cli import build_parser

    args = build_parser(["bench", "--quick"]).parse_args(["bench", "--quick", "--suite", "pack"])
    assert args.quick and args.suite == "pack"
    assert args.func.__module__ == "bench.command"
