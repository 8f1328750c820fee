# Everything runs from the repository's own virtual environment (.venv), which
# `make setup` creates or brings up to date: a CPU install of the real sglang.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-stamp
PYTEST := $(BIN)/python -m pytest
CLI    := $(BIN)/sglang-dcp-dspark

.PHONY: help setup trees upstream-trees release-trees next-trees demo lint check test test-report bench bench-smoke \
	gpu-check gpu-bundle gpu-check-verify gpu-bundle-verify clean

# Each target's line in `make help` is the `## ...` beside it, here or in build/trees.mk (rendered from
# patches/trees.json).
help: ## this list: every target, one line each
	@awk -F':[^#]*## ' '/^[a-zA-Z0-9_.-]+:[^=]*## /{printf "  %-26s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP) ## create or update .venv: real sglang 0.5.17 on CPU, this package

# sglang goes in with --no-deps: its own requirements pin the CUDA stack.
$(STAMP): pyproject.toml requirements/cpu.txt requirements/dev.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -r requirements/cpu.txt -r requirements/dev.txt
	$(BIN)/python -m pip install -q --no-deps sglang==$(SGLANG_BASE)
	$(BIN)/python -m pip install -q --no-deps -e .
	# Bytecode for the package, as pip writes it for a wheel: every sglang process imports
	# the plugin, and with PYTHONDONTWRITEBYTECODE set it would compile it from source each time.
	$(BIN)/python -m compileall -q python/sglang_dcp_dspark
	touch $@

# Every sglang tree the tests run on, how it is built and what runs on it is
# patches/trees.json; build/trees.mk is rendered from it (make remakes it
# first whenever it or a series' config.json changes) and holds SGLANG_BASE, a rule
# per tree under build/trees, the groups `trees` (the 0.5.17 copy with the
# backport applied), `upstream-trees` (PR #35221 in upstream's form: stock
# 0.5.18, the PR's parent rebuilt from it by reversing the series, and that
# parent re-patched), `release-trees` (the stock releases no series is written
# for) and `next-trees` (the release patches/upstream-next is written for, and
# the copy with the series), a target test-<label> per run of make test
# (TEST_RUNS, longest first) and check-<label> per run of make check (CHECK_RUNS).
include build/trees.mk

build/trees.mk: patches/trees.json $(wildcard patches/*/config.json) tools/tree_table.py
	@mkdir -p $(@D) && $(PYTHON) tools/tree_table.py --make > $@.tmp && mv $@.tmp $@

# preflight's exit code is its verdict on the launch (core/exits.py says which codes are verdicts): the demo
# succeeds whenever a verdict is reached and printed, and fails with any other code.
demo: setup ## preflight on its embedded default (exit 0 once a verdict is printed)
	$(CLI) status
	$(CLI) preflight; $(BIN)/python -m sglang_dcp_dspark.core.exits --verdict $$?

# ruff, configured in pyproject.toml (CI runs it before the tests).
lint: setup ## ruff over the repository
	$(BIN)/ruff check .

# bench/verify_cost.py's flashinfer (requirements/bench-flashinfer.txt): the wheel sglang 0.5.23 pins, for that
# bench alone, under build/bench and on no other path; installed once, again when the pins change.
BENCH_FLASHINFER := build/bench/flashinfer/.installed
$(BENCH_FLASHINFER): requirements/bench-flashinfer.txt | $(STAMP)
	rm -rf $(@D)
	$(BIN)/python -m pip install -q --no-deps --target $(@D) -r requirements/bench-flashinfer.txt
	touch $@

# Host memory pinned per rank and node in the three setups (docs/host-memory.md
# is its --markdown output); what load_plugins() adds with the plugin on, on
# 0.5.17 and on 0.5.23 (5 pairs of fresh processes each), and what reading the
# pass map adds to it on 0.5.23; preflight's peak RSS
# at 1x, 10x and 100x the device rows against a bare sglang import, and a
# sweep's cost per value, on 0.5.17 and on 0.5.23; the HiCache bytes
# moved per token, counted in a data-path run on the patched tree; the
# sharded draft backup (upstream-next 0005-0007) against the replicated one
# on real multi-process DCP groups of 2, 4 and 8 ranks; and what the verify
# under DCP costs a GPU per layer and per step on 0.5.23, stock's, the per-row
# design's and the split's as shipped and now, with flashinfer 0.7.2's own plan()
# run on the CPU (docs/verify-under-dcp.md).
bench: setup trees next-trees $(BENCH_FLASHINFER) ## every benchmark in bench/, at full size (figures for the docs)
	$(BIN)/python bench/host_memory.py
	$(BIN)/python bench/plugin_overhead.py
	$(BIN)/python bench/plugin_overhead.py --tree $(TREE_next_stock)
	$(BIN)/python bench/pass_map_cost.py --tree $(TREE_next_stock)
	$(BIN)/python bench/preflight_cost.py
	$(BIN)/python bench/preflight_cost.py --tree $(TREE_next_stock)
	PYTHONPATH=$(TREE_patched) $(BIN)/python bench/hicache_traffic.py
	PYTHONPATH=$(TREE_next_patched) $(BIN)/python bench/sharded_draft.py
	PYTHONPATH=$(TREE_next_stock):tools:build/bench/flashinfer $(BIN)/python bench/verify_cost.py

# Every bench above once, at its smallest size, on the same trees (CI runs it beside the tests): it proves each
# script still runs from a fresh clone, in well under 3 minutes. Its figures are no measurement; make bench's are.
bench-smoke: setup trees next-trees $(BENCH_FLASHINFER) ## every benchmark once at its smallest size (CI runs it)
	$(BIN)/python bench/host_memory.py --dcp 8 --model DeepSeek-V3
	$(BIN)/python bench/plugin_overhead.py --smoke
	$(BIN)/python bench/pass_map_cost.py --tree $(TREE_next_stock) --smoke
	$(BIN)/python bench/preflight_cost.py --tree $(TREE_next_stock) --smoke
	PYTHONPATH=$(TREE_patched) $(BIN)/python bench/hicache_traffic.py --dcp 2 --target-layers 1
	PYTHONPATH=$(TREE_next_patched) $(BIN)/python bench/sharded_draft.py --dcp 2
	PYTHONPATH=$(TREE_next_stock):tools:build/bench/flashinfer $(BIN)/python bench/verify_cost.py --smoke

# The unit tier: the package's own tests on the installed sglang alone, with no tree to build, and the tests that
# import no sglang (patches/trees.json's `unit` runs and `tree_free`), two runs at a time, each to its log under
# build/check. Tests marked `trees` read the trees make test builds: they run in make test's runs, not here.
check: setup ## the unit tier, no tree built: the package's tests, the tree-free ones
	$(MAKE) --no-print-directory -k -j2 $(CHECK_RUNS)

# Every run of patches/trees.json (a pytest process per sglang tree, the unit tier, the tree-free tests) is a make
# target of its own, test-<label> (build/trees.mk), which tools/suite.py runs: its output goes to
# build/logs/<label>.log, its results to build/junit/<label>.xml and .json, kept until the next make test. make test
# builds every tree first, then starts the runs two at a time, the longest first (TEST_RUNS, by each run's cost_s);
# then test/every_test_ran.py checks that every test passed on at least one run, and tools/suite.py report prints
# which runs passed (a failing run's log tail), each run's wall time and test count, and the slowest tests. Tests
# marked `regression` describe the fix: on a tree the table marks `defect` they are strict xfails, elsewhere they
# must pass.
test: setup ## every test, two runs at a time, then the report (build/logs, junit)
	rm -rf build/junit build/logs
	$(MAKE) --no-print-directory -j2 $(TREE_TARGETS)
	-$(MAKE) --no-print-directory -k -j2 $(TEST_RUNS)
	@$(BIN)/python test/every_test_ran.py build/junit; every=$$?; $(BIN)/python tools/suite.py report && exit $$every

test-report: ## the last make test's report: runs passed, time per run, slowest tests
	@$(BIN)/python tools/suite.py report

# On a machine with one CUDA GPU (never in CI): round trip and stress at dcp 8
# with device pools on cuda, pinned host pools and real streams. A GPU machine
# without sglang or a network gets build/gpu from `make gpu-bundle` (wheels
# for Python 3.12 and the series' files) and runs tools/emulation/datapath/gpu_run.sh.
# Without the venv (a bare GPU machine), EMULATION puts the library on the path the way the editable install does.
EMULATION := python:tools
gpu-check: ## one CUDA GPU: the HiCache data path at dcp 8 on real memory (not in CI)
	PYTHONPATH=$(EMULATION)$${PYTHONPATH:+:$$PYTHONPATH} $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m emulation.datapath.gpu_check

GPU_BUNDLE := build/gpu
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_26 2_24 2_17,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64
gpu-bundle: trees ## build/gpu: sglang's wheels and the series, for a GPU machine offline
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)/whl $(GPU_BUNDLE)/overlay
	$(BIN)/python -m pip download -q --no-deps -d $(GPU_BUNDLE)/whl sglang==$(SGLANG_BASE)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) -d $(GPU_BUNDLE)/whl -r requirements/gpu-bundle.txt
	cd $(TREE_patched) && cp --parents $$($(CURDIR)/$(BIN)/python -c "from sglang_dcp_dspark import series; \
		print(' '.join(f.removeprefix('python/') for f in series.load_series('sglang-$(SGLANG_BASE)').files))") \
		$(CURDIR)/$(GPU_BUNDLE)/overlay/

# On a machine with one CUDA GPU (never in CI): the verify under DCP on flashinfer's own MLA kernel
# (tools/emulation/mla/gpu_verify.py, docs/verify-under-dcp.md): the plugin's kernel check and rows of 4K and
# 16K keys at DeepSeek-V3's shape, the split verify at dcp 8 simulated (eager, CUDA graph, re-planned, two
# negative controls) against one rank, its time per layer against one flashinfer run, and its kernel count; at
# most 8 minutes. It needs torch, flashinfer 0.7.2 and sglang's DCP index builder: sglang 0.5.23's from
# build/gpu-verify or the 0.5.23 tree where either is here, else the installed sglang's. A GPU machine without
# them gets build/gpu-verify from `make gpu-bundle-verify` (requirements/gpu-verify-bundle.txt's wheels for
# Python 3.12, flashinfer's without the sources of its other kernels; the builder's one file of sglang 0.5.23,
# under empty package files, so that none of sglang's own imports is needed; about 35 MiB) and runs
# tools/emulation/mla/gpu_verify_run.sh.
gpu-check-verify: ## one CUDA GPU: the split verify on flashinfer's MLA kernel (not in CI)
	PYTHONPATH=$(EMULATION)$(addprefix :,$(firstword $(wildcard $(GPU_VERIFY_BUNDLE)/sglang $(TREE_next_stock))))$${PYTHONPATH:+:$$PYTHONPATH} \
		$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m emulation.mla.gpu_verify

GPU_VERIFY_BUNDLE := build/gpu-verify
gpu-bundle-verify: next-trees ## build/gpu-verify: flashinfer 0.7.2 and sglang's index builder, offline
	rm -rf $(GPU_VERIFY_BUNDLE) && mkdir -p $(GPU_VERIFY_BUNDLE)/flashinfer $(GPU_VERIFY_BUNDLE)/deps $(GPU_VERIFY_BUNDLE)/sglang
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) -d $(GPU_VERIFY_BUNDLE)/deps -r requirements/gpu-verify-bundle.txt
	$(BIN)/python tools/emulation/mla/gpu_verify.py --slim-wheel $(GPU_VERIFY_BUNDLE)/deps/flashinfer_python-*.whl \
		$(GPU_VERIFY_BUNDLE)/flashinfer
	rm $(GPU_VERIFY_BUNDLE)/deps/flashinfer_python-*.whl
	cd $(TREE_next_stock) && cp --parents sglang/kernels/ops/attention/dcp_kernels.py sglang-*.dist-info/METADATA \
		$(CURDIR)/$(GPU_VERIFY_BUNDLE)/sglang/
	cd $(GPU_VERIFY_BUNDLE)/sglang/sglang && touch __init__.py kernels/__init__.py kernels/ops/__init__.py \
		kernels/ops/attention/__init__.py

clean: ## remove build/ and .venv
	rm -rf build $(VENV)
