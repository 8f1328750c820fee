"""Negative controls: a break the map must see, in the write door or the read step, run in the same process."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from unittest import mock

from emulation.passmap import harness, plain
from emulation.passmap.harness import LAYER, tag_values
from emulation.passmap.nextn import FMB

CONTROLS = ("shift-write", "no-translate", "shift-mha-write", "no-lse")
# The cases each control runs (at dcp 2 and 8): NEXTN's MLA passes, or DSPARK's dense draft block on the backend
# objects the harness builds (the default flashinfer, and trtllm_mha).
CONTROL_CASES = {"shift-write": [("NEXTN", None)], "no-translate": [("NEXTN", None)],
                 "shift-mha-write": [("DSPARK", None), ("DSPARK", "trtllm_mha")], "no-lse": []}
# The plain (non-speculative) target each control runs too: flashinfer MLA, whose map reads consistent.
PLAIN_CONTROLS = ("shift-write", "no-lse")


def patches(name: str) -> list:
    """The patchers of control ``name``, each on the object its callers look the name up on: the write doors on
    ``harness`` (every case module calls ``harness.write_mla`` / ``harness.write_mha``), the read step on the
    release's class or backend module, the decode kernel's stand-in on ``plain.LseWrapper``."""
    if name == "shift-write":
        def shifted(pool, locs):  # each loc's tag lands one physical row further (loc + dcp -> row + 1)
            from sglang.srt.runtime_context import get_parallel

            n = max(1, get_parallel().attn_dcp_size)
            pool.set_mla_kv_buffer(LAYER, harness.mla_loc(pool, locs + n), *tag_values("mla", locs))

        return [mock.patch.object(harness, "write_mla", shifted)]
    if name == "shift-mha-write":  # each loc's tag one row further in the dense draft's replicated pool
        def shifted_mha(pool, locs):
            import torch

            locs = torch.as_tensor(locs)
            pool.set_kv_buffer(LAYER, harness.write_loc(locs + 1),
                               *tag_values("mha", locs, pool.head_num, pool.head_dim))

        return [mock.patch.object(harness, "write_mha", shifted_mha)]
    if name == "no-translate":
        try:
            from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        except ImportError:  # no translator in this release: nothing to remove
            KVIndexTranslator = None
        if KVIndexTranslator is not None and hasattr(KVIndexTranslator, "translate_dcp_read_ids"):  # 0.5.20 on
            return [mock.patch.object(KVIndexTranslator, "translate_dcp_read_ids", lambda self, ids: ids)]
        # 0.5.18/0.5.19: the decode's DCP read translation is plan_dcp_decode_metadata (share + loc // N)
        return [mock.patch.object(importlib.import_module(FMB), "plan_dcp_decode_metadata",
                                  lambda *args, **kwargs: None)]
    if name == "no-lse":  # the flashinfer MLA decode kernel answers without the LSE the backend asked for
        return [mock.patch.object(plain.LseWrapper, "run",
                                  lambda self, q_nope, *args, out=None, **kwargs: (q_nope if out is None else out))]
    raise ValueError(name)


@contextlib.contextmanager
def control(name: str) -> Iterator[None]:
    """Negative controls: a one-row shift in the MLA write door (or the dense draft's MHA door), no DCP read
    translation in the eager decode (``KVIndexTranslator.translate_dcp_read_ids`` an identity from 0.5.20 on; before
    that, where the decode's only DCP read step is ``planner.plan_dcp_decode_metadata``, that step a no-op), or a
    decode kernel that returns no LSE. Each is undone on leaving, by the patchers themselves."""
    with contextlib.ExitStack() as stack:
        for patcher in patches(name):
            stack.enter_context(patcher)
        yield
