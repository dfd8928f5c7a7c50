# Two commands do all set-up on a fresh Debian machine:
#   make demo   generate a realistic JPEG dataset, pack it, load it, report throughput
#   make test   the whole test suite
# Both create .venv (torch 2.14.1 + torchvision 0.29.1, mxnet 1.9.1 with numpy<1.24, lmdb, ...) and build the
# C++ engine against the system libjpeg-turbo, installing the Debian package when it is missing.

PY       ?= python3
VENV     ?= .venv
VPY      := $(VENV)/bin/python
STAMP    := $(VENV)/.fastload-installed
DEMO     ?= demo-out
COUNT    ?= 1000

.PHONY: demo test test-pillow lint sanitize wheel wheel-smoke system-deps venv build bench bench-quick clean

system-deps:
	@bash tools/install_system_deps.sh

$(STAMP): setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)
	@$(MAKE) --no-print-directory system-deps
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip wheel setuptools pybind11
	# torch first and pinned: these versions are local wheels (a CUDA build that runs on the CPU);
	# torchvision does not import beside the CPU-only 2.13.0 wheel, and a bare "torch" would download.
	$(VPY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(VPY) -m pip install -q --no-build-isolation -e ".[torch,mxnet,test,bench,dev]"
	$(VPY) -m fastload info
	@touch $(STAMP)

venv: $(STAMP)

build: $(STAMP)
	$(VPY) setup.py -q build_ext --inplace

demo: $(STAMP)
	$(VPY) tools/make_dataset.py --count $(COUNT) --seed 0 --odd --overwrite $(DEMO)/images
	$(VENV)/bin/fastload pack $(DEMO)/images $(DEMO)/packed --overwrite
	$(VENV)/bin/fastload verify $(DEMO)/packed
	$(VPY) tools/demo_load.py $(DEMO)/packed

test: $(STAMP)
	$(VPY) -m pytest -q tests

# The whole suite with Pillow decoding every image (the path used where the engine is not built).
test-pillow: $(STAMP)
	FASTLOAD_DECODER=pillow $(VPY) -m pytest -q tests

# ruff and mypy over the scope pyproject.toml gives them (the same hooks as .pre-commit-config.yaml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The engine built with AddressSanitizer + UndefinedBehaviorSanitizer into build/sanitize/ (a copy of
# the package beside the checkout's, which keeps its normal build), then the tests that drive the
# engine hardest. Python itself is not instrumented: libasan is preloaded, leak checks are off
# (the interpreter keeps its memory to the end), any UBSan report fails the run.
SAN_DIR   := build/sanitize
# Two findings of this job are excluded until the engine's owner fixes them (then the exclusions go):
# -fno-sanitize=alignment: the AVX2 resampler stores 8 bytes through a misaligned double* with
#   _mm_storeh_pd (csrc/resize.cpp, hpass4_avx2_t);
# -fno-sanitize=shift-base: `-1 << s` (a left shift of a negative value, undefined before C++20) in
#   the interval Huffman decoder's extend() (csrc/entropy_decode.cpp).
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize=alignment,shift-base -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer -g
SAN_TESTS ?= tests/test_decode.py tests/test_restart_index.py tests/test_framing.py tests/test_pack.py
sanitize: $(STAMP)
	rm -rf $(SAN_DIR)
	$(VPY) -c "import shutil; shutil.copytree('fastload', '$(SAN_DIR)/fastload', ignore=shutil.ignore_patterns('__pycache__', '*.so'))"
	CFLAGS="$(SAN_FLAGS)" CXXFLAGS="$(SAN_FLAGS)" LDFLAGS="-fsanitize=address,undefined" FASTLOAD_REQUIRE_EXTENSION=1 \
		$(VPY) setup.py -q build_ext --build-lib $(SAN_DIR) --build-temp $(SAN_DIR)/tmp
	nm -D $(SAN_DIR)/fastload/_engine*.so | grep -q __asan_report  # the build is instrumented
	PYTHONPATH=$(abspath $(SAN_DIR)):$(CURDIR) LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		sh -c 'cd $(SAN_DIR) && exec $(abspath $(VPY)) -c "import fastload._engine as e, sys; sys.exit(None if \"sanitize\" in e.__file__ else \"not the sanitized engine: \" + e.__file__)"' 
	PYTHONPATH=$(abspath $(SAN_DIR)):$(CURDIR) LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(VENV)/bin/pytest -q -s -p no:cacheprovider $(SAN_TESTS)  # -s: a report reaches the log before the abort

# A wheel a user installs without libjpeg-turbo's -dev package: the system libjpeg-turbo is bundled
# by auditwheel (manylinux_2_35: GCC 12's libstdc++, which the engine needs, sets the floor).
wheel: $(STAMP)
	rm -rf dist
	$(VPY) -m pip wheel . --no-deps --no-build-isolation -w dist/raw -q
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/auditwheel repair dist/raw/fastload-*.whl -w dist

wheel-smoke: wheel
	bash .ci/wheel-smoke dist/fastload-*manylinux*.whl

bench: $(STAMP)
	# DALI and FFCV run in their own environments; a peer whose set-up fails is reported as skipped.
	-bash tools/setup_peer_envs.sh --apt dali ffcv
	$(VENV)/bin/fastload bench --out bench-out

bench-quick: $(STAMP)
	$(VENV)/bin/fastload bench --quick --out bench-out

clean:
	rm -rf build dist *.egg-info fastload/*.so $(DEMO) bench-out
