"""Hooks on ``sglang.srt.server_args``: the HiCache + DCP gate admits DSPARK (series patch 0001); under DCP on
Hopper an MLA model's default backend is flashinfer (0.5.17 and 0.5.18, whose picker is a ServerArgs method; from
0.5.19 the picker is :mod:`.overrides`')."""

from __future__ import annotations

from collections.abc import Callable

from .common import Finding, Overlay, Verdict, first_call, probing
from .entry import RESOLUTION_STAGE, Hook, by_version

MODULE = "sglang.srt.server_args"
RESOLVER = f"{MODULE}.ServerArgs._resolve_hicache_dcp_compatibility"
DEFAULT_BACKEND = f"{MODULE}.ServerArgs._get_default_attn_backend"
# Series patch 0001's wording (and upstream 0.5.18's), so that a user reads the
# same refusal whichever carrier fixed the tree.
DSPARK_ONLY = (
    "HiCache with --dcp-size > 1 only supports DSPARK speculative decoding; "
    "other draft-model host pools have no DCP index translation."
)


class _ResolverProbe:
    """The fields the 0.5.17 HiCache+DCP gate reads, for one launch it should judge."""

    def __init__(self, speculative_algorithm: str | None) -> None:
        self.dcp_size = 2
        self.enable_hierarchical_cache = True
        self.hicache_storage_backend = None
        self.speculative_algorithm = speculative_algorithm
        self.enable_lmcache = False
        self.enable_hisparse = False

    def use_mla_backend(self) -> bool:
        return True


def _gate_outcome(resolve: Callable, algorithm: str | None) -> str:
    try:
        resolve(_ResolverProbe(algorithm))
    except NotImplementedError:
        return "rejected"
    except Exception as exc:  # reads a field 0.5.17 does not have: another resolver
        return f"error: {type(exc).__name__}: {exc}"
    return "admitted"


def resolver_verdict(resolve: Callable | None = None) -> Finding:
    """Does this resolver reject DSPARK under DCP + HiCache, and is it the gate we know?"""
    if resolve is None:
        from sglang.srt.server_args import ServerArgs

        resolve = getattr(ServerArgs, "_resolve_hicache_dcp_compatibility", None)
    if resolve is None:
        return by_version(RESOLVER, "ServerArgs has no _resolve_hicache_dcp_compatibility")
    with probing():
        plain, dspark, eagle = (_gate_outcome(resolve, a) for a in (None, "DSPARK", "EAGLE"))
    if plain != "admitted" or eagle != "rejected" or dspark.startswith("error"):
        return by_version(RESOLVER, f"gate probe: no draft {plain}, EAGLE {eagle}, DSPARK {dspark}")
    if dspark == "admitted":
        return Finding(RESOLVER, Verdict.FIXED, "the resolver already admits DSPARK under DCP + HiCache")
    return Finding(RESOLVER, Verdict.NEEDS_FIX, "the resolver rejects DSPARK under DCP + HiCache")


def _under_the_gate(server_args) -> bool:
    return bool(server_args.speculative_algorithm) and server_args.dcp_size > 1 and server_args.enable_hierarchical_cache


def admit_dspark(original: Callable, server_args, *args, **kwargs):
    """AROUND hook for the resolver.

    0.5.17 refuses every draft algorithm because draft host pools had no DCP
    index translation. DSPARK's draft KV is replicated and indexed by logical
    slots, so once its host pool spans ``logical_size`` (the registration
    hook) it needs none. The remaining gates (L3 storage, LMCache, HiSparse,
    non-MLA) still judge the launch: sglang's own gate runs on a view without
    the draft. Other algorithms are refused in the series' words, at the
    place in the gate order where sglang refuses them.
    """
    first_call()
    if not _under_the_gate(server_args):
        return original(server_args, *args, **kwargs)
    without_draft = Overlay(server_args, speculative_algorithm=None)
    if server_args.speculative_algorithm == "DSPARK":
        return original(without_draft, *args, **kwargs)
    try:
        return original(server_args, *args, **kwargs)
    except NotImplementedError as refused:
        # Which gate refused? One that still refuses without the draft, with
        # the same words, is another gate (L3 comes before the draft gate):
        # its message stands. Otherwise the draft gate did, in 0.5.17's words.
        try:
            original(without_draft, *args, **kwargs)
        except NotImplementedError as other:
            if str(other) == str(refused):
                raise
        raise NotImplementedError(DSPARK_ONLY) from None


def default_verdict(original: Callable | None = None) -> Finding:
    from . import overrides

    if original is None:
        from sglang.srt.server_args import ServerArgs

        original = getattr(ServerArgs, "_get_default_attn_backend", None)
    if original is None:
        return Finding(DEFAULT_BACKEND, Verdict.OUT_OF_SCOPE, "ServerArgs has no _get_default_attn_backend")
    found = overrides.picks_fa3_for_mla_on_hopper(original)
    if found is not None:
        return Finding(DEFAULT_BACKEND, found.verdict, found.detail)
    return Finding(DEFAULT_BACKEND, Verdict.NEEDS_FIX, "under DCP sglang picks fa3 for an MLA model on Hopper, which has "
                                                       "no DCP code")


def pick_flashinfer_under_dcp(original: Callable, server_args, use_mla_backend, model_config, *args, **kwargs):
    """AROUND hook for ``ServerArgs._get_default_attn_backend(self, use_mla_backend, model_config)``."""
    from . import overrides

    first_call()
    return overrides.pick(original(server_args, use_mla_backend, model_config, *args, **kwargs), server_args,
                          use_mla_backend)


# The table's entries (plugin/hooks/__init__.py collects them; docs/patches.md is generated from them).
HOOKS = (
    Hook(
        module=MODULE, target=RESOLVER, judge=resolver_verdict, hook=admit_dspark,
        stage=RESOLUTION_STAGE,
        does="admits DSPARK through the HiCache + DCP gate; other algorithms are refused in the series' words",
        why="0.5.17 raises NotImplementedError for any --speculative-algorithm once --dcp-size > 1 and "
            "--enable-hierarchical-cache are both set, so a DCP + HiCache + DSPARK launch cannot start",
        upstream="PR #35221, released in 0.5.18 (the same condition and message)",
        drop_when="on sglang 0.5.18 and later, where the judge finds the gate admits DSPARK and the hook stays out",
        series_patch="sglang-0.5.17/0001",
    ),
    Hook(
        module=MODULE, target=DEFAULT_BACKEND, judge=default_verdict, hook=pick_flashinfer_under_dcp,
        stage=RESOLUTION_STAGE,
        does="picks flashinfer, not fa3, for an MLA model under DCP on Hopper that names no --attention-backend",
        why="sglang picks fa3 for an MLA model on Hopper when no --attention-backend is named, and fa3 has no DCP code, "
            "so a DCP launch that names none is refused (or crashes at its first decode) though flashinfer runs it",
        upstream="open: sgl-project/sglang#35384 (the same default); not yet sent (patches/upstream-next 0015)",
        drop_when="upstream defaults Hopper's MLA backend to flashinfer under DCP, or fa3 gains DCP code",
        series_patch="upstream-next/0015",
    ),
)
