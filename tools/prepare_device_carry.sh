#!/usr/bin/env bash
# Prepares .device/, the folder that travels with the source tree to a GPU machine that has no
# network and no package manager (`make device-check` there reads it):
#
#   .device/debs/     Debian 12's libjpeg62-turbo and libjpeg62-turbo-dev (2.1.5), as downloaded
#   .device/jpeg/     the two packages unpacked with `dpkg -x` (a prefix: usr/include, usr/lib/<triplet>);
#                     the engine is built against it with FASTLOAD_JPEG_ROOT=.device/jpeg/usr and
#                     finds its libjpeg.so.62 there at run time (rpath)
#   .device/python3.12/include/
#                     CPython 3.12's headers, used only if the GPU machine's Python lacks Python.h
#   .device/wheels/   Python 3.12 manylinux wheels of what the GPU machine lacks (lmdb), installed
#                     there with `pip install --no-index --no-deps --target`, never touching its torch
#
# Usage: bash tools/prepare_device_carry.sh [--force]
# Idempotent: what is already there is kept (--force downloads again). Needs apt-get and pip with
# access to Debian's and PyPI's registries; prints the folder's size, which must stay well under the
# 64 MiB a transfer to the GPU machine may carry. The generated dataset is never put here: it is made
# on the GPU machine itself.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=.device
# Debian 12 (bookworm) ships libjpeg-turbo 2.1.5; the version is pinned so every carry is the same.
JPEG_VERSION="1:2.1.5-2"
JPEG_PACKAGES=(libjpeg62-turbo libjpeg62-turbo-dev)
# What the GPU machine's Python 3.12 lacks among fastload's dependencies.
WHEELS=("lmdb==3.0.0")
PY_VERSION=3.12

force=0
[[ "${1:-}" == "--force" ]] && force=1
if ((force)); then
    rm -rf "$DEST"
fi
mkdir -p "$DEST/debs" "$DEST/jpeg" "$DEST/wheels"

# 1. The libjpeg-turbo packages (amd64: the GPU machine is x86-64 whatever this one is).
if ! ls "$DEST"/debs/libjpeg62-turbo-dev_*.deb >/dev/null 2>&1; then
    apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64)
    specs=()
    for p in "${JPEG_PACKAGES[@]}"; do specs+=("$p:amd64=$JPEG_VERSION"); done
    if ! (cd "$DEST/debs" && apt-get "${apt_opts[@]}" download "${specs[@]}"); then
        echo "prepare_device_carry: apt-get download failed; run 'apt-get update' first" >&2
        exit 1
    fi
fi

# 2. Unpacked into a prefix (never into /: these are headers and a library for the build only).
if [[ ! -f "$DEST/jpeg/usr/include/jpeglib.h" ]]; then
    rm -rf "$DEST/jpeg" && mkdir -p "$DEST/jpeg"
    for deb in "$DEST"/debs/*.deb; do
        dpkg -x "$deb" "$DEST/jpeg"
    done
fi
# The documentation and lintian files are not needed to build or run.
rm -rf "$DEST/jpeg/usr/share"
test -f "$DEST/jpeg/usr/include/jpeglib.h"
ls "$DEST"/jpeg/usr/lib/*-linux-gnu/libjpeg.so.62 >/dev/null

# 3. CPython 3.12's headers, in case the GPU machine's Python has none (a venv of a distribution
#    Python without its -dev package): the engine's build adds them only when Python.h is missing
#    there. Any local 3.12 will do: the C API is the same across 3.12.x releases.
if [[ ! -f "$DEST/python$PY_VERSION/include/Python.h" ]]; then
    py312=""
    for candidate in "${PYTHON312:-}" "python$PY_VERSION" /root/.pyenv/versions/"$PY_VERSION".*/bin/python"$PY_VERSION"; do
        if [[ -n "$candidate" ]] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            py312=$candidate
            break
        fi
    done
    if [[ -n "$py312" ]]; then
        inc=$("$py312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
        mkdir -p "$DEST/python$PY_VERSION"
        cp -r "$inc" "$DEST/python$PY_VERSION/include"
    else
        echo "prepare_device_carry: no Python $PY_VERSION here (set PYTHON312=...); its headers are not carried" >&2
    fi
fi

# 4. Wheels for the GPU machine's Python 3.12 (x86-64 manylinux), without dependencies.
if ! ls "$DEST"/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST/wheels" "${WHEELS[@]}"
fi

echo "prepare_device_carry: $DEST is ready:"
find "$DEST" -name '*.deb' -o -name '*.whl' -o -name 'libjpeg.so*' -o -name jpeglib.h -o -name Python.h | sort | sed 's/^/  /'
du -sh "$DEST" | sed 's/^/  total /'
bytes=$(du -sb "$DEST" | cut -f1)
if ((bytes > 32 * 1024 * 1024)); then
    echo "prepare_device_carry: $DEST is over 32 MiB; a transfer may carry 64 MiB with the source tree" >&2
    exit 1
fi
