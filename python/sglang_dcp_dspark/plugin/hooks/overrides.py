"""Hook on ``sglang.srt.arg_groups.overrides``: under DCP on Hopper, an MLA model's default backend is flashinfer.

sglang picks fa3 for an MLA model on Hopper when the launch names no
``--attention-backend`` (``get_default_attn_backend``, 0.5.19 on; the
``ServerArgs._get_default_attn_backend`` method before, hooked from
:mod:`.server_args`). fa3 has no DCP code: its MLA decode returns no LSE for the
DCP merge and its extend reads untranslated rows, so a DCP launch that names no
backend is refused by the plugin's argument check (patches/upstream-next 0011)
though flashinfer, which sglang also ships for Hopper, runs it. Upstream's open
#35384 proposes this same default. The hook leaves every other pick alone: a
named backend (fa3 included, which the check then refuses in one line naming
flashinfer), a dense model, Blackwell, and DCP off. It logs the pick once per
process, in sglang's log. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0`` turns it off
with the rest of the plugin. patches/upstream-next 0015 makes the same change in
sglang's own ``get_default_attn_backend``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

from .common import Finding, Verdict, first_call, unhooked
from .entry import RESOLUTION_STAGE, Hook

MODULE = "sglang.srt.arg_groups.overrides"
DEFAULT_BACKEND = f"{MODULE}.get_default_attn_backend"
# The words upstream-next 0015 adds to sglang's picker: code that has them picks flashinfer under DCP itself.
SERIES_MARK = "no DCP code"

logger = logging.getLogger("sglang_dcp_dspark.plugin")
_logged: set[str] = set()


def picks_fa3_for_mla_on_hopper(fn: Callable | None) -> Finding | None:
    """The verdict on a default-backend picker from its code: None where it is the one the hook is written for and
    needs it (an MLA branch that returns fa3 on Hopper, and no DCP condition)."""
    try:
        source = inspect.getsource(unhooked(fn))
    except (OSError, TypeError):
        return Finding(DEFAULT_BACKEND, Verdict.UNRECOGNISED, "the default-backend picker's source cannot be read")
    if SERIES_MARK in source:
        return Finding(DEFAULT_BACKEND, Verdict.FIXED, "the release picks flashinfer for MLA under DCP on Hopper itself "
                                                       "(upstream-next 0015)")
    mla_branch = source.split("MLA architecture", 1)[-1] if "MLA architecture" in source else ""
    if "hopper" not in mla_branch.lower() or 'return "fa3"' not in mla_branch:
        return Finding(DEFAULT_BACKEND, Verdict.OUT_OF_SCOPE, "this release does not pick fa3 for MLA on Hopper")
    return None


def pick(backend: str, server_args, use_mla: bool) -> str:
    """flashinfer in place of fa3 for an MLA model under DCP; ``backend`` otherwise. Logs the pick once."""
    dcp = int(getattr(server_args, "dcp_size", 1) or 1)
    if backend != "fa3" or not use_mla or dcp <= 1:
        return backend
    if "picked" not in _logged:
        _logged.add("picked")
        logger.info("dcp_dspark: --dcp-size %d and no --attention-backend: picked flashinfer for this MLA model on "
                    "Hopper, not fa3, which has no DCP code (its decode returns no LSE for the DCP merge)", dcp)
    return "flashinfer"


def default_verdict(original: Callable | None = None) -> Finding:
    if original is None:
        import importlib

        original = getattr(importlib.import_module(MODULE), "get_default_attn_backend", None)
    if original is None:
        return Finding(DEFAULT_BACKEND, Verdict.OUT_OF_SCOPE, "this release has no get_default_attn_backend")
    return picks_fa3_for_mla_on_hopper(original) or Finding(
        DEFAULT_BACKEND, Verdict.NEEDS_FIX, "under DCP sglang picks fa3 for an MLA model on Hopper, which has no DCP code")


def pick_flashinfer_under_dcp(original: Callable, server_args, use_mla_backend, model_config, *args, **kwargs):
    """AROUND hook for ``get_default_attn_backend(server_args, use_mla_backend, model_config)``."""
    first_call()
    return pick(original(server_args, use_mla_backend, model_config, *args, **kwargs), server_args, use_mla_backend)


_WHY = ("sglang picks fa3 for an MLA model on Hopper when no --attention-backend is named, and fa3 has no DCP code, so a "
        "DCP launch that names none is refused (or crashes at its first decode) though flashinfer runs it")
_UPSTREAM = "open: sgl-project/sglang#35384 (the same default); not yet sent (patches/upstream-next 0015)"
_DROP = "upstream defaults Hopper's MLA backend to flashinfer under DCP, or fa3 gains DCP code"
HOOKS = (
    Hook(
        module=MODULE, target=DEFAULT_BACKEND, judge=default_verdict, hook=pick_flashinfer_under_dcp,
        stage=RESOLUTION_STAGE,
        does="picks flashinfer, not fa3, for an MLA model under DCP on Hopper that names no --attention-backend",
        why=_WHY, upstream=_UPSTREAM, drop_when=_DROP, series_patch="upstream-next/0015",
    ),
)
