# Everything runs from the repository's own virtual environment (.venv), which
# `make setup` creates or brings up to date: a CPU install of the real sglang.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-stamp
PYTEST := $(BIN)/python -m pytest
CLI    := $(BIN)/sglang-dcp-dspark

.PHONY: setup trees upstream-trees release-trees next-trees demo lint check test bench bench-smoke gpu-check gpu-bundle clean

setup: $(STAMP)

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
# parent re-patched), `release-trees` (stock 0.5.19 to 0.5.22, on which
# preflight and the plugin are judged by each release's own code) and
# `next-trees` (0.5.23 and the copy with patches/upstream-next), and
# TREE_TESTS, one pytest run per tree.
include build/trees.mk

build/trees.mk: patches/trees.json $(wildcard patches/*/config.json) tools/tree_table.py
	mkdir -p $(@D) && $(PYTHON) tools/tree_table.py --make > $@.tmp && mv $@.tmp $@

# preflight's exit code is its verdict on the launch (0 passes, 1 rejected, 3 stops at startup, 5 a broken pass,
# 6 passes with its passes under DCP unchecked): the demo succeeds whenever a verdict is reached and printed, and
# fails on bad input (2) or an internal error (4).
demo: setup
	$(CLI) status
	$(CLI) preflight; code=$$?; case $$code in 0|1|3|5|6) exit 0;; *) exit $$code;; esac

# ruff, configured in pyproject.toml (CI runs it before the tests).
lint: setup
	$(BIN)/ruff check .

# Host memory pinned per rank and node in the three setups (docs/host-memory.md
# is its --markdown output); what load_plugins() adds with the plugin on, on
# 0.5.17 and on 0.5.23 (5 pairs of fresh processes each), and what reading the
# pass map adds to it on 0.5.23; preflight's peak RSS
# at 1x, 10x and 100x the device rows against a bare sglang import, and a
# sweep's cost per value, on 0.5.17 and on 0.5.23; the HiCache bytes
# moved per token, counted in a data-path run on the patched tree; the
# sharded draft backup (upstream-next 0005-0007) against the replicated one
# on real multi-process DCP groups of 2, 4 and 8 ranks; and what planning one
# verify step under DCP costs, the per-row design beside the split one (0012),
# on 0.5.23 (docs/verify-under-dcp.md).
bench: setup trees next-trees
	$(BIN)/python bench/host_memory.py
	$(BIN)/python bench/plugin_overhead.py
	$(BIN)/python bench/plugin_overhead.py --tree $(TREE_next_stock)
	$(BIN)/python bench/pass_map_cost.py --tree $(TREE_next_stock)
	$(BIN)/python bench/preflight_cost.py
	$(BIN)/python bench/preflight_cost.py --tree $(TREE_next_stock)
	PYTHONPATH=$(TREE_patched) $(BIN)/python bench/hicache_traffic.py
	PYTHONPATH=$(TREE_next_patched) $(BIN)/python bench/sharded_draft.py
	PYTHONPATH=$(TREE_next_stock) $(BIN)/python bench/verify_cost.py

# Every bench above once, at its smallest size, on the same trees (CI runs it after the tests): it proves each
# script still runs from a fresh clone, in well under 3 minutes. Its figures are no measurement; make bench's are.
bench-smoke: setup trees next-trees
	$(BIN)/python bench/host_memory.py --dcp 8 --model DeepSeek-V3
	$(BIN)/python bench/plugin_overhead.py --smoke
	$(BIN)/python bench/pass_map_cost.py --tree $(TREE_next_stock) --smoke
	$(BIN)/python bench/preflight_cost.py --tree $(TREE_next_stock) --smoke
	PYTHONPATH=$(TREE_patched) $(BIN)/python bench/hicache_traffic.py --dcp 2 --target-layers 1
	PYTHONPATH=$(TREE_next_patched) $(BIN)/python bench/sharded_draft.py --dcp 2
	PYTHONPATH=$(TREE_next_stock) $(BIN)/python bench/verify_cost.py --smoke

# The unit tier: the package's own tests on the installed sglang alone (no tree
# to build), in a few minutes; make test runs them again with everything else.
CHECK_TESTS := test/project/test_layout.py test/project/test_every_test_ran.py test/project/test_tree_table.py \
	test/cli test/core test/plugin test/preflight test/passes test/series test/numerics/test_mla_oracle.py \
	test/numerics/test_decode_oracle.py
# (The tree table's check of every built tree is left to make test: the unit tier builds none.)
check: setup
	DCP_DSPARK_TREE=stock $(PYTEST) -q $(CHECK_TESTS) \
		--deselect test/project/test_tree_table.py::test_every_series_reads_as_the_table_says_on_every_tree

# pytest runs once per sglang tree of patches/trees.json, with PYTHONPATH on
# that tree and DCP_DSPARK_TREE naming it (the tree's `tests` in
# patches/trees.json say which directories); then test/every_test_ran.py checks that every test passed on
# at least one tree. Tests marked `regression` describe the fix: on a tree the table
# marks `defect` they are strict xfails, elsewhere they must pass. The stock
# run takes all of test/ (test/cli/test_export.py also reads the other trees);
# test/datapath runs on every tree (docs/hicache-datapath.md has the matrix).
test: setup $(TREE_TARGETS)
	$(TREE_TESTS)

# On a machine with one CUDA GPU (never in CI): round trip and stress at dcp 8
# with device pools on cuda, pinned host pools and real streams. A GPU machine
# without sglang or a network gets build/gpu from `make gpu-bundle` (wheels
# for Python 3.12 and the series' files) and runs tools/emulation/datapath/gpu_run.sh.
# Without the venv (a bare GPU machine), EMULATION puts the library on the path the way the editable install does.
EMULATION := python:tools
gpu-check:
	PYTHONPATH=$(EMULATION)$${PYTHONPATH:+:$$PYTHONPATH} $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m emulation.datapath.gpu_check

GPU_BUNDLE := build/gpu
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_26 2_24 2_17,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64
gpu-bundle: trees
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)/whl $(GPU_BUNDLE)/overlay
	$(BIN)/python -m pip download -q --no-deps -d $(GPU_BUNDLE)/whl sglang==$(SGLANG_BASE)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) -d $(GPU_BUNDLE)/whl -r requirements/gpu-bundle.txt
	cd $(TREE_patched) && cp --parents $$($(CURDIR)/$(BIN)/python -c "from sglang_dcp_dspark import series; \
		print(' '.join(f.removeprefix('python/') for f in series.load_series('sglang-$(SGLANG_BASE)').files))") \
		$(CURDIR)/$(GPU_BUNDLE)/overlay/

clean:
	rm -rf build $(VENV)
