"""Hook on ``sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla``: a NextN draft's extend
under DCP merged as a decode is (0.5.22, 0.5.23).

Under DCP the DeepSeek MLA layer treats a decode and a target verify as a DCP
decode phase (``DeepseekMLAForwardMixin.is_dcp_mla_decode_phase``): q is
all-gathered (heads x dcp), the backend returns ``(out, lse)`` over the keys
this rank holds, and the ranks' partials are merged by LSE
(``cp_lse_ag_out_rs_mla``). A draft extend (``DRAFT_EXTEND_V2``) is neither:
its q stays this rank's heads, its KV is not gathered as a prefill's is, and
no merge runs, so each rank attends over its own stripe alone.

Where the flashinfer MLA backend planned the draft extend split
(:mod:`.flashinfer_mla_backend`: the prefix once per request, the window per
token, this rank's keys), the phase is a DCP decode phase: the hook answers yes
for that batch, and only for it, so the model gathers q, asks the backend for
``(out, lse)`` and merges, as for the verify. The answer is read off the
backend's own plan (its draft extend wrapper pair is the forward metadata), so
no other backend's draft extend changes. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0``
turns it off with the rest of the plugin.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from .common import Finding, Verdict, first_call, unhooked
from .entry import FORWARD_STAGE, Hook

MODULE = "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla"
PHASE = f"{MODULE}.DeepseekMLAForwardMixin.is_dcp_mla_decode_phase"


def phase_verdict(original: Callable | None = None) -> Finding:
    """Is a draft extend outside this release's DCP decode phase, where the flashinfer MLA hooks plan it split?"""
    from .flashinfer_mla_backend import draft_decode_verdict

    backend = draft_decode_verdict()
    if backend.verdict is Verdict.FIXED:
        return Finding(PHASE, Verdict.FIXED, "the release merges a draft extend it planned split (upstream-next 0017)")
    if backend.verdict is not Verdict.NEEDS_FIX:
        return Finding(PHASE, Verdict.OUT_OF_SCOPE, f"the flashinfer MLA draft hooks do not apply: {backend.detail}")
    mixin = getattr(importlib.import_module(MODULE), "DeepseekMLAForwardMixin", None)
    if mixin is None or not hasattr(mixin, "is_dcp_mla_decode_phase"):
        return Finding(PHASE, Verdict.OUT_OF_SCOPE, "this release has no DeepseekMLAForwardMixin.is_dcp_mla_decode_phase")
    try:
        source = inspect.getsource(unhooked(mixin.is_dcp_mla_decode_phase))
    except (OSError, TypeError):
        source = ""
    if "is_draft_extend" in source:
        return Finding(PHASE, Verdict.FIXED, "the release counts a draft extend in its DCP decode phase")
    if "is_target_verify" not in source:
        return Finding(PHASE, Verdict.UNRECOGNISED, "the DCP decode phase does not name the verify: not the code "
                                                    "the hook was written for")
    return Finding(PHASE, Verdict.NEEDS_FIX, "under DCP a draft extend is no DCP decode phase: its q is not "
                                             "gathered and its ranks' partials are not merged")


def planned_split(forward_batch) -> bool:
    """Did the flashinfer MLA backend plan this draft extend split (its forward metadata is the split's pair)?"""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    try:
        backend = get_attn_backend()
    except Exception:  # no forward context: not a batch the backend planned
        return False
    backend = getattr(backend, "primary", backend)  # two-batch overlap wraps the backend
    wrapper = getattr(getattr(backend, "forward_metadata", None), "prefill_wrapper", None)
    split = getattr(wrapper, "_dcp_split", None)
    return split is not None and split is getattr(backend, "_dcp_draft_extend", None)


def draft_extend_phase(original: Callable, self, forward_batch, *args, **kwargs) -> bool:
    """AROUND hook for ``DeepseekMLAForwardMixin.is_dcp_mla_decode_phase``: sglang's answer, and yes for a draft
    extend under DCP the flashinfer MLA backend planned split."""
    first_call()
    if original(self, forward_batch, *args, **kwargs):
        return True
    return (getattr(self, "dcp_size", 1) > 1 and forward_batch.forward_mode.is_draft_extend_v2()
            and planned_split(forward_batch))


# The table's entry (plugin/hooks/__init__.py collects it; docs/patches.md is generated from it).
HOOKS = (
    Hook(
        module=MODULE, target=PHASE, judge=phase_verdict, hook=draft_extend_phase,
        stage=FORWARD_STAGE,
        does="counts a NextN draft extend the flashinfer MLA backend planned split as a DCP decode phase: q "
             "gathered, (out, lse) over this rank's keys, the ranks' partials merged",
        why="under DCP a draft extend gathers neither q nor KV and merges nothing, so each rank attends over its "
            "own stripe alone",
        upstream="not yet sent (patches/upstream-next 0017; docs/upstreaming.md)",
        drop_when="upstream counts the draft extend in its DCP decode phase",
        series_patch="upstream-next/0017",
    ),
)
