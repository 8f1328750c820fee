# Everything runs from the repository's own virtual environment (.venv), which
# `make setup` creates or brings up to date: a CPU install of the real sglang.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-stamp
SGLANG_BASE := 0.5.17
TREES  := build/trees
PATCHED := $(TREES)/sglang-$(SGLANG_BASE)-patched
PYTEST := $(BIN)/python -m pytest
CLI    := $(BIN)/sglang-dcp-dspark

.PHONY: setup trees upstream-trees next-trees demo test bench gpu-check gpu-bundle clean

setup: $(STAMP)

# sglang goes in with --no-deps: its own requirements pin the CUDA stack.
$(STAMP): pyproject.toml requirements/cpu.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -r requirements/cpu.txt
	$(BIN)/python -m pip install -q --no-deps sglang==$(SGLANG_BASE)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

# A copy of the installed sglang with the backport series applied, for the
# regression suite to import instead of the stock tree.
$(PATCHED)/.stamp: $(STAMP) $(wildcard patches/sglang-$(SGLANG_BASE)/*)
	rm -rf $(@D) && mkdir -p $(@D)
	cp -r "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sglang" $(@D)/sglang
	$(CLI) apply --target $(@D) --series sglang-$(SGLANG_BASE)
	touch $@

trees: $(PATCHED)/.stamp

# PR #35221 in upstream's form (patches/upstream-pr-35221) is proven against
# three trees: the stock 0.5.18 release; the PR's parent, which no release
# holds, rebuilt from 0.5.18 by reversing the series (no hand edits); and that
# parent with the series applied again.
UPSTREAM_SERIES  := upstream-pr-35221
UPSTREAM_FIXED   := 0.5.18
UPSTREAM_STOCK   := $(TREES)/sglang-$(UPSTREAM_FIXED)
UPSTREAM_BASE    := $(TREES)/$(UPSTREAM_SERIES)-base
UPSTREAM_PATCHED := $(TREES)/$(UPSTREAM_SERIES)-base-patched

$(UPSTREAM_STOCK)/.stamp: $(STAMP)
	rm -rf $(@D)
	$(BIN)/python -m pip install -q --no-deps --target $(@D) sglang==$(UPSTREAM_FIXED)
	touch $@

$(UPSTREAM_BASE)/.stamp: $(UPSTREAM_STOCK)/.stamp $(wildcard patches/$(UPSTREAM_SERIES)/*)
	rm -rf $(@D)
	$(CLI) base --series $(UPSTREAM_SERIES) --from $(UPSTREAM_STOCK) --out $(@D)
	touch $@

$(UPSTREAM_PATCHED)/.stamp: $(UPSTREAM_BASE)/.stamp
	rm -rf $(@D) && cp -r $(UPSTREAM_BASE) $(@D)
	$(CLI) apply --target $(@D) --series $(UPSTREAM_SERIES)
	touch $@

upstream-trees: $(UPSTREAM_BASE)/.stamp $(UPSTREAM_PATCHED)/.stamp

# patches/upstream-next is proposed against the newest release on the index:
# its stock tree, and a copy with the series applied.
NEXT_SERIES  := upstream-next
NEXT_RELEASE := 0.5.23
NEXT_STOCK   := $(TREES)/sglang-$(NEXT_RELEASE)
NEXT_PATCHED := $(TREES)/sglang-$(NEXT_RELEASE)-next

$(NEXT_STOCK)/.stamp: $(STAMP)
	rm -rf $(@D)
	$(BIN)/python -m pip install -q --no-deps --target $(@D) sglang==$(NEXT_RELEASE)
	touch $@

$(NEXT_PATCHED)/.stamp: $(NEXT_STOCK)/.stamp $(wildcard patches/$(NEXT_SERIES)/*)
	rm -rf $(@D) && cp -r $(NEXT_STOCK) $(@D)
	$(CLI) apply --target $(@D) --series $(NEXT_SERIES)
	touch $@

next-trees: $(NEXT_STOCK)/.stamp $(NEXT_PATCHED)/.stamp

demo: setup
	$(CLI) status
	$(CLI) preflight

# Host memory pinned per rank and node in the three setups (docs/host-memory.md
# is its --markdown output); the plugin's import cost with 3 pairs of fresh
# processes rather than the script's default 5; preflight's peak RSS at 1x,
# 10x and 100x the device rows against a bare sglang import; and the HiCache
# bytes moved per token, counted in a data-path run on the patched tree.
bench: setup trees
	$(BIN)/python bench/host_memory.py
	$(BIN)/python bench/plugin_overhead.py --repeats 3
	$(BIN)/python bench/preflight_cost.py
	PYTHONPATH=$(PATCHED) $(BIN)/python bench/hicache_traffic.py

# pytest runs once per sglang tree, with PYTHONPATH on that tree and
# DCP_DSPARK_TREE naming it. Tests marked `regression` describe the fix: on a
# tree with the defect they are strict xfails, elsewhere they must pass.
# - test/: the installed stock 0.5.17 (and everything that needs no other tree;
#   test/test_export.py also reads the rebuilt PR parent and 0.5.23).
# - test/regression: the 0.5.17 copy with the series applied, then stock 0.5.17
#   with the installed plugin loaded.
# - test/upstream_pr: the PR #35221 parent rebuilt from 0.5.18 (defects), that
#   parent re-patched, and stock 0.5.18; the series' own unittest file must fail
#   exactly its fix tests on the parent and pass elsewhere.
# - test/upstream_next: stock 0.5.23 (budget and guard tests are strict xfails)
#   and the copy with patches/upstream-next applied.
# - test/datapath, in every run above: KV bytes through that tree's real HiCache
#   (docs/hicache-datapath.md has the matrix per tree).
test: setup trees upstream-trees next-trees
	$(PYTEST) test
	DCP_DSPARK_TREE=patched PYTHONPATH=$(PATCHED) $(PYTEST) test/regression test/datapath
	DCP_DSPARK_TREE=plugin $(PYTEST) test/regression test/datapath
	DCP_DSPARK_TREE=upstream-base PYTHONPATH=$(UPSTREAM_BASE) $(PYTEST) test/upstream_pr test/datapath
	DCP_DSPARK_TREE=upstream-base-patched PYTHONPATH=$(UPSTREAM_PATCHED) $(PYTEST) test/upstream_pr test/datapath
	DCP_DSPARK_TREE=upstream-0.5.18 PYTHONPATH=$(UPSTREAM_STOCK) $(PYTEST) test/upstream_pr test/datapath
	$(CLI) status --target $(NEXT_STOCK)
	DCP_DSPARK_TREE=next-stock PYTHONPATH=$(NEXT_STOCK) $(PYTEST) test/upstream_next test/datapath
	DCP_DSPARK_TREE=next-patched PYTHONPATH=$(NEXT_PATCHED) $(PYTEST) test/upstream_next test/datapath

# On a machine with one CUDA GPU (never in CI): round trip and stress at dcp 8
# with device pools on cuda, pinned host pools and real streams. A GPU machine
# without sglang or a network gets build/gpu from `make gpu-bundle` (wheels
# for Python 3.12 and the series' files) and runs test/datapath/gpu_run.sh.
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) test/datapath/gpu_check.py

GPU_BUNDLE := build/gpu
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_26 2_24 2_17,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64
gpu-bundle: trees
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)/whl $(GPU_BUNDLE)/overlay
	$(BIN)/python -m pip download -q --no-deps -d $(GPU_BUNDLE)/whl sglang==$(SGLANG_BASE)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) -d $(GPU_BUNDLE)/whl -r requirements/gpu-bundle.txt
	cd $(PATCHED) && cp --parents $$($(CURDIR)/$(BIN)/python -c "from sglang_dcp_dspark import series; \
		print(' '.join(f.removeprefix('python/') for f in series.load_series('sglang-$(SGLANG_BASE)').files))") \
		$(CURDIR)/$(GPU_BUNDLE)/overlay/

clean:
	rm -rf build $(VENV)
