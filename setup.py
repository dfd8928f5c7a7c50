"""Build script: the C++ decode engine, built when libjpeg-turbo is found.

The package's metadata, dependencies and extras are in ``pyproject.toml``; this file only adds the
optional native extension.

libjpeg-turbo is found, never fetched: ``FASTLOAD_JPEG_ROOT`` (a prefix with include/ and lib/),
then ``pkg-config libjpeg``, then the usual prefixes. The build prints where it looked and what it
found. Without the library (or with ``FASTLOAD_NO_EXTENSION=1``) the package installs pure Python
and uses the Pillow decode path; ``fastload info`` reports which one is live.
"""

import glob
import os
import shutil
import subprocess
import sys
from typing import ClassVar

from setuptools import Command, setup
from setuptools.command.build_ext import build_ext

USUAL_PREFIXES = ["/usr", "/usr/local", "/opt/libjpeg-turbo", "/opt/homebrew", "/opt/local"]


def _say(msg):
    print(f"fastload setup: {msg}", file=sys.stderr, flush=True)


def _jpeg_version(include_dir):
    """LIBJPEG_TURBO_VERSION from jconfig.h, or None when the headers are not libjpeg-turbo's."""
    multiarch = glob.glob(os.path.join(include_dir, "*-linux-gnu", "jconfig.h"))
    candidates = [os.path.join(include_dir, "jconfig.h"), *multiarch]
    for path in candidates:
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("#define LIBJPEG_TURBO_VERSION "):
                        return line.split()[2]
        except OSError:
            continue
    return None


def _from_prefix(prefix):
    inc = os.path.join(prefix, "include")
    if not os.path.exists(os.path.join(inc, "jpeglib.h")):
        return None
    libdirs = [
        d
        for d in (
            os.path.join(prefix, "lib"),
            os.path.join(prefix, "lib64"),
            *glob.glob(os.path.join(prefix, "lib", "*-linux-gnu")),
        )
        if glob.glob(os.path.join(d, "libjpeg.*"))
    ]
    if not libdirs:
        return None
    # Debian's packages put jconfig.h in include/<triplet>/, which the compiler searches by itself only
    # under /usr/include: a prefix unpacked elsewhere (`dpkg -x`) must name it.
    multiarch = sorted(
        d for d in glob.glob(os.path.join(inc, "*-linux-gnu")) if os.path.isfile(os.path.join(d, "jconfig.h"))
    )
    return {
        "include_dirs": [inc, *multiarch],
        "library_dirs": libdirs,
        "libraries": ["jpeg"],
        "how": f"prefix {prefix}",
    }


def _from_pkg_config():
    if not shutil.which("pkg-config"):
        return None
    try:
        cflags = subprocess.run(
            ["pkg-config", "--cflags-only-I", "libjpeg"], capture_output=True, text=True, check=True
        ).stdout.split()
        libs = subprocess.run(
            ["pkg-config", "--libs", "libjpeg"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (subprocess.CalledProcessError, OSError):
        return None
    inc = [f[2:] for f in cflags if f.startswith("-I")] or ["/usr/include"]
    return {
        "include_dirs": inc,
        "library_dirs": [f[2:] for f in libs if f.startswith("-L")],
        "libraries": [f[2:] for f in libs if f.startswith("-l")] or ["jpeg"],
        "how": "pkg-config libjpeg",
    }


def find_libjpeg_turbo():
    """Locate libjpeg-turbo's headers and library; returns build settings or None."""
    tried = []
    env_root = os.environ.get("FASTLOAD_JPEG_ROOT")
    searches = (
        ([lambda: _from_prefix(env_root)] if env_root else [])
        + [_from_pkg_config]
        + [(lambda p=p: _from_prefix(p)) for p in USUAL_PREFIXES]
    )
    labels = (
        ([f"FASTLOAD_JPEG_ROOT={env_root}"] if env_root else [])
        + ["pkg-config libjpeg"]
        + [f"prefix {p}" for p in USUAL_PREFIXES]
    )
    for label, search in zip(labels, searches, strict=False):
        tried.append(label)
        found = search()
        if not found:
            continue
        version = next((v for v in (_jpeg_version(i) for i in found["include_dirs"] + ["/usr/include"]) if v), None)
        if version is None:
            _say(f"{label}: found a libjpeg that is not libjpeg-turbo; skipping it")
            continue
        found["version"] = version
        _say(
            f"found libjpeg-turbo {version} via {found['how']} "
            f"(include {found['include_dirs']}, lib {found['library_dirs'] or 'default'})"
        )
        # jpegint.h (libjpeg's module interfaces) lets restart-interval slices use fastload's own
        # Huffman decoder; without it they go through libjpeg's (same pixels, slower).
        internal = next(
            (d for d in found["include_dirs"] + ["/usr/include"] if os.path.exists(os.path.join(d, "jpegint.h"))), None
        )
        decoder = "fastload's interval Huffman decoder" if internal else "libjpeg's Huffman decoder"
        _say(f"jpegint.h {'found in ' + internal if internal else 'not found'}: restart-interval slices use {decoder}")
        return found
    _say(
        "libjpeg-turbo not found (looked at: " + ", ".join(tried) + "); installing without the C++ engine. "
        "On Debian/Ubuntu: apt-get install libjpeg62-turbo-dev (or libjpeg-turbo8-dev), or set FASTLOAD_JPEG_ROOT."
    )
    return None


# ---- the native boundary's generated declarations ---------------------------------------------
# fastload/engine_abi.py holds the one definition of every enum, parameter struct and function of
# the Python/C++ boundary; the C++ header and the type stub are generated from it (never copied by
# hand): the header at build time, the stub by `setup.py abi_stub` (committed; `--check` compares).

ABI_SOURCE = os.path.join("fastload", "engine_abi.py")
STUB_PATH = os.path.join("fastload", "_engine.pyi")

_SCALARS = {
    "bool": ("bool", "bool"),
    "int": ("int", "int"),
    "int64": ("long long", "int"),
    "uint64": ("uint64_t", "int"),
    "uint8": ("uint8_t", "int"),
    "float": ("float", "float"),
    "double": ("double", "float"),
}


def _load_abi(source=ABI_SOURCE):
    import runpy

    return runpy.run_path(source)


def _camel(name):
    """UPPER_SNAKE -> kUpperSnake (the C++ enumerator spelling)."""
    return "k" + "".join(part.capitalize() for part in name.split("_"))


def _parse_type(ctype, abi):
    """('scalar' | 'enum' | 'struct', name) / ('array', element, n) / ('list', element type)."""
    if ctype.startswith("list[") and ctype.endswith("]"):
        return ("list", ctype[5:-1])
    if ctype.endswith("]") and "[" in ctype:
        element, n = ctype[:-1].split("[")
        if element not in _SCALARS or element == "bool":
            raise ValueError(f"{ABI_SOURCE}: arrays hold numbers, not {element!r}")
        return ("array", element, int(n))
    if ctype in _SCALARS:
        return ("scalar", ctype)
    if ctype in abi["ENUMS"]:
        return ("enum", ctype)
    if ctype in abi["STRUCTS"]:
        return ("struct", ctype)
    raise ValueError(f"{ABI_SOURCE}: unknown field type {ctype!r}")


def _cpp_type(ctype, abi):
    kind = _parse_type(ctype, abi)
    if kind[0] == "list":
        return f"std::vector<{_cpp_type(kind[1], abi)}>"
    if kind[0] == "array":
        return f"std::array<{_SCALARS[kind[1]][0]}, {kind[2]}>"
    return _SCALARS[ctype][0] if kind[0] == "scalar" else ctype


def _stub_type(ctype, abi):
    kind = _parse_type(ctype, abi)
    if kind[0] == "list":
        return f"list[{_stub_type(kind[1], abi)}]"
    if kind[0] == "array":
        return f"list[{_SCALARS[kind[1]][1]}]"
    return _SCALARS[ctype][1] if kind[0] == "scalar" else ctype


def _cpp_number(element, value):
    if element == "bool":
        return "true" if value else "false"
    if element in ("float", "double"):
        text = repr(float(value))
        return text + "f" if element == "float" else text
    return str(int(value))


def _cpp_default(ctype, value, abi):
    kind = _parse_type(ctype, abi)
    if kind[0] == "scalar":
        return _cpp_number(ctype, value)
    if kind[0] == "enum":
        return f"{ctype}::{_camel(value)}"
    if kind[0] == "array":
        if len(value) != kind[2]:
            raise ValueError(f"{ABI_SOURCE}: default {value!r} of a {ctype} needs {kind[2]} values")
        return "{" + ", ".join(_cpp_number(kind[1], v) for v in value) + "}"
    if value not in (None, ()):
        raise ValueError(f"{ABI_SOURCE}: a {ctype} field defaults to its own defaults (None or ())")
    return "{}"


def _c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _doc_line(cls):
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0]


def _cpp_arg_default(value, abi):
    import enum

    if value is None:
        return "py::none()"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}::{_camel(value.name)}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _c_string(value)
    raise ValueError(f"{ABI_SOURCE}: no C++ spelling for the default {value!r}")


def abi_header_text(source=ABI_SOURCE):
    """The C++ header generated from fastload/engine_abi.py.

    Enum classes, structs (with ``==``), X-macro lists of both, each function's ``py::arg`` list
    (``FASTLOAD_ABI_ARGS_<name>``) and docstring (``abi_doc::<name>``).
    """
    abi = _load_abi(source)
    enums, structs = abi["ENUMS"], abi["STRUCTS"]
    lines = [
        f"// Generated by setup.py from {ABI_SOURCE}: edit that file, not this one.",
        "#pragma once",
        "",
        "#include <array>",
        "#include <cstdint>",
        "#include <vector>",
        "",
        "namespace fastload {",
        "",
    ]
    for name, cls in enums.items():
        members = list(cls)
        lines.append(
            f"enum class {name} : int {{ " + ", ".join(f"{_camel(m.name)} = {int(m)}" for m in members) + " };"
        )
        lines.append(f"constexpr int k{name}Count = {len(members)};")
        lines.append(f"inline const char* abi_name({name} v) {{")
        lines.append("  switch (v) {")
        for m in members:
            lines.append(f'    case {name}::{_camel(m.name)}: return "{m.name.lower()}";')
        lines += ["  }", '  return "unknown";', "}"]
        lines.append(
            f"#define FASTLOAD_ABI_ENUM_{name}(X) "
            + " ".join(f'X({name}, {_camel(m.name)}, "{m.name}")' for m in members)
        )
        lines.append("")
    lines.append(
        "#define FASTLOAD_ABI_ENUMS(X) " + " ".join(f"X({n}, {_c_string(_doc_line(c))})" for n, c in enums.items())
    )
    lines.append("")
    docs = abi["STRUCT_DOCS"]
    for name, fields in structs.items():
        lines.append(f"struct {name} {{")
        for ctype, field, default, doc in fields:
            lines.append(f"  {_cpp_type(ctype, abi)} {field} = {_cpp_default(ctype, default, abi)};  // {doc}")
        lines.append("};")
        compare = " && ".join(f"a.{f[1]} == b.{f[1]}" for f in fields)
        lines.append(f"inline bool operator==(const {name}& a, const {name}& b) {{ return {compare}; }}")
        lines.append(f"inline bool operator!=(const {name}& a, const {name}& b) {{ return !(a == b); }}")
        lines.append(
            f"#define FASTLOAD_ABI_FIELDS_{name}(X) "
            + " ".join(f"X({name}, {f[1]}, {_c_string(f[3])})" for f in fields)
        )
        lines.append("")
    lines.append("#define FASTLOAD_ABI_STRUCTS(X) " + " ".join(f"X({n}, {_c_string(docs[n])})" for n in structs))
    lines.append("")
    lines.append("// Each function's py::arg list (glue files expand these where `py` is pybind11).")
    for name, fn in abi["FUNCTIONS"].items():
        args = []
        for p in fn.params:
            arg = f'py::arg("{p.name}")'
            if p.default is not ...:
                arg += f" = {_cpp_arg_default(p.default, abi)}"
            args.append(arg)
        lines.append(f"#define FASTLOAD_ABI_ARGS_{name} " + ", ".join(args))
    lines.append("")
    lines.append("namespace abi_doc {")
    for name, fn in abi["FUNCTIONS"].items():
        lines.append(f"constexpr const char {name}[] = {_c_string(fn.doc)};")
    lines += ["}  // namespace abi_doc", "", "}  // namespace fastload", ""]
    return "\n".join(lines)


def write_abi_header(directory):
    """Writes fastload_abi.h into `directory`; rewritten only when its text changes."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "fastload_abi.h")
    text = abi_header_text()
    try:
        with open(path) as fh:
            if fh.read() == text:
                return path
    except OSError:
        pass
    with open(path, "w") as fh:
        fh.write(text)
    return path


_STUB_HEAD = f"""# Generated by `setup.py abi_stub` from {ABI_SOURCE}: edit that file, not this one.
# Type stub of fastload._engine, the C++ engine (csrc/glue/ binds it). Its enums are enum.IntEnum
# classes (pybind11's native_enum), its structs plain classes with typed fields; mypy's stubtest
# checks this stub against the built engine (`make lint`).
import enum
from collections.abc import Sequence
from typing import Any, ClassVar, type_check_only

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

@type_check_only
class _PybindType(type):
    \"\"\"pybind11's metaclass of bound classes (pybind11_builtins.pybind11_type).\"\"\"
"""


def _stub_default(value):
    import enum

    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _stub_def(name, params, returns):
    """A `def` line as ruff formats it in a stub.

    One line; else the parameters on one indented line; else one parameter per line, trailing comma.
    """
    one = f"def {name}({', '.join(params)}) -> {returns}: ..."
    if len(one) <= 120:
        return [one]
    inner = "    " + ", ".join(params)
    if len(inner) <= 120:
        return [f"def {name}(", inner, f") -> {returns}: ..."]
    return [f"def {name}(", *[f"    {p}," for p in params], f") -> {returns}: ..."]


def abi_stub_text(source=ABI_SOURCE):
    """The type stub fastload/_engine.pyi generated from fastload/engine_abi.py."""
    abi = _load_abi(source)
    lines = [_STUB_HEAD]
    for name, cls in abi["ENUMS"].items():
        lines.append(f"class {name}(enum.IntEnum):")
        lines.append("    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule")
        lines += [f"    {m.name} = {int(m)}" for m in cls]
        lines.append("")
    for name, fields in abi["STRUCTS"].items():
        lines.append(f"class {name}(metaclass=_PybindType):")
        lines += [f"    {field}: {_stub_type(ctype, abi)}" for ctype, field, _default, _doc in fields]
        lines.append("    __hash__: ClassVar[None]  # type: ignore[assignment]")
        lines.append("    def __init__(self) -> None: ...")
        lines.append("    def __eq__(self, other: object) -> bool: ...")
        lines.append("")
    for name, fn in abi["FUNCTIONS"].items():
        params = [
            f"{p.name}: {p.type}" + ("" if p.default is ... else f" = {_stub_default(p.default)}") for p in fn.params
        ]
        lines += _stub_def(name, params, fn.returns)
    return "\n".join(lines) + "\n"


class AbiStub(Command):
    """`setup.py abi_stub`: writes fastload/_engine.pyi; `--check` fails when the committed one differs."""

    description = "generate fastload/_engine.pyi from fastload/engine_abi.py (--check: compare only)"
    user_options: ClassVar[list] = [("check", None, "fail when the committed stub differs from the generated one")]
    boolean_options: ClassVar[list] = ["check"]

    def initialize_options(self):
        """No options by default: write the stub."""
        self.check = False

    def finalize_options(self):
        """Nothing to derive."""

    def run(self):
        """Write, or compare with, the committed stub."""
        text = abi_stub_text()
        try:
            with open(STUB_PATH) as fh:
                current = fh.read()
        except OSError:
            current = None
        if current == text:
            _say(f"{STUB_PATH} is up to date")
            return
        if self.check:
            raise SystemExit(f"{STUB_PATH} differs from the one generated from {ABI_SOURCE}: run `setup.py abi_stub`")
        with open(STUB_PATH, "w") as fh:
            fh.write(text)
        _say(f"wrote {STUB_PATH}")


def _sanitizer_flags():
    """(compile, link) flags of FASTLOAD_SANITIZE=1: an ASan + UBSan build of the engine.

    Meant for CI runs of the decode, restart-index and fuzz tests. Python itself is not
    instrumented, so the ASan runtime must be preloaded (with libstdc++, or ASan cannot intercept
    C++ exceptions) and leak checking left off (the interpreter's own allocations would drown the
    report); --capture=sys lets a sanitizer report reach the log::

        FASTLOAD_SANITIZE=1 python setup.py build_ext --inplace --force
        LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
            ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
            python -m pytest -q --capture=sys tests/test_decode.py tests/test_restart_index.py

    Any UBSan finding aborts the process (-fno-sanitize-recover). ``fastload._engine.info()``
    reports ``sanitized=True``. Rebuild without the variable (with --force) to get the optimized
    engine back.
    """
    if os.environ.get("FASTLOAD_SANITIZE") != "1":
        return [], []
    _say("FASTLOAD_SANITIZE=1: building the engine with AddressSanitizer + UndefinedBehaviorSanitizer")
    return (
        ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g", "-O1"],
        ["-fsanitize=address,undefined"],
    )


class OptionalBuildExt(build_ext):
    """Builds the engine; a failed native build degrades to the Pillow path instead of failing the install."""

    def run(self):
        """Build, reporting a failure instead of raising it."""
        try:
            super().run()
        except Exception as exc:  # the install must still succeed; the fallback is reported at runtime
            if os.environ.get("FASTLOAD_REQUIRE_EXTENSION") == "1":
                raise
            _say(f"C++ engine build failed ({exc}); fastload will use the Pillow decode path")

    def build_extension(self, ext):
        """Generate the ABI header from fastload/engine_abi.py, then build ``ext``."""
        try:
            generated = os.path.join(self.build_temp, "fastload_abi")
            write_abi_header(generated)
            if generated not in ext.include_dirs:
                ext.include_dirs.append(generated)
            super().build_extension(ext)
            _say(f"built {ext.name}")
        except Exception as exc:
            if os.environ.get("FASTLOAD_REQUIRE_EXTENSION") == "1":
                raise
            _say(f"C++ engine build failed ({exc}); fastload will use the Pillow decode path")


def extensions():
    """The engine extension, or none when FASTLOAD_NO_EXTENSION=1."""
    if os.environ.get("FASTLOAD_NO_EXTENSION") == "1":
        _say("FASTLOAD_NO_EXTENSION=1: building without the C++ engine")
        return []
    jpeg = find_libjpeg_turbo()
    if jpeg is None:
        if os.environ.get("FASTLOAD_REQUIRE_EXTENSION") == "1":
            raise SystemExit("FASTLOAD_REQUIRE_EXTENSION=1 but libjpeg-turbo was not found")
        return []
    try:
        from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
    except ImportError:
        _say("pybind11 is not installed in the build environment; building without the C++ engine")
        return []
    # FASTLOAD_BUILD_JOBS=N compiles the engine's sources on N threads (0: every core); unset, one at
    # a time as before (setuptools' own --parallel only runs whole extensions side by side).
    ParallelCompile("FASTLOAD_BUILD_JOBS", default=1).install()
    sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    sanitize_compile, sanitize_link = _sanitizer_flags()
    return [
        Pybind11Extension(
            "fastload._engine",
            sources,
            # Headers and the ABI definition too: editing any of them rebuilds the engine.
            depends=[*sorted(glob.glob(os.path.join("csrc", "**", "*.h"), recursive=True)), ABI_SOURCE],
            include_dirs=jpeg["include_dirs"] + ["csrc"],
            library_dirs=jpeg["library_dirs"],
            libraries=jpeg["libraries"],
            define_macros=[("FASTLOAD_JPEG_TURBO_VERSION", f'"{jpeg["version"]}"')],
            # The sanitizer build's -O1 comes after -O3 and wins.
            extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", *sanitize_compile],
            extra_link_args=sanitize_link,
            cxx_std=17,
        )
    ]


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": OptionalBuildExt, "abi_stub": AbiStub},
    zip_safe=False,
)
