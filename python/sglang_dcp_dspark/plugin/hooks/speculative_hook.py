"""Hook on ``sglang.srt.arg_groups.speculative_hook``: refuse, at argument time, the passes the map shows broken under DCP.

patches/upstream-next 0008 adds the same refusal to 0.5.23's
``handle_speculative_decoding``, and 0011 the refusal of a plain launch
(no speculative decoding) whose target passes the map shows broken: fa3 MLA,
whose decode returns no LSE for the DCP merge. sglang calls
``handle_speculative_decoding`` for every launch, after the attention
backends are resolved, so one hook serves both. Stock sglang admits speculative decoding
under ``--dcp-size > 1`` without HiCache, NEXTN included, though on the
releases the pass map covers (:mod:`..passes`, docs/spec-under-dcp.md) the
verify on an MLA model served by flashinfer or fa3 plans ids past the rank's
pool (every algorithm), a NextN draft's own passes read untranslated rows, and
a DSPARK draft on the Triton backend reads other rows. The AROUND hook runs
sglang's own resolution first, then asks the map about the launch as
resolved, and raises one ValueError line, as sglang's own argument checks do.
The check also goes into sglang's module under 0008's name (and the fa3 check
under 0011's), so code and tests written for the series call them there. DCP
on fa3 MLA is refused whatever the speculative algorithm: one the map has no
case of (NGRAM, STANDALONE, DFLASH) runs the target's plain extend and decode,
and is judged by them. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0``
turns it off with the rest of the plugin.

The judge reads the map, not the version: a release the map does not cover
is left alone, and so is one whose mapped passes are all consistent.

Where the target verify on flashinfer MLA is planned split under DCP (the
plugin's :mod:`.flashinfer_mla_backend` hooks apply to the release, or its
code carries upstream-next 0012), the verify is judged on the map's readings
with that fix (``passes.verify_evidence``): DSpark and external EAGLE/EAGLE3
drafts are admitted there, as 0013 admits them. The target's own NextN layer
as draft is admitted where the map's readings with that fix show its own
passes consistent too (the plugin's hooks plan them; the series' 0013 does
not, and refuses it). An external MLA draft checkpoint (which sglang runs as
it runs that layer: :func:`draft_uses_mla`) and a draft tree (topk > 1) are
refused in 0013's words. So is any speculative launch whose split verify would run on a
quantized KV pool (``--kv-cache-dtype`` fp8_e4m3, fp8_e5m2, ... as resolved:
``passes.kv_cache_refusal``), which the split verify is not proven on.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import Finding, Verdict, first_call
from .entry import RESOLUTION_STAGE, Hook

MODULE = "sglang.srt.arg_groups.speculative_hook"
SPECULATIVE = f"{MODULE}.handle_speculative_decoding"
# The name 0008 gives the check in sglang's module; the plugin puts its own there under it (``declare_check``).
CHECK = "_check_speculative_passes_under_dcp"
# And 0013's name for the question whether an external draft checkpoint has MLA attention.
DRAFT_USES_MLA = "_draft_uses_mla"
# And 0011's name for the refusal of DCP on fa3 MLA, whatever the speculative algorithm.
DECODE_BACKEND_CHECK = "_check_dcp_decode_backend"


def _installed_version() -> str | None:
    from ...core.compat import installed_sglang_version

    return installed_sglang_version()


def passes_verdict(original: Callable | None = None) -> Finding:
    """Does the map show a launch kind this release admits under DCP whose passes crash or read other rows?"""
    from ... import passes

    module = _module()
    if getattr(getattr(module, CHECK, None), "__module__", None) == MODULE:  # the series' own, not ours
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


def _module():
    import importlib

    return importlib.import_module(MODULE)


HELPER_HOMES = {"resolving_view": "sglang.srt.arg_groups.overrides", "resolved_view": "sglang.srt.arg_groups.overrides",
                "attention_backends_of": "sglang.srt.arg_groups.overrides",
                "use_mla_backend": "sglang.srt.arg_groups.model_override_base"}


def _helper(name: str):
    """One of sglang's resolution helpers, read off sglang's speculative_hook module at call time under the name
    0008's check uses there (a test that patches it in that module patches it for this check too), else from
    the module that defines it (0.5.18 imports them inside functions), else None (the release has none)."""
    import importlib

    found = getattr(_module(), name, None)
    if found is not None:
        return found
    try:
        return getattr(importlib.import_module(HELPER_HOMES[name]), name, None)
    except ImportError:
        return None


def _view(server_args):
    """The launch as sglang resolved it so far: 0.5.19's resolving view where the release has one."""
    resolving_view = _helper("resolving_view")
    return server_args if resolving_view is None else resolving_view(server_args)


def _uses_mla(server_args) -> bool:
    use_mla_backend = _helper("use_mla_backend")
    return bool(server_args.use_mla_backend() if use_mla_backend is None else use_mla_backend(server_args))


def _decode_backend(server_args) -> str | None:
    """The target's decode attention backend as resolved so far (0.5.19's resolved view where the release has one)."""
    backends_of, resolved_view = _helper("attention_backends_of"), _helper("resolved_view")
    if backends_of is None or resolved_view is None:
        return getattr(server_args, "decode_attention_backend", None) or getattr(server_args, "attention_backend", None)
    return backends_of(resolved_view(server_args))[1]


def draft_uses_mla(cfg) -> bool:
    """Has the external draft checkpoint MLA attention (a ``kv_lora_rank``)? sglang builds the draft's attention
    from the draft's own config, so such a draft runs on the MLA draft backends, as the target's NextN layer does.
    Read through sglang's own ``get_config``, the reader its speculative alias resolution calls on the same path."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    draft = get_config(cfg.speculative_draft_model_path, trust_remote_code=getattr(cfg, "trust_remote_code", False),
                       revision=getattr(cfg, "speculative_draft_model_revision", None))
    text = getattr(draft, "text_config", None) or draft
    return bool(getattr(text, "kv_lora_rank", None))


def check_passes_under_dcp(server_args) -> None:
    """The argument check: one ValueError line for a launch under DCP the map shows broken (0008's check)."""
    from ... import passes

    view = _view(server_args)
    dcp = int(getattr(view, "dcp_size", 1) or 1)
    algorithm = getattr(view, "speculative_algorithm", None)
    if dcp <= 1:
        return
    if algorithm is None:  # a plain launch: the target's own extend and decode (0011's check)
        check_dcp_decode_backend(server_args)
        return
    draft_path = getattr(view, "speculative_draft_model_path", None)
    target_backend, mla = _decode_backend(server_args), _uses_mla(server_args)
    own_layer = draft_path in (None, getattr(view, "model_path", None))
    # Only where the answer can change the verdict: an external EAGLE-family draft on an MLA target's backends
    # the map ran (the config read is sglang's own, once per launch).
    draft_mla = (not own_layer and mla and str(algorithm).upper() in ("EAGLE", "EAGLE3", "NEXTN")
                 and target_backend in ("flashinfer", "fa3")
                 and getattr(_module(), DRAFT_USES_MLA, draft_uses_mla)(view))
    line = passes.refusal(
        _installed_version() or "", str(algorithm), dcp=dcp,
        own_layer=own_layer, mla=mla, target_backend=target_backend, draft_mla=draft_mla,
        draft_backend=getattr(view, "speculative_draft_attention_backend", None),
        verify_fix=_verify_fix(target_backend, mla), topk=int(getattr(view, "speculative_eagle_topk", None) or 1),
        flashinfer_fix=_verify_fix("flashinfer", mla), kv_cache_dtype=getattr(view, "kv_cache_dtype", None),
    )
    if line is not None:
        raise ValueError(line)


def check_dcp_decode_backend(server_args) -> None:
    """0011's check: one ValueError line for DCP on a target backend whose own extend and decode the map shows
    broken (fa3 MLA), whatever the speculative algorithm: NGRAM, STANDALONE and DFLASH run those passes too
    (:func:`check_passes_under_dcp` refuses them through ``passes.judge``'s plain fallback, in the same words)."""
    from ... import passes

    dcp = int(getattr(_view(server_args), "dcp_size", 1) or 1)
    if dcp <= 1:
        return
    line = passes.plain_refusal(_installed_version() or "", dcp=dcp, mla=_uses_mla(server_args),
                                target_backend=_decode_backend(server_args))
    if line is not None:
        raise ValueError(line)


def _verify_fix(target_backend: str | None, mla: bool) -> str | None:
    """The per-draft-token verify on flashinfer MLA, where the plugin's hooks (this check is the plugin's) or the
    release's code carry it; only a flashinfer MLA target asks."""
    if target_backend != "flashinfer" or not mla:
        return None
    from .flashinfer_mla_backend import verify_fix_in_effect

    return verify_fix_in_effect(plugin_on=True)


def declare_check() -> None:
    """Put the check in sglang's module under 0008's name, beside the helpers it reads there (``use_mla_backend``,
    which 0008 imports into that module, and 0013's ``_draft_uses_mla``) and 0011's check, so code and tests
    written for the series find them all, and a test that patches one there patches it for this check too."""
    module = _module()
    if getattr(module, CHECK, None) is None:
        setattr(module, CHECK, check_passes_under_dcp)
    if getattr(module, DRAFT_USES_MLA, None) is None:
        setattr(module, DRAFT_USES_MLA, draft_uses_mla)
    if getattr(module, DECODE_BACKEND_CHECK, None) is None:
        setattr(module, DECODE_BACKEND_CHECK, check_dcp_decode_backend)
    if not hasattr(module, "use_mla_backend"):
        use_mla_backend = _helper("use_mla_backend")
        if use_mla_backend is not None:  # a release without it: the server args answer it themselves
            module.use_mla_backend = use_mla_backend


def refuse_broken_passes(original: Callable, server_args, *args, **kwargs):
    """AROUND hook for ``handle_speculative_decoding(server_args)``: sglang's resolution, then the map's refusal."""
    first_call()
    result = original(server_args, *args, **kwargs)
    check_passes_under_dcp(server_args)
    return result


# The table's entry (plugin/hooks/__init__.py collects it; docs/patches.md is generated from it).
HOOKS = (
    Hook(
        module=MODULE, target=SPECULATIVE, judge=passes_verdict, hook=refuse_broken_passes,
        stage=RESOLUTION_STAGE,
        does="refuses under DCP, at argument time, each launch whose passes the map shows crashing or reading other rows",
        why="sglang admits speculative decoding (and plain decode on fa3 MLA) under --dcp-size > 1 on backends whose "
            "passes plan untranslated rows or drop the LSE the DCP merge needs: they crash or read other tokens' KV",
        upstream="not yet sent (patches/upstream-next 0008, 0011, 0013; docs/upstreaming.md)",
        drop_when="upstream translates each backend's passes under DCP, or refuses them itself",
        series_patch="upstream-next/0008",
        on_install=declare_check,
    ),
)
