"""Hook on ``sglang.srt.arg_groups.speculative_hook``: refuse, at argument time, the passes the map shows broken under DCP.

patches/upstream-next 0008 adds the same refusal to 0.5.23's
``handle_speculative_decoding``. Stock sglang admits speculative decoding
under ``--dcp-size > 1`` without HiCache, NEXTN included, though on the
releases the pass map covers (:mod:`..passes`, docs/spec-under-dcp.md) the
EAGLE family's verify and draft passes on an MLA model crash or read other
tokens' KV, and a DSPARK draft on the Triton backend reads other rows. The
AROUND hook runs sglang's own resolution first, then asks the map about the
launch as resolved, and raises one ValueError line, as sglang's own
argument checks do. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0`` turns it off with the rest of
the plugin.

The judge reads the map, not the version: a release the map does not cover
is left alone, and so is one whose mapped passes are all consistent.
"""

from __future__ import annotations

from collections.abc import Callable

from ._common import Finding, Verdict, first_call

MODULE = "sglang.srt.arg_groups.speculative_hook"
SPECULATIVE = f"{MODULE}.handle_speculative_decoding"


def _installed_version() -> str | None:
    from ..compat import installed_sglang_version

    return installed_sglang_version()


def passes_verdict(original: Callable | None = None) -> Finding:
    """Does the map show a launch kind this release admits under DCP whose passes crash or read other rows?"""
    import importlib

    from .. import passes

    module = importlib.import_module(MODULE)
    if hasattr(module, "_check_speculative_passes_under_dcp"):
        return Finding(SPECULATIVE, Verdict.FIXED, "the release refuses the broken passes under DCP itself (upstream-next 0008)")
    version = _installed_version() or "unknown"
    release = passes.release_key(version)
    if release not in passes.releases():
        return Finding(SPECULATIVE, Verdict.OUT_OF_SCOPE, f"the pass map does not cover sglang {version}")
    if not passes.measured(release):
        return Finding(SPECULATIVE, Verdict.OUT_OF_SCOPE, f"the pass map ran no pass on sglang {release} yet")
    broken = passes.broken_kinds(release)
    if not broken:
        return Finding(SPECULATIVE, Verdict.FIXED, f"every pass the map ran on sglang {release} reads the rows it wrote")
    return Finding(SPECULATIVE, Verdict.NEEDS_FIX,
                   f"under DCP the pass map shows {', '.join(broken)} crashing or reading other rows on sglang {release}")


def _view(server_args):
    """The launch as sglang resolved it so far: 0.5.19's resolving view where the release has one."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view
    except ImportError:
        return server_args
    return resolving_view(server_args)


def _uses_mla(server_args) -> bool:
    try:
        from sglang.srt.arg_groups.model_override_base import use_mla_backend
    except ImportError:
        return bool(server_args.use_mla_backend())
    return bool(use_mla_backend(server_args))


def _decode_backend(server_args) -> str | None:
    """The target's decode attention backend as resolved so far (0.5.19's resolved view where the release has one)."""
    try:
        from sglang.srt.arg_groups.overrides import attention_backends_of, resolved_view
    except ImportError:
        return getattr(server_args, "decode_attention_backend", None) or getattr(server_args, "attention_backend", None)
    return attention_backends_of(resolved_view(server_args))[1]


def refuse_broken_passes(original: Callable, server_args, *args, **kwargs):
    """AROUND hook for ``handle_speculative_decoding(server_args)``: sglang's resolution, then the map's refusal."""
    from .. import passes

    first_call()
    result = original(server_args, *args, **kwargs)
    view = _view(server_args)
    dcp = int(getattr(view, "dcp_size", 1) or 1)
    algorithm = getattr(view, "speculative_algorithm", None)
    if dcp <= 1 or algorithm is None:
        return result
    draft_path = getattr(view, "speculative_draft_model_path", None)
    line = passes.refusal(
        _installed_version() or "", str(algorithm), dcp=dcp,
        own_layer=draft_path in (None, getattr(view, "model_path", None)), mla=_uses_mla(server_args),
        target_backend=_decode_backend(server_args),
        draft_backend=getattr(view, "speculative_draft_attention_backend", None),
    )
    if line is not None:
        raise ValueError(line)
    return result
