"""preflight.refusals and preflight.advice: who refuses a launch, decided from its facts, and the changes tried.

Judged on the installed sglang (the unit tier: stock 0.5.17): its own parser reads the launches, its own
SpeculativeAlgorithm says which names it knows. No refusal is read out of a message: each test hands the
functions a message that says nothing, and the facts alone decide.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import passes
from sglang_dcp_dspark.preflight import advice, inputs, refusals
from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from sglang_dcp_dspark.preflight.launch import Node
from sglang_dcp_dspark.preflight.verdict import Change, Refusal

H200, B200 = Node.of_part("NVIDIA H200"), Node.of_part("NVIDIA B200")
BASE = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8"]
SAYS_NOTHING = "sglang 0.5.17: ValueError: no"


def gate(*argv: str, node: Node = H200) -> Refusal | None:
    return refusals.input_gate("sglang 0.5.17", SAYS_NOTHING, inputs.parse_launch([*BASE, *argv]), node=node)


def test_a_backend_the_nodes_gpus_cannot_run_is_named_with_the_gpu():
    found = gate("--attention-backend", "cutedsl_mla")
    assert found.what == "cutedsl_mla on the NVIDIA H200's Hopper GPUs" and found.backend == "cutedsl_mla"
    assert found.fixes == (Change("drop --attention-backend", drop=advice.BACKEND_OPTIONS),)
    assert gate("--attention-backend", "cutedsl_mla", node=B200) is None
    assert gate("--attention-backend", "fa3", node=B200).what.startswith("fa3 on the NVIDIA B200's")


def test_an_algorithm_in_the_wrong_case_gets_the_right_one():
    found = gate("--speculative-algorithm", "dspark", "--speculative-draft-model-path", str(DEFAULT_DRAFT))
    assert found.what == "--speculative-algorithm dspark: it needs DSPARK"
    assert found.fixes == (Change("--speculative-algorithm DSPARK", add=("--speculative-algorithm", "DSPARK")),)


def test_an_unknown_algorithm_lists_the_names_the_release_knows():
    found = gate("--speculative-algorithm", "MEDUSA")
    assert found.what == "an unknown --speculative-algorithm MEDUSA" and not found.fixes
    names = found.todo.removeprefix("--speculative-algorithm takes one of ").split(", ")
    assert {"DSPARK", "EAGLE", "EAGLE3", "NEXTN"} <= set(names) and "NONE" not in names and "MEDUSA" not in names
    assert gate("--speculative-algorithm", "NEXTN") is None  # sglang's alias for EAGLE, on every release


def test_a_draft_the_algorithm_needs_names_the_flag():
    found = gate("--speculative-algorithm", "DSPARK")
    assert found.what == "DSPARK without --speculative-draft-model-path"
    assert found.todo.startswith("add --speculative-draft-model-path with the DSPARK draft model's checkpoint")
    assert gate("--speculative-algorithm", "EAGLE") is None  # EAGLE falls back on the target's own NextN layer


def test_a_dcp_size_below_one_is_dropped():
    found = refusals.input_gate("sglang 0.5.17", SAYS_NOTHING, inputs.parse_launch(
        ["--model-path", str(DEFAULT_MODEL), "--dcp-size", "-2"]), node=H200)
    assert found.what == "--dcp-size -2: it takes 1 or more" and found.fixes[0].drop[0] == "--dcp-size"


@pytest.mark.parametrize("argv,mla,version,what", [
    (["--enable-hierarchical-cache", "--hicache-storage-backend", "file"], True, "0.5.23",
     "--hicache-storage-backend file under DCP"),
    (["--enable-hierarchical-cache"], False, "0.5.23", "HiCache under DCP for a dense model"),
    # sglang's gate refuses these before any draft: named, so the change tried first drops that flag alone
    (["--enable-hierarchical-cache", "--enable-lmcache", "--speculative-algorithm", "EAGLE3"], True, "0.5.23",
     "LMCache under DCP"),
    (["--enable-hierarchical-cache", "--speculative-algorithm", "EAGLE3"], True, "0.5.23", "HiCache under DCP with EAGLE3"),
    # 0.5.17 refuses every draft under DCP + HiCache; from 0.5.18 (the upstream fix) DSPARK's is admitted
    (["--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK"], True, "0.5.17", "HiCache under DCP with DSPARK"),
    (["--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK"], True, "0.5.23", ""),
    (["--speculative-algorithm", "EAGLE3"], True, "0.5.23", ""),
])
def test_sglangs_hicache_gates_are_named_by_the_launchs_facts(argv, mla, version, what):
    found = refusals.hicache_gate("sglang " + version, SAYS_NOTHING, inputs.parse_launch([*BASE, *argv]), mla=mla,
                                  version=version)
    assert found.what == what and found.message == SAYS_NOTHING
    if what == "LMCache under DCP":
        assert [c.words for c in found.fixes] == ["drop --enable-lmcache"]


def test_the_plugins_check_is_read_as_it_decided():
    """The same facts the plugin's check decides from: the option it names is the first change tried."""
    facts = dict(dcp=8, own_layer=False, mla=True, target_backend="flashinfer", draft_backend=None,
                 verify_fix="plugin", flashinfer_fix="plugin")
    kv = passes.refusal_of("0.5.23", "DSPARK", kv_cache_dtype="fp8_e4m3", **facts)
    assert (kv.flag, kv.value, kv.fix, kv.backend) == ("--kv-cache-dtype", "fp8_e4m3", ("--kv-cache-dtype", "auto"),
                                                       "flashinfer")
    assert refusals.of_check("the plugin", "m", kv).fixes == (Change("--kv-cache-dtype auto",
                                                                      add=("--kv-cache-dtype", "auto")),)
    tree = passes.refusal_of("0.5.23", "EAGLE3", topk=4, **facts)
    assert tree.what == "a draft tree (topk 4) on flashinfer under DCP" and tree.fix == ("--speculative-eagle-topk", "1")
    triton = passes.refusal_of("0.5.23", "DSPARK", **{**facts, "draft_backend": "triton"})
    assert triton.line == passes.TRITON_DRAFT.format(dcp=8)
    assert refusals.of_check("the plugin", "m", triton).fixes == (
        Change("drop --speculative-draft-attention-backend triton", drop=("--speculative-draft-attention-backend",)),)
    # the line each carrier raises is the facts' line
    assert passes.refusal("0.5.23", "EAGLE3", topk=4, **facts) == tree.line
    # sglang renames NEXTN to EAGLE before the check sees it: the words keep the name the launch gave (on fa3: on
    # flashinfer the fix plans the own layer's passes, and the check admits it)
    assert passes.refusal_of("0.5.23", "EAGLE", launched="NEXTN", **{**facts, "own_layer": True}) is None
    own = passes.refusal_of("0.5.23", "EAGLE", launched="NEXTN", **{**facts, "own_layer": True, "target_backend": "fa3"})
    assert own.what == "NEXTN on fa3 under DCP" and "EAGLE" in own.line and "--attention-backend flashinfer" in own.line


class _Runs:
    """What a launch runs, as :func:`advice.candidates` reads it."""

    def __init__(self, **kw):
        self.__dict__.update(dict(dcp=8, algorithm="EAGLE3", eagle_topk=4, hicache=True, decode="fa3") | kw)


class _Facts:
    def __init__(self, refused=None, plugin_on=True):
        self.refused, self.plugin_on, self.ram = refused, plugin_on, None


def test_the_changes_are_tried_in_the_order_of_what_each_takes_away():
    named = Change("--kv-cache-dtype auto", add=("--kv-cache-dtype", "auto"))
    refused = Refusal("the plugin", "x", "m", fixes=(named,))
    tried = [c.words for c in advice.candidates(_Facts(refused, plugin_on=False), _Runs(), code=1,
                                                working=("fa3", "flashinfer"), plugin_installed=True)]
    assert tried == ["--kv-cache-dtype auto", "--attention-backend flashinfer", "the dcp_dspark plugin on",
                     "--speculative-eagle-topk 1", "drop --enable-hierarchical-cache", "--dcp-size 1",
                     "drop speculative decoding (every --speculative- option)"]
    # a launch that runs unchecked is offered a checked backend, nothing that takes more away
    tried = [c.words for c in advice.candidates(_Facts(), _Runs(), code=6, working=("flashinfer",),
                                                plugin_installed=True)]
    assert tried == ["--attention-backend flashinfer"]
