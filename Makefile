# Quick start: `make demo` and `make test` set up everything a fresh Debian machine needs (as root),
# quietly and only once, then run. Other targets: `make models` regenerates tests/data with pnnx.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
APT_PACKAGES := build-essential cmake libvulkan-dev libvulkan1 glslang-tools spirv-tools mesa-vulkan-drivers \
                vulkan-validationlayers vulkan-tools python3-venv python3-dev locales ninja-build
# What the build reads (not the bytecode that importing the editable install writes beside the sources).
SOURCES := $(shell find src include shaders cmake python -type f -not -path '*/__pycache__/*') CMakeLists.txt \
           pyproject.toml
# ncnn compiled from its pinned source (tools/build_ncnn.sh), cached outside the clone: built once per machine.
# VKNORM_CACHE moves that cache (its sources, build tree and install), as it does for tools/build_ncnn.sh.
VKNORM_CACHE ?= $(HOME)/.cache/vknorm
NCNN_PREFIX := $(VKNORM_CACHE)/ncnn-1.0.20261020

.PHONY: demo test setup models clean
# The main job: the device table; a real ncnn model (a pnnx-made transformer block) checked inside ncnn's
# Vulkan graph, layer by layer (stock CPU fp32 vs stock Vulkan vs vknorm inside); then the end-to-end
# gain on the LayerNorm-dominated model (ms per inference, stock ncnn beside vknorm in one run).
demo: setup
	@$(VENV)/bin/vknorm info
	@echo
	@$(VENV)/bin/vknorm check tests/data/transformer_block.ncnn.param tests/data/transformer_block.ncnn.bin \
	  --input in0=16x64 --vulkan
	@echo
	@$(VENV)/bin/vknorm bench --model tests/data/ln_residual_stack.ncnn.param tests/data/ln_residual_stack.ncnn.bin \
	  --input in0=197x768 --iters 20

# The suite runs in one worker per core (pytest-xdist; most of its time is lavapipe making pipelines, one core each);
# loadfile keeps each file's module fixtures, which build C++ examples in fixed directories, in one worker.
TEST_WORKERS ?= $(shell nproc)
test: setup
	@VKNORM_VALIDATION=1 VKNORM_TEST_REQUIRE_ALL=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

setup: $(STAMPS)/apt $(STAMPS)/venv $(NCNN_PREFIX)/.complete $(STAMPS)/install

# Checked again when the Makefile (its package list) changes; the steps after it need it only to have run.
$(STAMPS)/apt: Makefile
	@mkdir -p $(STAMPS)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install" $$missing; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	fi
	@touch $@

$(STAMPS)/venv: requirements-dev.txt | $(STAMPS)/apt
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@touch $@

# The built ncnn itself, not a stamp in the clone: a cache deleted (or VKNORM_CACHE moved) builds it again.
$(NCNN_PREFIX)/.complete: tools/build_ncnn.sh | $(STAMPS)/apt
	@tools/build_ncnn.sh "$(NCNN_PREFIX)" >/dev/null
	@touch $@ 2>/dev/null || true  # a cache this user cannot write (shared, read-only) is used as it is

$(STAMPS)/install: $(STAMPS)/venv $(NCNN_PREFIX)/.complete $(SOURCES)
	@echo "building vknorm (C++ core, shaders, bindings, ncnn layers)"
	@# a build tree configured by another generator (before ninja was installed) stops CMake: made again
	@for c in build/cp*/CMakeCache.txt; do [ ! -f "$$c" ] || grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$$' "$$c" || \
	  rm -rf "$$(dirname "$$c")"; done
	@$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -e . \
	  -C cmake.define.VKNORM_NCNN=ON -C cmake.define.ncnn_DIR=$(NCNN_PREFIX)/lib/cmake/ncnn || \
	  { echo "build failed; rerun: $(PY) -m pip install -v --no-build-isolation -e . -C cmake.define.VKNORM_NCNN=ON -C cmake.define.ncnn_DIR=$(NCNN_PREFIX)/lib/cmake/ncnn"; exit 1; }
	@touch $@

MODELS_VENV ?= /opt/vknorm-models-venv
TORCH_WHEEL ?= /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
models:
	@test -x $(MODELS_VENV)/bin/python || python3 -m venv $(MODELS_VENV)
	@$(MODELS_VENV)/bin/pip install -q $(TORCH_WHEEL)
	@$(MODELS_VENV)/bin/pip install -q -r tools/requirements-models.txt
	$(MODELS_VENV)/bin/python tools/make_models.py --out tests/data

clean:
	rm -rf build $(VENV) $(STAMPS)
