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

.PHONY: setup trees demo test bench clean

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

demo: setup trees
	$(CLI) status
	$(CLI) coverage
	PYTHONPATH=$(PATCHED) $(CLI) coverage

# The regression tests run twice: on the stock tree they must fail (strict
# xfail), on the patched tree they must pass.
test: setup trees
	$(PYTEST) test
	DCP_DSPARK_TREE=patched PYTHONPATH=$(PATCHED) $(PYTEST) test/regression

clean:
	rm -rf build $(VENV)
