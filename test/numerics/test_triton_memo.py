"""emulation.triton_memo: a launch whose every input equals an earlier one's replays exactly what the interpreter
wrote, and a change to any one input (a tensor's bytes, a scalar, a constexpr, the grid, the kernel's source or a
helper it calls, which arguments share a storage) runs the interpreter again.

The kernels are this file's own (a row scatter, the shape of sglang's ``set_mla_kv_buffer``): the memo knows nothing
of sglang, and no sglang is imported here. That it leaves the pass map's and the numerics' figures as they were
on sglang's own kernels is shown by their freshness checks, which pass with it on, against figures committed
without it (test/spec/test_passmap.py, test/numerics/).
"""

from __future__ import annotations

import pytest
import triton.language as tl

from emulation import triton_memo


def scatter(buf, rows, vals, n, W: tl.constexpr):
    i = tl.program_id(0)
    off = tl.arange(0, W)
    tl.store(buf + tl.load(rows + i) * W + off, tl.load(vals + i * W + off) + n)


def scatter_doubled(buf, rows, vals, n, W: tl.constexpr):
    i = tl.program_id(0)
    off = tl.arange(0, W)
    tl.store(buf + tl.load(rows + i) * W + off, 2 * tl.load(vals + i * W + off) + n)


@pytest.fixture
def kernels(monkeypatch):
    """The two kernels under Triton's interpreter, the memo installed fresh, and put back after."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(triton_memo.SWITCH, raising=False)
    import triton

    made = {f.__name__: triton.jit(f) for f in (scatter, scatter_doubled)}
    assert type(made["scatter"]).__name__ == "InterpretedFunction"
    triton_memo.uninstall()
    triton_memo.install()
    yield made
    triton_memo.uninstall()


def inputs(rows=(1, 3), n=0.0, width=4, fill=0.0):
    import torch

    buf = torch.full((8, width), fill)
    vals = torch.arange(len(rows) * width, dtype=torch.float32).reshape(len(rows), width)
    return buf, torch.tensor(rows), vals, n, width


def launch(kernel, buf, rows, vals, n, width, grid=None):
    kernel[grid or (len(rows),)](buf, rows, vals, n, W=width)
    return buf


def interpreted(kernel, *args, grid=None):
    """The same launch through the interpreter's own run (the memo's record kept): what the interpreter writes."""
    from triton.runtime import interpreter

    remembered = interpreter.InterpretedFunction.run
    interpreter.InterpretedFunction.run = triton_memo._installed[0]
    try:
        return launch(kernel, *args, grid=grid)
    finally:
        interpreter.InterpretedFunction.run = remembered


def test_a_repeated_launch_replays_exactly_what_the_interpreter_wrote(kernels):
    first = launch(kernels["scatter"], *inputs())
    again = launch(kernels["scatter"], *inputs())
    assert (triton_memo.STATS.misses, triton_memo.STATS.hits) == (1, 1)
    assert again.numpy().tobytes() == first.numpy().tobytes() == interpreted(kernels["scatter"], *inputs()).numpy().tobytes()
    assert again[1].tolist() == [0.0, 1.0, 2.0, 3.0] and again[0].tolist() == [0.0] * 4


def _shared_storage():
    """The same values as inputs(), but vals lies in a storage that the launch's buffer shares."""
    import torch

    buf, rows, vals, n, width = inputs()
    whole = torch.zeros(8 * width + vals.numel())
    whole[8 * width:] = vals.flatten()
    return whole[:8 * width].view(8, width), rows, whole[8 * width:].view(2, width), n, width


def _changed_bytes():
    args = inputs()
    args[2][1, 0] = 42.0
    return args


# change -> (kernel, fresh arguments, grid): each differs from the first launch's in one input only.
CHANGES = {
    "a tensor's bytes": ("scatter", _changed_bytes, None),
    "the buffer it writes into": ("scatter", lambda: inputs(fill=1.0), None),
    "a scalar": ("scatter", lambda: inputs(n=0.5), None),
    "a constexpr": ("scatter", lambda: inputs(width=2), None),
    "the grid": ("scatter", inputs, (1,)),
    "another kernel": ("scatter_doubled", inputs, None),
    "a shared storage": ("scatter", _shared_storage, None),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_to_any_one_input_runs_the_interpreter_again(kernels, change):
    launch(kernels["scatter"], *inputs())
    name, make, grid = CHANGES[change]
    hits = triton_memo.STATS.hits
    got = launch(kernels[name], *make(), grid=grid)
    assert triton_memo.STATS.hits == hits, f"{change}: the launch was replayed, not interpreted"
    assert got.numpy().tobytes() == interpreted(kernels[name], *make(), grid=grid).numpy().tobytes()
    # and the changed launch is remembered in its turn
    launch(kernels[name], *make(), grid=grid)
    assert triton_memo.STATS.hits == hits + 1


def test_the_switch_leaves_the_interpreter_alone(kernels, monkeypatch):
    triton_memo.uninstall()
    monkeypatch.setenv(triton_memo.SWITCH, "0")
    triton_memo.install()
    launch(kernels["scatter"], *inputs())
    launch(kernels["scatter"], *inputs())
    assert (triton_memo.STATS.misses, triton_memo.STATS.hits) == (0, 0) and not triton_memo._installed


def test_a_memo_blind_to_one_input_is_caught(kernels, monkeypatch):
    # Control: a key that leaves the grid out replays the full-grid launch for a one-program grid, and the
    # bytes it leaves differ from the interpreter's, which the check above would report.
    monkeypatch.setattr(triton_memo, "_resolve_grid", lambda *args: ("any",))
    launch(kernels["scatter"], *inputs())
    hits = triton_memo.STATS.hits
    got = launch(kernels["scatter"], *inputs(), grid=(1,))
    assert triton_memo.STATS.hits == hits + 1
    assert got.numpy().tobytes() != interpreted(kernels["scatter"], *inputs(), grid=(1,)).numpy().tobytes()
