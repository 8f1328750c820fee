"""The emulation library: sglang's passes, HiCache data path and MLA kernels run on CPU, on a real sglang tree.

Not shipped in the wheel. `make setup` installs the project editable with ``tools/`` on the venv's path
(pyproject.toml, ``dev-mode-dirs``), so tests, benches and tools all import it the same way, as ``emulation``:

- ``emulation.datapath``: the HiCache data-path harness (real pools and controller pieces, logical locs, draft
  registration of the imported tree), its layouts, scenarios, multi-process ranks and the GPU check;
- ``emulation.passmap``: the pass map's cases and runner, per speculative algorithm (NEXTN, fa3, DSPARK, EAGLE),
  the plain launch's passes, the launch probes, and the command that writes and checks the map;
- ``emulation.mla``: the MLA decode oracle and the verify-under-DCP numerics;
- ``emulation.rank_pools``: sglang 0.5.23's target and draft host pools of one DCP rank, built by its own
  ``build_kv_only_stack``, on the meta device.

Which sglang it runs on is the one on ``PYTHONPATH`` (a tree under build/trees) or the venv's.
"""
