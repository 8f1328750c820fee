"""Who refuses a launch at argument time, and what, as facts (:class:`result.Refusal`): never read out of the
refusal's words.

Two sources. The plugin's check and the series' (upstream-next 0008, 0013) decide from the launch's facts
(:func:`passes.refusal_of`), so the same facts are asked here (:func:`of_check`). sglang's own gates are
matched by the launch's facts too: :func:`input_gate` (a backend the node's GPUs cannot run, an algorithm
sglang does not know or spells otherwise, a draft model the algorithm needs, a --dcp-size below 1) and
:func:`hicache_gate` (HiCache under DCP with an L3 storage backend, a dense model, or a draft other than
DSPARK's). A gate is named only where sglang did refuse the launch; a refusal no fact explains is quoted
whole, and its line says so.
"""

from __future__ import annotations

import argparse

from .. import passes as passes_mod
from .advice import BACKEND_OPTIONS
from .verdict import Change, Refusal

# The algorithms that have no draft of their own to fall back on: sglang needs --speculative-draft-model-path.
NEEDS_DRAFT_PATH = ("DSPARK", "EAGLE3", "STANDALONE", "DFLASH")


def known(algorithm: str) -> bool:
    """Does the installed sglang know the --speculative-algorithm ``algorithm`` (in any case)? NEXTN is its alias
    for EAGLE on every release (server_args renames it)."""
    from sglang.srt.speculative import spec_info

    if algorithm.upper() == "NEXTN":
        return True
    try:
        spec_info.SpeculativeAlgorithm.from_string(algorithm)
    except (ValueError, KeyError):
        return False
    return True


def algorithm_names() -> tuple[str, ...]:
    """The --speculative-algorithm values the installed sglang knows: its enum's names and NEXTN."""
    from sglang.srt.speculative import spec_info

    names = [m.name for m in spec_info.SpeculativeAlgorithm if m.name != "NONE"]
    return tuple(dict.fromkeys([*names, *sorted(getattr(spec_info, "_RESERVED_ALIASES", ()) or ()), "NEXTN"]))


def input_gate(who: str, message: str, given: argparse.Namespace, *, node) -> Refusal | None:
    """A plain mistake in the launch that sglang refuses (``message``, attributed), named by the launch's facts:
    a backend the node's GPUs cannot run, an algorithm sglang does not know or spells otherwise, a draft model
    the algorithm needs, a --dcp-size below 1. None where none is."""
    named = given.decode_attention_backend or given.attention_backend
    if named and not passes_mod.runs_on(named, node.capability[0]):
        return Refusal(who, f"{named} on the {node.gpu_name}'s {node.architecture} GPUs", message, named,
                       fixes=(Change("drop --attention-backend", drop=BACKEND_OPTIONS),))
    algorithm = given.speculative_algorithm
    if algorithm:
        if not known(algorithm):
            return Refusal(who, f"an unknown --speculative-algorithm {algorithm}", message,
                           todo=f"--speculative-algorithm takes one of {', '.join(algorithm_names())}")
        if algorithm != algorithm.upper():
            right = algorithm.upper()
            return Refusal(who, f"--speculative-algorithm {algorithm}: it needs {right}", message,
                           fixes=(Change(f"--speculative-algorithm {right}", add=("--speculative-algorithm", right)),))
        if algorithm in NEEDS_DRAFT_PATH and not given.speculative_draft_model_path:
            return Refusal(who, f"{algorithm} without --speculative-draft-model-path", message,
                           todo=f"add --speculative-draft-model-path with the {algorithm} draft model's checkpoint "
                                "(preflight reads its config.json to judge it)")
    dcp = given.dcp_size if given.dcp_size is not None else 1
    if dcp < 1:
        return Refusal(who, f"--dcp-size {dcp}: it takes 1 or more", message,
                       fixes=(Change("drop --dcp-size", drop=("--dcp-size", "--decode-context-parallel-size")),))
    return None


def other_gate(who: str, message: str, given: argparse.Namespace, *, mla: bool) -> Refusal | None:
    """sglang's gates on HiCache under DCP that refuse the launch whatever its draft (an L3 storage backend, a dense
    model, LMCache, HiSparse), named by the launch's facts; None where none applies. They come before the draft's
    in sglang's gate and in the plugin's hook on it (upstream-next 0020 too)."""
    dcp = given.dcp_size if given.dcp_size is not None else 1
    if dcp <= 1 or not given.enable_hierarchical_cache:
        return None
    storage = getattr(given, "hicache_storage_backend", None)
    if storage:
        return Refusal(who, f"--hicache-storage-backend {storage} under DCP", message,
                       fixes=(Change(f"drop --hicache-storage-backend {storage}", drop=("--hicache-storage-backend",)),))
    if not mla:
        return Refusal(who, "HiCache under DCP for a dense model", message)
    for flag, name in (("--enable-lmcache", "LMCache"), ("--enable-hisparse", "HiSparse")):
        if getattr(given, flag[2:].replace("-", "_"), False):
            return Refusal(who, f"{name} under DCP", message, fixes=(Change(f"drop {flag}", drop_flags=(flag,)),))
    return None


def hicache_gate(who: str, message: str, given: argparse.Namespace, *, mla: bool, version: str) -> Refusal:
    """sglang's gates on HiCache under DCP (:func:`other_gate`'s, then a draft other than DSPARK's on releases from
    0.5.18, any draft before), named by the launch's facts; else the refusal as sglang words it."""
    other = other_gate(who, message, given, mla=mla)
    if other is not None:
        return other
    dcp = given.dcp_size if given.dcp_size is not None else 1
    algorithm = given.speculative_algorithm
    if dcp > 1 and given.enable_hierarchical_cache and algorithm and (
            algorithm != "DSPARK" or passes_mod.version_key(version) < (0, 5, 18)):
        return Refusal(who, f"HiCache under DCP with {algorithm}", message)
    return Refusal(who, "", message)


def of_check(who: str, message: str, found: passes_mod.Refusal) -> Refusal:
    """The plugin's (or the series') check, as it decided: what it refuses, on which backend, and the option it
    names, whose change it names first."""
    fixes = ()
    if found.flag is not None:
        if found.fix:
            fixes = (Change(" ".join(found.fix), add=found.fix),)
        else:
            fixes = (Change(f"drop {found.flag} {found.value}", drop=(found.flag,)),)
    return Refusal(who, found.what, message, found.backend, fixes)
