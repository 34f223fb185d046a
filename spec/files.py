"""Reading a file a user names: only a regular file, never a FIFO, device or folder (#46 item 6).

``open`` on a FIFO blocks until a writer comes, so ``jobctl validate fifo`` hung for good,
and a character device such as ``/dev/zero`` never ends. ``read_regular`` opens without
blocking, checks the opened file's own type (no window between a check and the open)
and refuses anything but a regular file with an ``OSError`` naming the path and what it is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFSOCK: "a socket",
}


class NotARegularFile(OSError):
    """The path names something other than a regular file."""

    fix = "give the path of a regular file (not a pipe, device or folder)"

    def __str__(self) -> str:
        return f"{self.filename} is {self.strerror}, not a regular file"


def special(path: str | Path, folder_ok: bool = False) -> str | None:
    """What the existing ``path`` is when no reader may open it, 'a FIFO (named pipe)',
    a device, a socket (or a folder unless ``folder_ok``); None for a regular file. It
    stats and never opens: for a check before a reader that opens the path itself."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return None
    return KINDS.get(stat.S_IFMT(mode), "a special file")


def read_regular(path: str | Path) -> bytes:
    """The bytes of the regular file at ``path``; ``NotARegularFile`` for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = KINDS.get(stat.S_IFMT(mode), "a special file")
            raise NotARegularFile(errno.EINVAL, what, str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1  # the file object owns and closes it
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def read_regular_text(path: str | Path) -> str:
    """``read_regular`` decoded as UTF-8 (``UnicodeDecodeError`` on bad bytes)."""
    return read_regular(path).decode("utf-8")
