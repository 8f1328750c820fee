"""Make a child process's file operations on one tree send it a real signal at the Nth one.

test_faults.py forks and calls ``install`` in the child; by hand::

    python test/fault_child.py ROOT SIGNAL N LOG [--no-hardlinks] -- CLI ARGS...

Every open, write, fsync, chmod/chown, rename, replace, link, unlink, mkdir and
rmdir whose path (or fd, or dir_fd) lies inside ROOT is an operation; each is
logged to LOG as "index name path" before it runs. At operation N (1-based)
the process signals itself (KILL, INT or TERM) before carrying it out; N = 0
only logs. --no-hardlinks makes os.link fail with EXDEV, as across
filesystems, to drive the copy path. Only this child is patched: the
package's own code runs unchanged.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
import sys


class _Faults:
    def __init__(self, root: str, signum: int, nth: int, log_path: str, no_hardlinks: bool) -> None:
        self.root = os.path.realpath(root)
        self.signum = signum
        self.nth = nth
        self.no_hardlinks = no_hardlinks
        # Held for the life of the process, which the injected signal ends: no with block can hold it.
        self.log = open(log_path, "w", buffering=1)  # noqa: SIM115
        self.count = 0

    def where(self, arg, dir_fd=None) -> str | None:
        if isinstance(arg, int):
            try:
                return os.readlink(f"/proc/self/fd/{arg}")
            except OSError:
                return None
        if isinstance(arg, (str, bytes, os.PathLike)):
            path = os.fsdecode(arg)
            if not os.path.isabs(path) and dir_fd is not None:
                base = self.where(dir_fd)
                path = os.path.join(base, path) if base else path
            return os.path.abspath(path)
        return None

    def point(self, name: str, *paths) -> None:
        hit = next((p for p in paths if p is not None and (p == self.root or p.startswith(self.root + os.sep))), None)
        if hit is None:
            return
        self.count += 1
        self.log.write(f"{self.count} {name} {os.path.relpath(hit, self.root)}\n")
        if self.count == self.nth:
            os.kill(os.getpid(), self.signum)


def install(root: str, signum: int, nth: int, log_path: str, *, no_hardlinks: bool = False) -> None:
    """Patch this process's file primitives (only ever call it in the child)."""
    faults = _Faults(root, signum, nth, log_path, no_hardlinks)

    def path_op(name: str, nargs: int) -> None:
        real = getattr(os, name)

        def wrapper(*args, **kwargs):
            dir_fd = kwargs.get("dir_fd") or kwargs.get("src_dir_fd")
            faults.point(name, *[faults.where(a, dir_fd) for a in args[:nargs]])
            return real(*args, **kwargs)

        setattr(os, name, wrapper)

    def fd_op(name: str) -> None:
        real = getattr(os, name)

        def wrapper(fd, *args, **kwargs):
            faults.point(name, faults.where(fd))
            return real(fd, *args, **kwargs)

        setattr(os, name, wrapper)

    for name, nargs in [("replace", 2), ("rename", 2), ("unlink", 1), ("rmdir", 1), ("mkdir", 1), ("open", 1)]:
        path_op(name, nargs)
    for name in ("write", "fsync", "fchmod", "fchown"):
        fd_op(name)

    real_link = os.link

    def link(src, dst, *args, **kwargs):
        faults.point("link", faults.where(dst), faults.where(src))
        if faults.no_hardlinks:
            raise OSError(errno.EXDEV, "Invalid cross-device link", dst)
        return real_link(src, dst, *args, **kwargs)

    os.link = link
    real_open = io.open

    def open_(file, *args, **kwargs):
        if not isinstance(file, int):
            faults.point("open", faults.where(file))
        return real_open(file, *args, **kwargs)

    io.open = builtins.open = open_


if __name__ == "__main__":
    root_arg, signame, nth, log_path, *rest = sys.argv[1:]
    install(root_arg, getattr(signal, f"SIG{signame}"), int(nth), log_path, no_hardlinks="--no-hardlinks" in rest)
    from sglang_dcp_dspark.__main__ import main

    sys.exit(main(rest[rest.index("--") + 1 :]))
