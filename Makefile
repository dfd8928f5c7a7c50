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

.PHONY: demo test system-deps venv build bench bench-quick clean

system-deps:
	@bash tools/install_system_deps.sh

$(STAMP): setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)
	@$(MAKE) --no-print-directory system-deps
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip wheel setuptools pybind11
	# torch first and pinned: these versions are local wheels (a CUDA build that runs on the CPU);
	# torchvision does not import beside the CPU-only 2.13.0 wheel, and a bare "torch" would download.
	$(VPY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(VPY) -m pip install -q --no-build-isolation -e ".[torch,mxnet,test,bench]"
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

bench: $(STAMP)
	# DALI and FFCV run in their own environments; a peer whose set-up fails is reported as skipped.
	-bash tools/setup_peer_envs.sh --apt dali ffcv
	$(VENV)/bin/fastload bench --out bench-out

bench-quick: $(STAMP)
	$(VENV)/bin/fastload bench --quick --out bench-out

clean:
	rm -rf build *.egg-info fastload/*.so $(DEMO) bench-out
