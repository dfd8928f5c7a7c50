#!/usr/bin/env bash
# Peer virtual environments for `fastload bench`: loaders whose dependencies conflict with the main
# .venv (MXNet 1.9.1 needs numpy<1.24; DALI wants numpy 2) get their own interpreter, which the
# benchmark finds by itself (.venv-dali/bin/python) or takes from --peer-python NAME=/path.
#
# Idempotent: an environment whose import check passes is left alone. Exit 0 when every requested
# environment is ready or (FFCV only) skipped for a stated reason, 1 when an install failed. Usage:
#   bash tools/setup_peer_envs.sh [--apt] [dali] [ffcv]   (default: dali; ffcv only when asked)
# --apt lets the ffcv step apt-get install the OpenCV / libturbojpeg dev packages it builds against
# (about 250 Debian packages); without it a missing package makes the step report a skip.
# Not part of the test path: the download is large (DALI's wheel is several hundred MB).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-python3}"
APT=0
WANT=()
for arg in "$@"; do
    if [ "$arg" = "--apt" ]; then APT=1; else WANT+=("$arg"); fi
done
[ ${#WANT[@]} -eq 0 ] && WANT=(dali)
STATUS=0

say() { echo "setup_peer_envs: $*"; }

make_venv() {  # make_venv DIR
    local dir="$1"
    if [ ! -x "$dir/bin/python" ]; then
        "$PY" -m venv "$dir" || { say "cannot create $dir with $PY -m venv"; return 1; }
    fi
    "$dir/bin/python" -m pip install -q --upgrade pip wheel >/dev/null || return 1
}

setup_dali() {
    local dir="$ROOT/.venv-dali"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import nvidia.dali, numpy, PIL" 2>/dev/null; then
        say "dali: ready ($("$dir/bin/python" -c 'import nvidia.dali as d; print(d.__version__)')) at $dir"
        return 0
    fi
    say "dali: creating $dir (nvidia-dali-cuda120, numpy>=2, pillow)"
    make_venv "$dir" || return 1
    # DALI's CPU pipeline (device_id=None) needs no GPU and no CUDA toolkit at run time.
    "$dir/bin/python" -m pip install -q nvidia-dali-cuda120 "numpy>=2" pillow || { say "dali: pip install failed"; return 1; }
    "$dir/bin/python" -c "import nvidia.dali as d; print('setup_peer_envs: dali: ready', d.__version__)"
}

setup_ffcv() {
    local dir="$ROOT/.venv-ffcv"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import ffcv" 2>/dev/null; then
        say "ffcv: ready at $dir"
        return 0
    fi
    # ffcv compiles a C extension against OpenCV and libturbojpeg found through pkg-config.
    if [ "$APT" = 1 ] && ! { pkg-config --exists opencv4 && pkg-config --exists libturbojpeg; } 2>/dev/null; then
        say "ffcv: apt-get install libopencv-dev libturbojpeg0-dev pkg-config"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            libopencv-dev libturbojpeg0-dev pkg-config >/dev/null || { say "ffcv: apt-get install failed"; return 1; }
    fi
    for pc in opencv4 libturbojpeg; do
        if ! pkg-config --exists "$pc" 2>/dev/null; then
            say "ffcv: skipped: pkg-config cannot find $pc (apt-get install libopencv-dev libturbojpeg0-dev pkg-config)"
            return 2
        fi
    done
    say "ffcv: creating $dir (ffcv, numpy<2, torch CPU, opencv-python-headless, numba)"
    make_venv "$dir" || return 1
    "$dir/bin/python" -m pip install -q torch==2.13.0 "numpy<2" opencv-python-headless numba pillow || { say "ffcv: dependency install failed"; return 1; }
    "$dir/bin/python" -m pip install -q --no-build-isolation ffcv || { say "ffcv: pip install ffcv failed (build)"; return 1; }
    "$dir/bin/python" -c "import ffcv; print('setup_peer_envs: ffcv: ready')"
}

for name in "${WANT[@]}"; do
    case "$name" in
        dali) setup_dali || STATUS=1 ;;
        ffcv) setup_ffcv; rc=$?; [ $rc -eq 1 ] && STATUS=1 ;;  # 2 = skipped (optional peer), not a failure
        *) say "unknown peer environment '$name' (known: dali, ffcv)"; STATUS=2 ;;
    esac
done
exit $STATUS
