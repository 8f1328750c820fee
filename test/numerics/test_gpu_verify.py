"""`make gpu-check-verify` (tools/emulation/mla/gpu_verify.py) where there is no GPU: its help, its one line without
a GPU, its helpers on tiny CPU tensors, and, on sglang 0.5.23, a rehearsal of every part with the MLA oracle in
flashinfer's place (Triton in its interpreter). What it shows of flashinfer's own kernel needs a GPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from emulation.mla import gpu_verify  # noqa: E402
from emulation.mla.oracle import dense_reference  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TREE = os.environ.get("DCP_DSPARK_TREE", "stock")


def test_help_names_every_part(capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_verify.main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for part in gpu_verify.PARTS:
        assert f"{part} (limit {gpu_verify.LIMITS[part]} s)" in out


def test_the_parts_stay_within_eight_minutes():
    assert sum(gpu_verify.LIMITS.values()) < 8 * 60 - 30  # room for the imports and the report


def test_without_a_gpu_it_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_verify.main(["--json", str(tmp_path / "out.json")]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_verify: needs one CUDA GPU"), lines
    assert not (tmp_path / "out.json").exists()


def test_an_unknown_part_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_verify.main(["--parts", "kernel,nope"])
    assert stop.value.code == 2
    assert "unknown part nope" in capsys.readouterr().err


@pytest.mark.parametrize("page_size", [1, 2])
def test_the_owner_rule_puts_each_position_on_its_rank(page_size):
    dcp, lengths = 4, [13, 40, 1]
    table, locs = gpu_verify.owner_layout(torch, lengths, dcp, page_size=page_size,
                                          generator=torch.Generator().manual_seed(0))
    used = []
    for r, n in enumerate(lengths):
        row = table[r, :n].long()
        assert bool((row % dcp == torch.arange(n) % dcp).all())
        used += row.tolist()
    assert len(set(used)) == len(used)
    assert min(used) >= page_size * dcp and max(used) < locs and locs % dcp == 0  # page 0 is never handed out


def test_each_rank_pool_holds_the_positions_it_owns():
    dcp, lengths = 4, [13, 40]
    table, locs = gpu_verify.owner_layout(torch, lengths, dcp, generator=torch.Generator().manual_seed(1))
    cache = torch.arange(locs, dtype=torch.float32)[:, None].repeat(1, 3)  # each row holds its own loc
    for rank in range(dcp):
        pool = gpu_verify.rank_pool(cache, dcp, rank)
        rows = gpu_verify.rank_rows(table, lengths, dcp, rank)
        for r, n in enumerate(lengths):
            positions = list(range(rank, n, dcp))
            assert len(rows[r]) == len(positions)
            assert pool[rows[r], 0].tolist() == [float(table[r, p]) for p in positions]


def test_dense_attention_is_the_oracles_reference():
    g = torch.Generator().manual_seed(2)
    ckv, kpe, heads = 8, 4, 2
    q, keys = torch.randn(4, heads, ckv + kpe, generator=g), torch.randn(7, ckv + kpe, generator=g)
    visible = torch.rand(4, 7, generator=g) > 0.4
    visible[0] = True
    visible[3] = False  # a query with no key
    out, lse = gpu_verify.dense_attention(torch, q, keys, ckv, 0.3, visible)
    seen = [0, 1, 2]
    want_out, want_lse = dense_reference(q[seen, :, :ckv], q[seen, :, ckv:], keys[:, :ckv], keys[:, ckv:], 0.3,
                                         visible[seen])
    assert torch.allclose(out[seen].double(), want_out, atol=1e-5)
    assert torch.allclose(lse[seen].double(), want_lse, atol=1e-5)
    assert float(out[3].abs().max()) == 0 and bool(torch.isneginf(lse[3]).all())


def test_the_ranks_merged_by_lse_are_one_rank():
    g = torch.Generator().manual_seed(3)
    ckv, kpe, heads, n = 8, 4, 2, 9
    q, keys = torch.randn(3, heads, ckv + kpe, generator=g), torch.randn(n, ckv + kpe, generator=g)
    visible = torch.arange(n)[None, :] <= torch.tensor([0, 4, 8])[:, None]  # query 0 sees key 0 alone
    whole = gpu_verify.dense_attention(torch, q, keys, ckv, 0.5, visible)
    parts = [gpu_verify.dense_attention(torch, q, keys, ckv, 0.5, visible & (torch.arange(n) % 3 == r)[None, :])
             for r in range(3)]
    assert bool(torch.isneginf(parts[1][1][0]).all())  # rank 1 holds nothing query 0 sees: the neutral partial
    out, lse = gpu_verify.merge_ranks(torch, [o for o, _ in parts], [x for _, x in parts])
    assert torch.allclose(out, whole[0], atol=1e-5) and torch.allclose(lse, whole[1], atol=1e-5)
    empty = gpu_verify.merge_ranks(torch, [torch.zeros(1, 1, 2)], [torch.full((1, 1), -math.inf)])
    assert float(empty[0].abs().max()) == 0 and bool(torch.isneginf(empty[1]).all())


def test_compare_and_its_tolerance():
    want = torch.tensor([[1.0, -2.0]])
    same = gpu_verify.compare(want, want, torch.zeros(1), torch.zeros(1))
    assert same["rel"] == 0 and gpu_verify.within(same, "bfloat16")
    off = gpu_verify.compare(want + torch.tensor([[0.0, 0.1]]), want)
    assert off["rel"] == pytest.approx(0.05) and not gpu_verify.within(off, "bfloat16")
    broken = gpu_verify.compare(torch.tensor([[math.nan, 0.0]]), want)
    assert broken["rel"] == math.inf and not gpu_verify.within(broken, "float32")
    neutral = gpu_verify.compare(want, want, torch.tensor([-math.inf]), torch.tensor([-math.inf]))
    assert neutral["lse_err"] == 0


def test_each_part_runs_under_its_limit_and_fails_alone(monkeypatch, capsys):
    import time

    env = gpu_verify.Env(torch, "cpu", None, torch.float32, gpu_verify.Shape(), True)

    def slow(env, rec):
        time.sleep(5)
        return True

    def broken(env, rec):
        raise RuntimeError("no kernel")

    monkeypatch.setitem(gpu_verify.RUNNERS, "kernel", slow)
    monkeypatch.setitem(gpu_verify.RUNNERS, "split", broken)
    started = time.perf_counter()
    assert gpu_verify.run_part(env, "kernel", 1)["status"] == "TIMEOUT"
    assert time.perf_counter() - started < 4
    failed = gpu_verify.run_part(env, "split", 5)
    assert failed["status"] == "ERROR" and "no kernel" in failed["error"]
    env.broken = "it did not build"
    assert gpu_verify.run_part(env, "timing", 5)["status"] == "skipped"
    printed = capsys.readouterr().out.splitlines()
    assert "[kernel] ran out of its 1 s" in printed and all(len(row) <= gpu_verify.WIDTH for row in printed)


def test_the_slim_wheel_keeps_the_mla_kernels_sources(tmp_path):
    import zipfile

    kept = ["flashinfer/__init__.py", "flashinfer/data/csrc/batch_mla_sm90_run.cu", "flashinfer/data/csrc/tvm_ffi_utils.h",
            "flashinfer/data/include/flashinfer/attention/mla_hopper.cuh", "flashinfer/data/cutlass/include/cute/a.h",
            "flashinfer/fused_moe/__init__.py"]
    dropped = ["flashinfer/data/csrc/cake_sampling/k.cuh", "flashinfer/data/csrc/fused_moe/x/y.cu",
               "flashinfer/data/cutlass/examples/e.cu"]
    record = "flashinfer_python-0.7.2.dist-info/RECORD"
    source = tmp_path / "flashinfer_python-0.7.2-py3-none-any.whl"
    with zipfile.ZipFile(source, "w") as wheel:
        for name in kept + dropped:
            wheel.writestr(name, name)
        wheel.writestr(record, "".join(f"{name},sha256=x,1\n" for name in kept + dropped) + f"{record},,\n")
    slim = gpu_verify.slim_wheel(source, tmp_path / "slim")
    assert slim.name == source.name
    with zipfile.ZipFile(slim) as wheel:
        assert sorted(wheel.namelist()) == sorted([*kept, record])
        assert all(wheel.read(name).decode() == name for name in kept)
        rows = [row.split(",")[0] for row in wheel.read(record).decode().splitlines()]
    assert rows == [*kept, record]


@pytest.mark.skipif(TREE != "next-stock", reason="the rehearsal runs once, on sglang 0.5.23 (the next-stock tree)")
def test_a_rehearsal_runs_every_part_on_the_oracle(tmp_path):
    out = tmp_path / "gpu_verify.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, str(REPO / "tools" / "emulation" / "mla" / "gpu_verify.py"),
                             "--rehearse", "--json", str(out)], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["rehearsal"] and report["result"] == "pass"
    assert [report["parts"][p]["status"] for p in gpu_verify.PARTS] == ["pass"] * len(gpu_verify.PARTS)
    assert report["parts"]["kernel"]["check"]["verdict"].startswith("passes")
    assert all(row["ok"] for row in report["parts"]["kernel"]["rows"])
    checks = report["parts"]["split"]["checks"]
    for name in ("eager", "graph at capture lengths", "graph re-planned (next)", "graph re-planned (half)"):
        assert checks[name]["ok"] and checks[name]["rel"] < 1e-4, (name, checks[name])
    assert checks["control: stale buffers"]["ok"] and checks["control: stale buffers"]["rel"] > 1e-2
    # The oracle plans from its bound buffers at each run: it has no schedule to leave stale.
    assert not checks["control: no re-plan"]["required"]
    assert set(report["parts"]["timing"]["figures"]) == {"graph/split", "graph/stock", "eager/split", "eager/stock"}
    assert set(report["parts"]["profile"]["profile"]) == {"split layer", "stock layer", "split step re-plan"}
    printed = [line for line in result.stdout.splitlines() if line.startswith(("[", "    "))]
    assert printed and all(len(line) <= gpu_verify.WIDTH for line in printed), max(printed, key=len)
