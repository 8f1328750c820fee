"""Triton's interpreter, remembered within one process: a kernel launch whose every input equals an earlier
launch's writes what that launch wrote, without being interpreted again.

On CPU every sglang Triton kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``), one program of the grid at
a time, in Python. The pass map and the MLA numerics write the same prefixes through sglang's own write door
(``set_mla_kv_buffer``, a Triton kernel) once per backend, pass, mode and control of a case: most of a run's time
is those identical launches (``python -m cProfile -m emulation.passmap --check`` on 0.5.21: 83% in
``set_mla_kv_buffer_kernel``).

A launch is the same as an earlier one when all of these are the same:

- the kernel: its source, and the source or value of every global name it reads (a helper kernel, a constant);
- the grid, as the interpreter resolves it, and every argument, by position and keyword: a scalar or constexpr by
  value, a tensor by dtype, shape, strides, offset and the bytes of its whole storage (the interpreter hands the
  kernel the storage, not the view).

Then the launch's effect is replayed: the bytes it changed in each argument's storage, recorded when it ran. A
launch with an argument of another kind (a tensor descriptor, a tensor off the CPU) is not remembered; a miss runs
the interpreter as before. Nothing outlives the process. ``SGLANG_DCP_DSPARK_TRITON_MEMO=0`` turns it off
(``test/numerics/test_triton_memo.py`` compares both on sglang's own kernel).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from dataclasses import dataclass, field

SWITCH = "SGLANG_DCP_DSPARK_TRITON_MEMO"


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    unremembered: int = 0
    kernels: dict[str, int] = field(default_factory=dict)


STATS = Stats()
_MEMO: dict[str, list[tuple[int, object, object]]] = {}  # key -> (storage ordinal, byte positions, bytes written)
_SOURCES: dict[object, str] = {}
_installed: list = []


class _Unremembered(Exception):
    """An argument the memo cannot key: the launch runs as it would without it."""


def _kernel_source(fn) -> str:
    """The kernel's source and that of each global it reads (helpers, constants), once per kernel."""
    if fn not in _SOURCES:
        parts = [_source_of(fn)]
        code = getattr(fn, "__code__", None)
        names = sorted(set(code.co_names)) if code is not None else []
        for name in names:
            if name in fn.__globals__:
                parts.append(f"{name}={_source_of(fn.__globals__[name])}")
        _SOURCES[fn] = "\n".join(parts)
    return _SOURCES[fn]


def _source_of(value) -> str:
    target = getattr(value, "fn", value)  # a JITFunction holds the Python function it was made from
    if inspect.isfunction(target):
        try:
            return inspect.getsource(target)
        except (OSError, TypeError):
            return f"<{target.__module__}.{target.__qualname__} {target.__code__.co_code.hex()}>"
    if inspect.ismodule(value):
        return f"<module {value.__name__}>"
    return repr(value)


def _storage_bytes(tensor):
    import torch

    flat = torch.empty(0, dtype=torch.uint8)
    flat.set_(tensor.untyped_storage())
    return flat.numpy()


def _key_and_storages(fn, grid, args, kwargs) -> tuple[str, list]:
    """The launch's key, and each distinct storage its tensors lie in, in the order the arguments name them."""
    import torch

    h = hashlib.blake2b(_kernel_source(fn).encode(), digest_size=32)
    h.update(repr(grid).encode())
    ordinal: dict[int, int] = {}
    storages: list = []
    for name, value in [*enumerate(args), *sorted(kwargs.items())]:
        h.update(f"|{name}:".encode())
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise _Unremembered(value.device)
            h.update(repr((value.dtype, tuple(value.shape), value.stride(), value.storage_offset())).encode())
            ptr = value.untyped_storage().data_ptr()
            # Which storage it lies in, by order of first mention: two arguments sharing one storage is an input too.
            seen = ptr in ordinal
            ordinal.setdefault(ptr, len(ordinal))
            h.update(f"storage {ordinal[ptr]}".encode())
            if not seen:
                data = _storage_bytes(value)
                storages.append(data)
                h.update(data)
        elif _by_value(value):
            h.update(repr(value).encode())
        else:
            raise _Unremembered(type(value))
    return h.hexdigest(), storages


def _by_value(value) -> bool:
    """A scalar, a constexpr or a dtype: its repr is all of it."""
    return (value is None or isinstance(value, (bool, int, float, str)) or type(value).__name__ == "dtype"
            or type(value).__module__.startswith("triton"))


def _resolve_grid(grid, args, kwargs, arg_names):
    if callable(grid):
        meta = dict(zip(arg_names, args, strict=False))
        meta.update(kwargs)
        grid = grid(meta)
    return tuple(grid) if isinstance(grid, (list, tuple)) else (grid,)


def install() -> None:
    """Wrap the interpreter's launch (once per process), unless the switch turns the memo off."""
    if _installed or os.environ.get(SWITCH, "1") == "0":
        return
    from triton.runtime import interpreter

    run = interpreter.InterpretedFunction.run

    def remembered_run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        name = getattr(self.fn, "__qualname__", str(self.fn))
        try:
            resolved = _resolve_grid(grid, args, kwargs, self.arg_names)
            key, before = _key_and_storages(self.fn, resolved, args, kwargs)
        except _Unremembered:
            STATS.unremembered += 1
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if key in _MEMO:
            STATS.hits += 1
            for i, positions, written in _MEMO[key]:
                before[i][positions] = written  # a view of the storage itself: the write lands in the tensor
            return None
        STATS.misses += 1
        STATS.kernels[name] = STATS.kernels.get(name, 0) + 1
        copies = [data.copy() for data in before]
        result = run(self, *args, grid=grid, warmup=warmup, **kwargs)
        effect = []
        for i, (old, new) in enumerate(zip(copies, before, strict=True)):
            positions = (old != new).nonzero()[0]
            if len(positions):
                effect.append((i, positions, new[positions].copy()))
        _MEMO[key] = effect
        return result

    interpreter.InterpretedFunction.run = remembered_run
    _installed.append(run)


def uninstall() -> None:
    """Put the interpreter's own launch back and forget every launch (the tests' control)."""
    if _installed:
        from triton.runtime import interpreter

        interpreter.InterpretedFunction.run = _installed.pop()
    _MEMO.clear()
    _SOURCES.clear()
    STATS.__init__()
