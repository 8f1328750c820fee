"""The meta device: sglang's own pool classes at full geometry that allocate nothing.

The one place that sends sglang's tensors to "meta" (:func:`on_meta_mode`,
:func:`unallocated_host_buffers`) and the one switch that turns it off for
the reduced-scale cross-checks, which build the same pools with real CPU
buffers and compare (:func:`real_buffers`, :func:`on_meta`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from types import SimpleNamespace

from . import swap

# Off by default: full-size pools on the meta device.
_real_buffers: contextvars.ContextVar[bool] = contextvars.ContextVar("dcp_dspark_real_buffers", default=False)


@contextlib.contextmanager
def real_buffers() -> Iterator[None]:
    """Build with real CPU tensors instead of the meta device (small geometries only)."""
    token = _real_buffers.set(True)
    try:
        yield
    finally:
        _real_buffers.reset(token)


def on_meta() -> bool:
    return not _real_buffers.get()


# Tensor constructors that sglang's pool classes call. Under _OnMeta they all
# build meta tensors, whatever device sglang names.
_CONSTRUCTORS = ("empty", "zeros", "ones", "full", "arange", "tensor", "empty_strided", "empty_like", "zeros_like",
                 "ones_like", "full_like")


def on_meta_mode():
    """A torch function mode that puts every tensor built under it on the meta device.

    sglang's host pools size their bookkeeping by the slots they address:
    ``HostKVCache.clear()`` builds the free-slot list (``arange(logical_size)``),
    ``mem_state`` and ``slot_used`` for real on the CPU, about 10 bytes per
    logical slot, i.e. gigabytes for a full-size DCP launch. None of those
    tensors' values feeds a size (rows, ``logical_size``, ``size_per_token``
    are plain ints, the buffer's bytes are its shape), so building them on
    meta leaves every figure exactly as sglang computes it. A mode rather than
    a replacement ``clear()`` so that whatever per-slot tensor the installed
    sglang's constructors build, in ``clear()`` or elsewhere, follows without
    a copy of sglang's code here; ``test_sizing`` checks that no real tensor
    bigger than a few bytes is built and that the figures match real CPU pools.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    constructors = {getattr(torch, name) for name in _CONSTRUCTORS}

    class _OnMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in constructors:
                kwargs["device"] = "meta"
                kwargs.pop("pin_memory", None)
            return func(*args, **kwargs)

    return _OnMeta()


@contextlib.contextmanager
def unallocated_host_buffers() -> Iterator[None]:
    """Host pools at full geometry that allocate nothing: no memory, no pinning, no free-RAM check.

    The KV buffers come from sglang's mmap allocator, which no torch mode sees,
    so it is answered with a meta tensor directly; every other tensor the pools
    build goes to meta through :func:`on_meta_mode`. sglang checks free RAM
    against the pool inside the constructor; preflight sets the bytes against
    the target node's RAM itself, so that check is answered with "plenty" here.
    """
    import torch
    from sglang.srt.mem_cache.pool_host import base, common

    plenty = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(available=1 << 62))
    with swap.attribute(common, "alloc_mmap", lambda dims, dtype: torch.empty(dims, dtype=dtype, device="meta")), \
            swap.attribute(common, "_cuda_host_register", lambda buffer: None), \
            swap.attribute(base, "psutil", plenty), on_meta_mode():
        yield
