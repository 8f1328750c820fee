"""Stand-ins for the length of a block: an attribute swapped and put back, environment variables, an inert object.

The plugin's probes and preflight answer a few of sglang's questions
differently for the length of one call: the CUDA probes as the emulated node
would, pinned host memory as plain or meta tensors, the cache controller
(which owns CUDA streams) as nothing. These helpers are the one mechanism
for that in the package; no test library is imported at run time.

They assume what holds where they are used: one thread. The plugin's probes
run while ``load_plugins()`` judges the hook table, once per process and
before sglang starts any worker thread; preflight is a process of its own.
A swap seen by another thread mid-block would be a bug.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_MISSING = object()


@contextlib.contextmanager
def attribute(owner, name: str, value) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block, and exactly what it was after (absent again if it was inherited)."""
    own = vars(owner) if hasattr(owner, "__dict__") else {}
    # The raw entry, so a staticmethod or classmethod goes back as the descriptor it was.
    saved = own.get(name, _MISSING)
    if saved is _MISSING and not hasattr(owner, name):
        raise AttributeError(f"{owner!r} has no attribute {name!r} to swap")
    setattr(owner, name, value)
    try:
        yield
    finally:
        if saved is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, saved)


def returning(value):
    """A callable that returns ``value`` whatever it is called with (a probe's answer)."""
    return lambda *args, **kwargs: value


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """These environment variables set inside the block, and each put back (or removed) after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextlib.contextmanager
def environ_restored() -> Iterator[None]:
    """The whole environment put back as it was after the block, whatever the block wrote to it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        if dict(os.environ) != saved:
            os.environ.clear()
            os.environ.update(saved)


class Inert:
    """An object that accepts anything and does nothing: a collaborator that is not under test.

    Every attribute is another ``Inert``, a call returns one, and it is truthy,
    empty and a context manager, so code that only hands it around or calls
    it runs unchanged; code that needs a real answer from it fails loudly.
    """

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Inert()

    def __call__(self, *args, **kwargs):
        return Inert()

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def __contains__(self, item) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __repr__(self) -> str:
        return "<inert stand-in>"
