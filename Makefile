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

.PHONY: demo test test-pillow lint stub docs sanitize wheel wheel-smoke system-deps venv build bench bench-quick clean device-check

system-deps:
	@bash tools/install_system_deps.sh

$(STAMP): setup.py pyproject.toml $(wildcard csrc/*/*.cpp csrc/*/*.h)
	@$(MAKE) --no-print-directory system-deps
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip wheel setuptools pybind11
	# torch first and pinned: these versions are local wheels (a CUDA build that runs on the CPU);
	# torchvision does not import beside the CPU-only 2.13.0 wheel, and a bare "torch" would download.
	$(VPY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(VPY) -m pip install -q --no-build-isolation -e ".[torch,mxnet,test,bench,dev,docs,ingest]"
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
	$(VPY) -m pytest -q -rs tests

# The whole suite with Pillow decoding every image (the path used where the engine is not built).
test-pillow: $(STAMP)
	FASTLOAD_DECODER=pillow $(VPY) -m pytest -q -rs tests

# ruff and mypy over the scope pyproject.toml gives them (the same hooks as .pre-commit-config.yaml);
# the engine's stub: generated from fastload/engine_abi.py (the committed one must be that output) and
# checked against the built engine by mypy's stubtest; the C++ sources against .clang-format.
CSRC := $(sort $(wildcard csrc/*/*.cpp csrc/*/*.h))
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VPY) setup.py -q abi_stub --check
	$(VPY) -m mypy.stubtest fastload._engine --mypy-config-file tools/stubtest.ini
	$(VENV)/bin/clang-format --dry-run --Werror $(CSRC)

# The engine's stub fastload/_engine.pyi, regenerated from fastload/engine_abi.py.
stub:
	$(VPY) setup.py -q abi_stub

# The docs site (mkdocs.yml: MkDocs + Material, the API reference from the docstrings by mkdocstrings)
# into site/; --strict fails on a broken link, a missing page or an API name that does not resolve.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The engine built with AddressSanitizer + UndefinedBehaviorSanitizer (setup.py's FASTLOAD_SANITIZE=1)
# in build/sanitize/, a copy of the checkout (which keeps its normal build), then the tests that drive
# the engine hardest, run from the copy. Python itself is not instrumented: libasan is preloaded, leak checks are off
# (the interpreter keeps its memory to the end), any UBSan report fails the run.
SAN_DIR   := build/sanitize
SAN_TESTS ?= tests/test_decode.py tests/test_restart_index.py tests/test_framing.py tests/test_pack.py \
	tests/test_pixel_ops.py tests/test_pipeline.py tests/test_arrays.py tests/test_fuzz.py \
	tests/test_warp.py tests/test_warp_pipeline.py tests/test_mix_fused.py tests/test_ingest_engine.py
sanitize: $(STAMP)
	rm -rf $(SAN_DIR)
	$(VPY) -c "import shutil; [shutil.copytree(d, '$(SAN_DIR)/' + d, ignore=shutil.ignore_patterns('__pycache__', '*.so')) for d in ('fastload', 'tests', 'tools', 'bench', 'csrc')]; shutil.copy('pyproject.toml', '$(SAN_DIR)'); shutil.copy('setup.py', '$(SAN_DIR)')"
	cd $(SAN_DIR) && FASTLOAD_SANITIZE=1 FASTLOAD_REQUIRE_EXTENSION=1 $(abspath $(VPY)) setup.py -q build_ext --inplace
	nm -D $(SAN_DIR)/fastload/_engine*.so | grep -q __asan_report  # the build is instrumented
	# The copy is its own checkout: its conftest puts it first on sys.path, and FASTLOAD_EXPECT_SANITIZED
	# makes the session fail if the engine it imports is not the instrumented one.
	cd $(SAN_DIR) && LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		FASTLOAD_EXPECT_SANITIZED=1 $(abspath $(VPY)) -m pytest -q --capture=sys -p no:cacheprovider $(SAN_TESTS)

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

# Every GPU path and the scaling with cores, on a GPU machine (docs/gpu.md): builds the engine for the
# machine's Python against the carried libjpeg-turbo (tools/prepare_device_carry.sh makes .device/),
# installs the carried wheels aside, generates the dataset, runs the parts, writes
# $(DEVICE_CHECK_OUT)/device-check.json and .md. DRY_RUN=1 (automatic without CUDA): CPU devices,
# tiny sizes, the same code. PARTS=h2d,train_step runs a subset. Never touches the venv's packages.
DEVICE_PY         ?= $(if $(wildcard $(VPY)),$(VPY),$(PY))
DEVICE_CHECK_OUT  ?= build/device-check
DEVICE_CHECK_DATA ?= build/device-check-data
DEVICE_CARRY      ?= .device
device-check:
	$(DEVICE_PY) -m bench.device_check --out $(DEVICE_CHECK_OUT) --data $(DEVICE_CHECK_DATA) --carry $(DEVICE_CARRY) \
		$(if $(filter-out 0,$(DRY_RUN)),--dry-run) $(if $(PARTS),--parts $(PARTS))

clean:
	rm -rf build dist *.egg-info fastload/*.so $(DEMO) bench-out site
