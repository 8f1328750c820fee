"""What one layer's verify attention costs a GPU, counted on CPU while sglang's own code runs it: kernel launches,
passes over a tensor the size of the attention output, and which plans a step makes.

The unit is the GPU's, not the host's. In a verify step each layer pays for every kernel it launches (a few µs of
host time eager, and a node of GPU time in a CUDA graph) and for every full pass over its ``[tokens, heads,
kv_lora_rank]`` output (at batch 64 x 7 draft tokens x 128 heads, 59 MB a pass). So, inside :func:`counting`:

- every torch op that runs a kernel on a GPU is one launch: what dispatches to an aten op other than the ones that
  only make a view, allocate without writing, or read metadata (:data:`NO_KERNEL`);
- every Triton kernel launched (sglang's KV write, the id builder, the merge) is one launch, however many programs
  its grid has; the Triton interpreter's own torch work inside it is not counted;
- every ``run`` of the MLA wrapper (flashinfer's kernel, here the oracle) is one launch; the oracle's torch work
  inside it is not counted;
- a function that is one kernel on a GPU and a torch fallback on CPU is one launch (:data:`ONE_KERNEL`): sglang's
  MLA KV write runs ``set_mla_kv_buffer_naive``, 6 to 10 torch ops, where no Triton is, and one Triton or JIT
  kernel on a GPU, DCP stripe included;
- a launch is also a full pass where it writes, or reads, a tensor of at least the output's element count that is
  not the KV pool (the pool is read by the attention kernel in every design, and written only at the step's rows).

And each ``plan()`` of an MLA wrapper is recorded as ``full`` (flashinfer's Python ``plan()``: validation, snapshots
of bound buffers, workspace allocation) or ``fast`` (its native scheduler alone, ``_cached_module.plan``, as
sglang's graph replays call it).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field

# aten ops that launch no kernel on a GPU: views and reshapes, allocation without a write, metadata reads.
NO_KERNEL = frozenset({
    "view", "_unsafe_view", "reshape", "slice", "select", "as_strided", "t", "transpose", "permute", "expand",
    "unsqueeze", "squeeze", "detach", "alias", "lift_fresh", "empty", "empty_like", "new_empty", "empty_strided",
    "new_empty_strided", "split", "split_with_sizes", "chunk", "unbind", "narrow", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_same_size", "_local_scalar_dense", "size", "stride", "dim", "numel",
    "item", "_has_compatible_shallow_copy_type", "is_nonzero", "contiguous", "resolve_conj", "resolve_neg",
    "_reshape_alias", "view_as",
})


# (module, function): one kernel on a GPU, a torch fallback on CPU.
ONE_KERNEL = (("sglang.kernels.ops.kvcache.mla_buffer", "set_mla_kv_buffer_naive"),)


@dataclass
class Count:
    launches: list = field(default_factory=list)  # (kind, name, full pass)
    plans: list = field(default_factory=list)  # "full" or "fast"

    @property
    def n_launches(self) -> int:
        return len(self.launches)

    @property
    def full_passes(self) -> int:
        return sum(1 for _, _, full in self.launches if full)

    def names(self) -> list[str]:
        return [f"{kind}:{name}{'*' if full else ''}" for kind, name, full in self.launches]


class _State(threading.local):
    count: Count | None = None
    full_numel: int = 0
    pools: tuple = ()
    inside: int = 0  # > 0 inside a kernel counted whole (a wrapper run, a Triton launch)


_STATE = _State()


def _is_full(tensors) -> bool:
    for t in tensors:
        if t.numel() < _STATE.full_numel:
            continue
        storage = t.untyped_storage().data_ptr()
        if any(storage == pool for pool in _STATE.pools):
            continue
        return True
    return False


def _tensors(values):
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _record(kind: str, name: str, tensors) -> None:
    if _STATE.count is not None and _STATE.inside == 0:
        _STATE.count.launches.append((kind, name, _is_full(list(tensors))))


@contextlib.contextmanager
def _whole(kind: str, name: str, tensors):
    """A kernel counted once: what runs inside it is its own business."""
    _record(kind, name, tensors)
    _STATE.inside += 1
    try:
        yield
    finally:
        _STATE.inside -= 1


def _mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Launches(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if _STATE.inside == 0 and name not in NO_KERNEL and not name.startswith("_assert"):
                # copy_ between two views of one storage with the same offset is no copy (a plan handing a
                # wrapper its own bound buffer); torch still dispatches it.
                if name == "copy_" and args[0].data_ptr() == args[1].data_ptr():
                    return result
                _record("torch", name, _tensors([args, kwargs, result]))
            return result

    return Launches


@contextlib.contextmanager
def counting(*, full_numel: int, pools=(), wrapper_classes=()):
    """Count what runs inside, on this thread. ``full_numel``: the output's element count; ``pools``: tensors
    whose storage is the KV pool; ``wrapper_classes``: the MLA wrapper classes whose ``run`` and ``plan`` are
    counted (and whose ``_cached_module.plan``, the fast plan, is found on their instances)."""
    from triton.runtime import interpreter

    count = Count()
    patched = []

    def patch(owner, name, make):
        real = getattr(owner, name)
        patched.append((owner, name, real))
        setattr(owner, name, make(real))

    def launch(real):
        def run(self, *args, **kwargs):
            with _whole("triton", getattr(self.fn, "__name__", "kernel"), _tensors([args, kwargs])):
                return real(self, *args, **kwargs)
        return run

    def wrapper_run(real):
        def run(self, *args, **kwargs):
            with _whole("mla", "run", _tensors([args, kwargs])):
                return real(self, *args, **kwargs)
        return run

    def wrapper_plan(real):
        def plan(self, *args, **kwargs):
            with planning("full"):
                return real(self, *args, **kwargs)
        return plan

    def one_kernel(real):
        def run(*args, **kwargs):
            with _whole("kernel", real.__name__, _tensors([args, kwargs])):
                return real(*args, **kwargs)
        return run

    patch(interpreter.InterpretedFunction, "run", launch)
    for module_name, attr in ONE_KERNEL:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, attr):
            patch(module, attr, one_kernel)
    for cls in wrapper_classes:
        patch(cls, "run", wrapper_run)
        patch(cls, "plan", wrapper_plan)
    saved = (_STATE.count, _STATE.full_numel, _STATE.pools)
    _STATE.count, _STATE.full_numel = count, int(full_numel)
    _STATE.pools = tuple(p.untyped_storage().data_ptr() for p in pools)
    try:
        with _mode_class()():
            yield count
    finally:
        _STATE.count, _STATE.full_numel, _STATE.pools = saved
        for owner, name, real in reversed(patched):
            setattr(owner, name, real)


@contextlib.contextmanager
def planning(kind: str):
    """A wrapper's plan, ``full`` or ``fast``: recorded, and its own work not counted as launches (a plan's
    copies to the device are the step's, not the layer's)."""
    if _STATE.count is not None and _STATE.inside == 0:
        _STATE.count.plans.append(kind)
    _STATE.inside += 1
    try:
        yield
    finally:
        _STATE.inside -= 1
