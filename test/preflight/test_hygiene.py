"""preflight's input hygiene and wording: hostile config paths, --json on every exit, sweep verdicts, the labels.

The config files are real files on disk (a 100,000-deep JSON document, a
directory and a symbolic-link loop where config.json should be), judged by the
command in a fresh process, as an operator would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from report_text import verdict_line
from sglang_dcp_dspark.__main__ import main
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV)}
    return subprocess.run([sys.executable, "-m", "sglang_dcp_dspark", "preflight", *argv], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, Path]:
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    directory = tmp_path / "directory"
    (directory / "config.json").mkdir(parents=True)
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "config.json").symlink_to(loop / "config.json")
    return {"deep": deep, "directory": directory, "loop": loop}


@pytest.mark.parametrize("kind, says", [("deep", "is nested deeper than a JSON reader can follow"),
                                        ("directory", "is a directory, not a file"),
                                        ("loop", "is a symbolic link that leads nowhere (dangling, or a loop)")])
def test_a_hostile_config_path_is_one_line_of_bad_input(hostile, kind, says):
    before = sorted(p.name for p in hostile[kind].iterdir())
    out = run("--json", "--", "--model-path", str(hostile[kind]), "--tp", "8")
    assert out.returncode == 2, out.stderr[-2000:]
    assert says in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout)["verdict"]["code"] == 2
    assert sorted(p.name for p in hostile[kind].iterdir()) == before  # nothing was touched


def test_launch_flags_without_the_separator_get_a_hint_and_json(capsys):
    assert main(["preflight", "--json", "--model-path", "x", "--tp", "8"]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["verdict"]["code"] == 2 and report["verdict"]["outcome"] == "BAD INPUT"
    assert "unrecognized arguments: --model-path" in captured.err and "after `--`" in captured.err
    assert captured.err.count("\n") == 1


def test_an_internal_error_prints_json_too(capsys, monkeypatch):
    from sglang_dcp_dspark.preflight import check as preflight

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(preflight, "run", broken)
    assert main(["preflight", "--json", "--", "--model-path", "x"]) == 4
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["verdict"]["code"] == 4 and "internal error" in report["error"]
    assert captured.err.count("\n") == 1


def test_a_sweep_has_a_top_level_verdict_its_exit_code(capsys):
    code = main(["preflight", "--json", "--gpu-name", "NVIDIA H200", "--sweep", "dcp=3,8", "--device-rows", "1024", "--",
                 "--model-path", str(REPO / "test" / "data" / "tiny-mla"), "--tp", "8", "--dcp-size", "8",
                 "--enable-hierarchical-cache", "--attention-backend", "flashinfer"])
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"]["code"] == code == 2
    assert [r["report"]["verdict"]["code"] for r in result["rows"]] == [2, 0]


def test_worst_orders_unchecked_below_every_refusal():
    from sglang_dcp_dspark.preflight.verdict import worst

    assert worst([0, 6]) == 6 and worst([6, 1]) == 1 and worst([5, 6, 0]) == 5 and worst([3, 2]) == 3


def test_an_unknown_gpu_part_is_bad_input(capsys):
    assert main(["preflight", "--gpu-name", "NVIDIA Quadro"]) == 2
    err = capsys.readouterr().err
    assert "names no GPU preflight can emulate" in err and "H200" in err and err.count("\n") == 1


def test_a_part_sets_capability_and_memory():
    from sglang_dcp_dspark.preflight.launch import Node

    b200, b300, h100 = Node.of_part("NVIDIA B200"), Node.of_part("NVIDIA B300 SXM6 AC"), Node.of_part("h100")
    assert (b200.capability, b200.gpu_memory_gib) == ((10, 0), 180.0)
    assert b300.capability == (10, 3) and h100.capability == (9, 0)
    assert Node.of_part("NVIDIA GB200").capability == (10, 0)
    assert Node.of_part("NVIDIA H200", gpu_memory_gib=100.0).gpu_memory_gib == 100.0


def test_the_probes_answer_for_the_node_and_for_this_machine_after():
    """sglang's architecture probes answer for the emulated node inside the block, as this CPU machine after."""
    from sglang.srt import utils

    from sglang_dcp_dspark.preflight.launch import Node, emulated_node, import_sglang

    import_sglang()
    before = (utils.is_sm100_supported(), utils.is_hopper_with_cuda_12_3())
    with emulated_node(Node.of_part("NVIDIA B200")):
        assert utils.is_sm100_supported() and utils.is_blackwell() and not utils.is_hopper_with_cuda_12_3()
    with emulated_node(Node.of_part("NVIDIA H200")):
        assert utils.is_hopper_with_cuda_12_3() and not utils.is_sm100_supported()
    assert (utils.is_sm100_supported(), utils.is_hopper_with_cuda_12_3()) == before == (False, False)


def test_a_dense_target_at_dcp_1_is_not_told_about_dcp(capsys):
    """A dense model with HiCache and no DCP: the refusal says what preflight does not size, not a DCP gate."""
    dense = REPO / "test" / "data" / "public" / "kimi-k2.5-eagle3"  # LlamaForCausalLMEagle3: dense KV
    assert main(["preflight", "--", "--model-path", str(dense), "--enable-hierarchical-cache"]) == 2
    err = capsys.readouterr().err
    assert "under DCP for MLA models only" not in err and "without DCP its host pool" in err, err
    # under DCP sglang itself refuses it, for that reason
    assert main(["preflight", "--", "--model-path", str(dense), "--enable-hierarchical-cache", "--tp", "2",
                 "--dcp-size", "2"]) == 1
    out = capsys.readouterr().out
    assert "only supported for MLA models" in " ".join(out.split())
    assert verdict_line(out).endswith("refuses HiCache under DCP for a dense model"), verdict_line(out)


def test_status_names_a_series_for_another_release_as_such(capsys):
    """On the 0.5.17 tree the 0.5.23 series is written for another release, not in conflict with this one."""
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("upstream-next"))
    assert "other release" in line and "conflict" not in line, line


def test_a_refusal_is_read_with_the_condition_that_leads_to_it(tmp_path):
    """A raise guarded by a device-kind probe (this machine's answer) is no verdict on the node; one guarded by an
    architecture probe (the emulated node's answer) is sglang's verdict; the condition is read, not only the raise."""
    import importlib.util

    from sglang_dcp_dspark.preflight.launch import Node, platform_refusal

    module = tmp_path / "sglang" / "guarded.py"  # an sglang frame, as platform_refusal reads frames
    module.parent.mkdir()
    module.write_text(
        "class _Platform:\n    is_blackwell = False\n\n\n"
        "def is_cuda():\n    return False\n\n\n"
        "def get_platform():\n    return _Platform()\n\n\n"
        "def refuse(which):\n"
        "    if (\n        which == 'device'\n        and not is_cuda()\n    ):\n        raise ValueError('needs CUDA')\n"
        "    if which == 'arch' and not get_platform().is_blackwell:\n        raise ValueError('only Blackwell')\n"
        "    raise ValueError('plain')\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("guarded", module)
    guarded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guarded)
    found = {}
    for which in ("device", "arch", "plain"):
        with pytest.raises(ValueError) as raised:
            guarded.refuse(which)
        found[which] = platform_refusal(raised.value, Node(), "0.5.x")
    assert found["device"] is not None and "asks is_cuda, which answers for this CPU machine" in str(found["device"])
    assert found["arch"] is None and found["plain"] is None
