"""Hook on ``sglang.srt.arg_groups.hicache_hook``: the HiCache + DCP gate admits the EAGLE-family drafts whose host
pool restores the rows their forward reads (patches/upstream-next 0020).

Every release refuses every draft but DSPARK under DCP + HiCache ("other
draft-model host pools have no DCP index translation"). Measured on 0.5.23's
own data path (docs/draft-layouts.md), two layouts need none of their own:

- the target's own NextN layer (NEXTN, or EAGLE with no draft path) is
  PACKED into the target's host pool, whose transfers translate both sides
  with the target's DCP indices, which fit its striped KV;
- a dense draft on flashinfer or fa3 (EAGLE3, an external EAGLE draft) is
  replicated on every rank, and its own host pool (SIDECAR) spans the
  target's logical slots untranslated, which fits it.

A striped draft in a sidecar (an MLA checkpoint, a dense draft on triton)
stays refused, in one line naming its layout and the change that fits it
(:func:`passes.hicache_draft_refusal_of`). The other gates (L3 storage,
LMCache, HiSparse, a dense target) judge the launch first, on a view of it
without the draft. Whether the draft's passes then read the rows they should
is the speculative check's question (:mod:`.speculative_hook`), which judges
every launch under DCP on its reads after a HiCache load-back too.

Admitting is safe only with the plan check behind it
(:mod:`.hybrid_pool_assembler`, at cache build: a packed draft striped like
the target, no striped draft in a sidecar), which needs 0.5.23's
``CacheInitParams``: a release without it keeps sglang's gate.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from .common import Finding, Overlay, Verdict, carrier, first_call, probing, unhooked
from .entry import RESOLUTION_STAGE, Hook

MODULE = "sglang.srt.arg_groups.hicache_hook"
GATE = f"{MODULE}.resolve_hicache_dcp_compatibility"
DRAFT_FIELD = "speculative_algorithm"


def plan_check_plumbing() -> str | None:
    """What this release lacks of the plumbing the cache-build plan check reads (0.5.23's); None when it has it.

    Only ``CacheInitParams`` is read: the judge runs in every process that resolves server args, and the pools'
    module costs seconds to import there. Its pools' write span (``_write_loc_dcp_span``, 0.5.19 on) the check
    reads with a default."""
    import dataclasses

    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    fields = {f.name for f in dataclasses.fields(CacheInitParams)}
    if not {"mtp_draft_device_pools", "sidecar_draft_device_pools"} <= fields:
        return "CacheInitParams carries no sidecar_draft_device_pools (0.5.23 adds it), which the plan check reads"
    return None


def _gate_probe(algorithm: str | None) -> SimpleNamespace:
    """The fields the 0.5.23 gate reads, for a DCP 8 HiCache launch of an MLA target."""
    return SimpleNamespace(
        dcp_size=8, enable_hierarchical_cache=True, hicache_storage_backend=None, hicache_host_memory_mode="cache",
        speculative_algorithm=algorithm, speculative_draft_model_path=None, model_path="target",
        enable_lmcache=False, enable_hisparse=False,
    )


def _outcome(gate: Callable, algorithm: str | None) -> str:
    import sglang.srt.arg_groups.hicache_hook as module

    from ...core import swap

    try:
        # The probe is no model: its MLA question is answered "MLA", as the launches it stands for are.
        with swap.attribute(module, "use_mla_backend", lambda server_args: True):
            gate(_gate_probe(algorithm))
    except NotImplementedError:
        return "refused"
    except Exception as exc:  # reads a field the probe lacks: another gate
        return f"error: {type(exc).__name__}: {exc}"
    return "admitted"


def gate_verdict(gate: Callable | None = None) -> Finding:
    """Does the gate refuse the NextN draft under DCP + HiCache, and is it the gate we know?"""
    try:
        import sglang.srt.arg_groups.hicache_hook as module
    except ModuleNotFoundError:  # before 0.5.19 the gate is a ServerArgs method (hooks.server_args judges it)
        return Finding(GATE, Verdict.OUT_OF_SCOPE, "this release has no sglang.srt.arg_groups.hicache_hook")
    if gate is None:
        gate = unhooked(getattr(module, "resolve_hicache_dcp_compatibility", None))
    if gate is None:
        return Finding(GATE, Verdict.OUT_OF_SCOPE, "hicache_hook has no resolve_hicache_dcp_compatibility")
    with probing():
        plain, dspark, nextn = (_outcome(gate, a) for a in (None, "DSPARK", "NEXTN"))
    if plain != "admitted" or dspark != "admitted" or nextn.startswith("error"):
        return Finding(GATE, Verdict.UNRECOGNISED, f"gate probe: no draft {plain}, DSPARK {dspark}, NEXTN {nextn}")
    if nextn == "admitted":
        return Finding(GATE, Verdict.FIXED, "the gate already admits the NextN draft under DCP + HiCache")
    missing = plan_check_plumbing()
    if missing is not None:
        return Finding(GATE, Verdict.OUT_OF_SCOPE, f"the drafts' HiCache admission needs 0.5.23's plumbing: {missing}")
    return Finding(GATE, Verdict.NEEDS_FIX, "the gate refuses every draft but DSPARK under DCP + HiCache")


def gate_fix_in_effect(plugin_on: bool) -> str | None:
    """Who admits the drafts whose host pool fits them under DCP + HiCache, and refuses the rest in their own line:
    "upstream-next" where the release's gate carries 0020, "plugin" where the plugin is on and this hook applies,
    else None (sglang's gate, which refuses every draft but DSPARK)."""
    return carrier(gate_verdict, plugin_on)


def _without_draft(server_args) -> Overlay:
    """The launch as the gate reads it (``resolving_view``: its declarations over its fields), with no draft."""
    declared = tuple((source, {k: v for k, v in fields.items() if k != DRAFT_FIELD})
                     for source, fields in (getattr(server_args, "_resolved_overrides", None) or ()))
    return Overlay(server_args, speculative_algorithm=None, _resolved_overrides=declared)


def _gate_module():
    import importlib

    return importlib.import_module(MODULE)


# What 0020 imports into sglang's hicache_hook module for its check, and where each is defined.
GATE_HELPERS = {"attention_backends_of": "sglang.srt.arg_groups.overrides",
                "resolved_view": "sglang.srt.arg_groups.overrides"}


def _gate_helper(name: str):
    """One of the resolution helpers the gate's check reads, off sglang's hicache_hook module at call time under
    0020's name (a test that patches it there patches it for this check too), else from its home."""
    import importlib

    found = getattr(_gate_module(), name, None)
    return found if found is not None else getattr(importlib.import_module(GATE_HELPERS[name]), name)


def declare_helpers() -> None:
    """Put the helpers 0020's check reads into sglang's hicache_hook module, where 0020 imports them, so code and
    tests written for the series find them there."""
    import importlib

    module = _gate_module()
    for name, home in GATE_HELPERS.items():
        if getattr(module, name, None) is None:
            setattr(module, name, getattr(importlib.import_module(home), name))


def draft_refusal(server_args, view, algorithm: str) -> str | None:
    """The one line a striped (or unproven) draft is refused with under DCP + HiCache, from the launch's facts as
    sglang resolved them so far (``view``, the target's decode backend included); None where its host pool fits
    it."""
    from ... import passes
    from . import speculative_hook as spec

    draft_path = getattr(view, "speculative_draft_model_path", None)
    own_layer = draft_path in (None, getattr(view, "model_path", None))
    target_backend = _gate_helper("attention_backends_of")(_gate_helper("resolved_view")(server_args))[1]
    # The draft's config is read (sglang's own reader) only where it decides: an external checkpoint of an MLA
    # target (the gate has refused any other target by now).
    draft_mla = (not own_layer and _gate_module().use_mla_backend(server_args)
                 and getattr(spec._module(), spec.DRAFT_USES_MLA, spec.draft_uses_mla)(view))
    found = passes.hicache_draft_refusal_of(
        algorithm, dcp=int(getattr(view, "dcp_size", 1) or 1),
        hicache=bool(getattr(view, "enable_hierarchical_cache", False)), own_layer=own_layer, draft_mla=draft_mla,
        draft_backend=getattr(view, "speculative_draft_attention_backend", None), target_backend=target_backend)
    return found.line if found is not None else None


def admit_proven_drafts(original: Callable, server_args, *args, **kwargs):
    """AROUND hook for the gate: an EAGLE-family draft whose host pool fits its layout is admitted, every other
    gate judged without the draft; a striped one refused in its own line."""
    first_call()
    from ... import passes
    from . import speculative_hook as spec

    view = spec._view(server_args)
    algorithm = str(getattr(view, DRAFT_FIELD, None) or "").upper()
    under_gate = int(getattr(view, "dcp_size", 1) or 1) > 1 and getattr(view, "enable_hierarchical_cache", False)
    if not under_gate or algorithm not in passes.EAGLE_FAMILY:
        return original(server_args, *args, **kwargs)
    # The L3, LMCache, HiSparse and MLA gates come first where they refuse the launch anyway.
    result = original(_without_draft(server_args), *args, **kwargs)
    line = draft_refusal(server_args, view, algorithm)
    if line is not None:
        raise NotImplementedError(line)
    return result


# The table's entry (plugin/hooks/__init__.py collects it; docs/patches.md is generated from it).
HOOKS = (
    Hook(
        module=MODULE, target=GATE, judge=gate_verdict, hook=admit_proven_drafts,
        stage=RESOLUTION_STAGE,
        does="admits under DCP + HiCache the target's own NextN layer (packed) and a dense draft on flashinfer or fa3 "
             "(replicated); a striped draft in a host pool of its own is refused in one line",
        why="sglang refuses every draft but DSPARK under --dcp-size > 1 with --enable-hierarchical-cache, though "
            "these drafts' host pools restore the rows their forward reads (docs/draft-layouts.md)",
        upstream="not yet sent (patches/upstream-next 0020; docs/upstreaming.md); upstream keeps HiCache + DCP + "
                 "EAGLE/MTP guarded (sgl-project/sglang#40434)",
        drop_when="upstream admits these drafts under DCP + HiCache, or gives draft host pools DCP index translation",
        series_patch="upstream-next/0020",
        on_install=declare_helpers,
    ),
)
