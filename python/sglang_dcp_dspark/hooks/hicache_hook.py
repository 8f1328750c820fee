"""Hooks for the NextN (MTP) draft under DCP + HiCache on sglang 0.5.23 (patches/upstream-next 0008-0009).

Every release refuses ``--speculative-algorithm NEXTN`` under DCP + HiCache:
``arg_groups/hicache_hook.py::resolve_hicache_dcp_compatibility`` admits only
DSPARK, because draft host pools had no DCP index translation. Measured on
0.5.23 (docs/draft-layouts.md), the NextN draft does not need one of its own:
its MLA KV is written with the target's DCP owner rule (striped), and its
PACKED plan makes its layers tail layers of the target's host pool, whose
transfers translate both sides with the target's DCP indices.

- On the gate (this module): NEXTN, and EAGLE with the target's own NextN
  layer, are admitted; every other gate (L3 storage, LMCache, HiSparse,
  non-MLA) still judges the launch, on a view of it without the draft. An
  external EAGLE draft or EAGLE3 is refused in 0008's words.
- On ``kv_cache_builder.build_kv_cache`` (in :mod:`.kv_cache_builder`): the
  plan sglang built is checked against the draft's layout before any pool
  is: a packed draft must be striped like the target, and an EAGLE draft
  must not land in a sidecar (0009's check, in the plugin's words).

The hooks go in together: admitting NEXTN is safe only with the plan check
behind it. They are written against 0.5.23's plumbing (``CacheInitParams``
carries the draft pools of either plan; MLA pools say how many locs one row
spans); a release without it is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from ._common import Finding, Overlay, Verdict, first_call, probing, unhooked

MODULE = "sglang.srt.arg_groups.hicache_hook"
GATE = f"{MODULE}.resolve_hicache_dcp_compatibility"
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")

# 0008's words, so that a user reads the same refusal whichever carrier fixed the tree.
EXTERNAL_EAGLE = (
    "HiCache with --dcp-size > 1 supports an EAGLE draft only as the target's own NextN (MTP) layer, packed into "
    "the target's host pool: an external EAGLE or EAGLE3 draft gets a host pool of its own with no DCP index "
    "translation, while its device KV is striped over the DCP ranks (an MLA draft) or laid out by its attention "
    "backend (an MHA draft). Use --speculative-algorithm NEXTN with the target's MTP layer, or DSPARK."
)


def is_packed_mtp_draft(server_args) -> bool:
    """NEXTN, or EAGLE without a draft path of its own: the target's NextN layer, which sglang packs."""
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm not in ("NEXTN", "EAGLE"):
        return False
    return getattr(server_args, "speculative_draft_model_path", None) in (None, getattr(server_args, "model_path", None))


def proven_plumbing() -> str | None:
    """Why this release lacks what the NextN admission was proven on (0.5.23's plumbing); None when it has it."""
    import dataclasses

    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    fields = {f.name for f in dataclasses.fields(CacheInitParams)}
    if not {"mtp_draft_device_pools", "sidecar_draft_device_pools"} <= fields:
        return "CacheInitParams carries no sidecar_draft_device_pools (0.5.23 adds it), which the plan check reads"
    if not hasattr(MLATokenToKVPool, "_write_loc_dcp_span"):
        return "MLATokenToKVPool does not say how many locs one row spans, which the plan check reads"
    return None


def _gate_probe(algorithm: str, draft_path: str | None = None) -> SimpleNamespace:
    """The fields the 0.5.23 gate reads, for a DCP8 HiCache launch of an MLA target."""
    return SimpleNamespace(
        dcp_size=8, enable_hierarchical_cache=True, hicache_storage_backend=None, hicache_host_memory_mode="cache",
        speculative_algorithm=algorithm, speculative_draft_model_path=draft_path, model_path="target",
        enable_lmcache=False, enable_hisparse=False,
    )


def _outcome(gate: Callable, probe) -> str:
    import sglang.srt.arg_groups.hicache_hook as module

    from .. import swap

    try:
        # The probe is no model: its MLA check is answered "MLA", as the launches it stands for are.
        with swap.attribute(module, "use_mla_backend", lambda server_args: True):
            gate(probe)
    except NotImplementedError:
        return "refused"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return "admitted"


def nextn_gate_verdict(gate: Callable | None = None) -> Finding:
    """Does the gate refuse the NextN draft under DCP + HiCache, and is it the 0.5.23 gate?"""
    try:
        import sglang.srt.arg_groups.hicache_hook as module
    except ModuleNotFoundError:  # before 0.5.23 the gate is a ServerArgs method (hooks.server_args judges it)
        return Finding(GATE, Verdict.OUT_OF_SCOPE, "this release has no sglang.srt.arg_groups.hicache_hook")
    if gate is None:
        gate = unhooked(getattr(module, "resolve_hicache_dcp_compatibility", None))
    if gate is None:
        return Finding(GATE, Verdict.OUT_OF_SCOPE, "hicache_hook has no resolve_hicache_dcp_compatibility")
    with probing():
        plain, dspark, nextn = (_outcome(gate, _gate_probe(a)) for a in (None, "DSPARK", "NEXTN"))
    if plain != "admitted" or dspark != "admitted" or nextn.startswith("error"):
        return Finding(GATE, Verdict.UNRECOGNISED, f"gate probe: no draft {plain}, DSPARK {dspark}, NEXTN {nextn}")
    if nextn == "admitted":
        return Finding(GATE, Verdict.FIXED, "the gate already admits the NextN draft under DCP + HiCache")
    missing = proven_plumbing()
    if missing is not None:
        return Finding(GATE, Verdict.OUT_OF_SCOPE, f"the NextN admission is proven on 0.5.23's plumbing: {missing}")
    return Finding(GATE, Verdict.NEEDS_FIX, "the gate refuses the NextN (MTP) draft under DCP + HiCache")


def admit_nextn(original: Callable, server_args, *args, **kwargs):
    """AROUND hook for the gate: NextN admitted, other gates judged without the draft, external EAGLE refused."""
    first_call()
    algorithm = getattr(server_args, "speculative_algorithm", None)
    under_gate = getattr(server_args, "dcp_size", 1) > 1 and getattr(server_args, "enable_hierarchical_cache", False)
    if not under_gate or algorithm not in EAGLE_FAMILY:
        return original(server_args, *args, **kwargs)
    if not is_packed_mtp_draft(server_args):
        # The L3, LMCache, HiSparse and MLA gates come first when they refuse the launch anyway.
        original(Overlay(server_args, speculative_algorithm=None), *args, **kwargs)
        raise NotImplementedError(EXTERNAL_EAGLE)
    return original(Overlay(server_args, speculative_algorithm=None), *args, **kwargs)


# ------------------------------------------------------------------ the plan check


def check_draft_plan(plan, algorithm: str | None, dcp_size: int) -> None:
    """Stop a draft plan whose host pool would restore other rows than the draft's forward reads (0009's rule).

    0009's refusals of the sharded backup (with a packed draft, and with the
    FUSED plan of --enable-unified-memory) have no counterpart here: stock
    0.5.23 has no sharded backup. Otherwise the FUSED plan is left to sglang,
    as 0009 leaves it: nothing measured here says it is wrong.
    """
    if dcp_size <= 1 or plan is None:
        return
    mode = str(getattr(getattr(plan, "mode", None), "name", getattr(plan, "mode", ""))).upper()
    pools = tuple(getattr(plan, "device_pools", ()) or ())
    if mode == "PACKED":
        for pool in pools:
            span = getattr(pool, "_write_loc_dcp_span", 1)
            if span != dcp_size:
                raise NotImplementedError(
                    f"HiCache with --dcp-size {dcp_size} cannot pack this draft ({type(pool).__name__}, one row per "
                    f"{span} locs) into the target's host pool: packed layers move with the target's DCP indices, "
                    "which fit only a draft striped like the target."
                )
    elif mode == "SIDECAR" and algorithm in EAGLE_FAMILY:
        raise NotImplementedError(
            f"HiCache with --dcp-size {dcp_size} cannot back this EAGLE draft up in a host pool of its own (the "
            "SIDECAR plan): the sidecar has no DCP index translation, while the draft's device KV is striped over "
            "the DCP ranks (an MLA draft) or laid out by its attention backend (an MHA draft). Only the target's "
            "NextN layer (PACKED) is supported."
        )
