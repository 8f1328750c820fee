"""The launch on the emulated node: sglang's own resolution of it (stock and with the plugin's hooks), the models as
the release reads them, what it runs (:class:`Runs`), the pass map's judgement of its passes, and the first change
preflight finds that makes it pass (:func:`advise`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from .. import passes as passes_mod
from ..core import swap
from ..core.errors import DcpDsparkError
from ..plugin import hooks as hooks_mod
from . import launch as launch_mod
from . import models as models_mod
from . import result
from .inputs import Configs
from .launch import Launch, Node, Resolution


def resolve(release, argv: list[str], node: Node, paths: dict[str, str], *, hooked: bool) -> Resolution:
    """The release's own resolution on the emulated node, with or without the plugin's hooks on server_args.

    sglang's resolution writes to the environment (0.5.23 sets SGLANG_USE_CUDA_IPC_TRANSPORT for the processes it
    would start); a judgement resolves several launches, and the next would read that as the operator's setting
    and warn of it, so each resolution leaves the environment as it found it."""
    with swap.environ_restored(), launch_mod.quiet_sglang() as log, launch_mod.emulated_node(node):
        try:
            args = release.resolve(argv, hooked=hooked)
        except SystemExit:
            raise DcpDsparkError("sglang exited while parsing the launch arguments; expected a valid launch; fix: correct the arguments after `--`") from None
        except Exception as exc:  # sglang validates with asserts, ValueError, NotImplementedError, ...
            bad = launch_mod.config_load_failure(exc, paths, release.version) or launch_mod.platform_refusal(
                exc, node, release.version)
            if bad is not None:
                raise bad from None
            text = " ".join(str(exc).split()) or type(exc).__name__
            return Resolution(False, f"{type(exc).__name__}: {text}", None, log.lines, text)
        return Resolution(True, None, release.launch(args), log.lines)


def plugin_state(environ=None):
    """Would sglang's load_plugins() run this plugin here, and would it act? (enabled, reason)"""
    from ..plugin import switch

    state = switch.plugin_state(os.environ if environ is None else environ)
    if state.enabled and not switch.entry_point_installed():
        return switch.PluginState(False, f"not installed: no {switch.PLUGIN_NAME} entry point in {switch.ENTRY_POINT_GROUP} (pip install --no-deps a checkout of sglang-dcp-dspark)")
    return state


def read_models(release, la, node: Node, paths: dict[str, str], *, reader=models_mod.read):
    """Each model's KV as the release's ModelConfig reads it (``reader``: :func:`models.read`, or
    :func:`models.geometry` for the numbers alone); a config it cannot load is one exit-2 line."""
    with launch_mod.quiet_sglang(), launch_mod.emulated_node(node):
        try:
            return reader(release, la)
        except DcpDsparkError:
            raise
        except Exception as exc:  # transformers' and sglang's config loading raise many types
            bad = launch_mod.config_load_failure(exc, paths, release.version)
            if bad is not None:
                raise bad from None
            text = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise DcpDsparkError(f"sglang {release.version}'s ModelConfig cannot read the launch's models ({type(exc).__name__}: {text}); "
                                 "expected configs sglang loads; fix: pass the models' own config.json (huggingface-cli download MODEL config.json)") from None


def applied_series() -> list[str]:
    """The series the tree this interpreter imports carries (none where no tree is found)."""
    from .. import series
    from ..core.compat import locate_tree

    try:
        tree = locate_tree(None)
    except DcpDsparkError:
        return []
    return series.applied_to(tree)


# ---------------------------------------------------------------- what the launch runs


@dataclass(frozen=True)
class Runs:
    """What the launch runs, as its passes and the advice are judged on it: read by :func:`runs` alone.

    ``resolved``: read off the launch as sglang resolved it on the emulated node; else (every resolution refused it)
    off sglang's own parse of the arguments. ``named_*`` and ``draft_backend_flag`` are what the arguments name,
    whichever it is."""

    resolved: bool
    target: str | None  # the target model path
    draft: str | None  # the draft model path; None: the target's own layer
    algorithm: str | None
    dcp: int
    hicache: bool
    prefill: str | None  # the target's prefill backend as resolved; None where nothing resolved
    decode: str | None  # the target's decode backend as resolved, else as the arguments name it
    draft_backend: str | None  # the draft's attention backend as resolved; None where nothing resolved
    named_prefill: str | None
    named_decode: str | None
    draft_backend_flag: str | None
    eagle_topk: int  # as the launch gives it (the resolved Launch keeps only what the host pools depend on)
    kv_cache_dtype: str | None  # as resolved where a resolution admitted it, else as the arguments name it

    @property
    def own_layer(self) -> bool:
        """The draft is the target's own layer (no draft model, or the target's path)."""
        return self.draft in (None, self.target)


def runs(la: Launch | None, given: argparse.Namespace) -> Runs:
    """What the launch runs: from the resolved launch ``la`` where a resolution admitted it, else from sglang's own
    parse of the arguments (``given``; its backend options default to None on every release)."""
    named_decode = given.decode_attention_backend or given.attention_backend
    named_prefill = given.prefill_attention_backend or given.attention_backend
    named = {"named_prefill": named_prefill, "named_decode": named_decode,
             "draft_backend_flag": given.speculative_draft_attention_backend,
             "eagle_topk": int(given.speculative_eagle_topk or 1)}
    if la is not None:
        prefill, decode = la.attention_backends
        return Runs(True, la.model_path, la.draft_model_path, la.speculative_algorithm, la.dcp_size,
                    bool(la.enable_hierarchical_cache), prefill, decode or named_decode,
                    la.speculative_draft_attention_backend, **named, kv_cache_dtype=la.kv_cache_dtype)
    return Runs(False, given.model_path, given.speculative_draft_model_path, given.speculative_algorithm,
                launch_mod.dcp_size(given.dcp_size), bool(given.enable_hierarchical_cache), None, named_decode, None,
                **named, kv_cache_dtype=given.kv_cache_dtype)


def picked_by(stock: Resolution, fixed: Resolution, plugin_on: bool, launch: Runs) -> str:
    """Who picked the decode backend of a launch that names none, where sglang's own pick was not kept: "the plugin"
    where its resolution and stock's both got through and differ there (under DCP on Hopper it picks flashinfer)."""
    if not plugin_on or launch.named_decode:
        return ""
    if stock.launch is None or fixed.launch is None:
        return ""
    return "the plugin" if stock.launch.attention_backends[1] != fixed.launch.attention_backends[1] else ""


def backends(launch: Runs, node: Node, *, picked_by: str = "") -> result.Backends:
    """The target's attention backends the launch runs on the emulated node, and where each comes from."""
    choice = f"sglang's choice on the {node.gpu_name}"
    picked = picked_by if not launch.named_decode and launch.resolved else ""
    parts = []
    for side, value, named in (("prefill", launch.prefill, launch.named_prefill),
                               ("decode", launch.decode, launch.named_decode)):
        if value is None:
            continue
        parts.append(f"{side} {value} (" + ("named by the launch" if named and named == value
                                            else f"picked by {picked} under DCP" if picked and value == launch.decode
                                            else choice) + ")")
    return result.Backends(launch.prefill, launch.decode, "; ".join(parts) or "not resolved", launch.draft_backend,
                           picked)


def draft_mla(launch: Runs, configs: Configs) -> bool:
    """An external draft checkpoint with MLA attention, which sglang runs as the target's own NextN layer."""
    return not launch.own_layer and models_mod.is_mla_config(configs.draft)


def judge_passes(release, launch: Runs, configs: Configs, *, plugin_on: bool = False,
                 node: Node | None = None) -> passes_mod.Judgement:
    """What the pass map says of the launch's passes under DCP (docs/spec-under-dcp.md): the speculative ones, or
    a plain launch's EXTEND and DECODE.

    On what the launch runs (:class:`Runs`): the decode backend is the one
    the release picks on the emulated node (its default for the architecture
    and model, model hooks included) unless the launch names one; where every
    resolution refused, the one the arguments name, so a rejection still names
    the pass that would break (a launch that names no backend is then judged on
    every target backend the map ran that runs on the ``node``). A flashinfer MLA target's verify is
    judged as the launch runs it: planned split where the tree carries
    upstream-next 0012 or the plugin is on and its hooks apply to this release; on a quantized KV pool no pass
    under DCP is checked, and the carriers refuse it (``passes.kv_cache_refusal``, the plugin's own decision):
    the judgement is unmapped and names the pool (``refused_kv``).
    """
    mla = models_mod.is_mla_config(configs.target)
    capability = node.capability[0] if node is not None else None
    if not launch.algorithm:
        if launch.dcp > 1 and not mla:
            return passes_mod.Judgement(passes_mod.release_key(release.version), passes_mod.PLAIN, launch.dcp, False,
                                        why_unmapped="preflight checks MLA targets under DCP, and this "
                                                     "one is dense")
        return passes_mod.judge_plain(release.version, dcp=launch.dcp, target_backend=launch.decode,
                                      capability_major=capability)
    # Where nothing resolved, every backend is judged: the fix counts on its flashinfer cases alone.
    verify_fix = (hooks_mod.verify_fix(plugin_on=plugin_on)
                  if launch.decode in (None, "flashinfer") and mla and launch.dcp > 1 else None)
    if passes_mod.kv_cache_refusal(dcp=launch.dcp, algorithm=launch.algorithm, kv_cache_dtype=launch.kv_cache_dtype,
                                   target_backend=launch.decode, mla=mla, verify_fix=verify_fix) is not None:
        return passes_mod.Judgement(passes_mod.release_key(release.version), str(launch.algorithm).upper(), launch.dcp,
                                    False, why_unmapped=passes_mod.KV_UNCHECKED.format(kv=launch.kv_cache_dtype),
                                    refused_kv=str(launch.kv_cache_dtype))
    return passes_mod.judge(
        release.version, launch.algorithm, dcp=launch.dcp, own_layer=launch.own_layer, target_mla=mla,
        target_backend=launch.decode, draft_backend=launch.draft_backend_flag, hicache=launch.hicache,
        verify_fix=verify_fix, draft_mla=draft_mla(launch, configs),
        capability_major=capability,
    )


# ---------------------------------------------------------------- the refusal, as facts


def hicache_refusal(launch: Runs, configs: Configs, *, launched: str | None = None) -> passes_mod.Refusal | None:
    """The refusal of an EAGLE-family draft under DCP + HiCache whose host pool does not fit its layout, by the
    gate of the plugin (or of upstream-next 0020), decided from the facts that gate decides it from."""
    return passes_mod.hicache_draft_refusal_of(
        launch.algorithm, dcp=launch.dcp, hicache=launch.hicache, own_layer=launch.own_layer,
        draft_mla=draft_mla(launch, configs), draft_backend=launch.draft_backend_flag, target_backend=launch.decode,
        launched=launched)


def refusal(release, launch: Runs, configs: Configs, *, plugin_on: bool,
            launched: str | None = None) -> passes_mod.Refusal | None:
    """The argument check's refusal of what the launch runs (the plugin's, or the series' on a tree that carries
    0008), decided from the same facts the check decides it from; None where it admits the launch. ``launched``:
    the algorithm as the launch names it, for the refusal's words."""
    mla = models_mod.is_mla_config(configs.target)
    if not launch.algorithm:
        return passes_mod.plain_refusal_of(release.version, dcp=launch.dcp, mla=mla, target_backend=launch.decode)
    fix = hooks_mod.verify_fix(plugin_on=plugin_on) if mla else None
    return passes_mod.refusal_of(
        release.version, launch.algorithm, dcp=launch.dcp, own_layer=launch.own_layer, mla=mla,
        target_backend=launch.decode, draft_backend=launch.draft_backend_flag, draft_mla=draft_mla(launch, configs),
        verify_fix=fix if launch.decode == "flashinfer" else None, topk=launch.eagle_topk, flashinfer_fix=fix,
        kv_cache_dtype=launch.kv_cache_dtype, launched=launched)
