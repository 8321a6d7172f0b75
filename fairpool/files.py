"""Has this file changed? A file's version from `stat`, without reading the file.

A version is (inode, size, modification time in nanoseconds), read through symbolic links:
Kubernetes mounts a ConfigMap or Secret as links into a `..data` folder and swaps that link
to a new folder when the object changes, so the inode behind the path changes even when size
and time happen to match; an editor that saves by renaming a new file over the old one
changes it too. A file that cannot be seen (missing, no permission) has the version None, so
its disappearance and its return are changes as well.

Used by everything that follows a file while it runs: the gateway's configuration, the
gateway's worker files, the engine's scheduler configuration and local mode's manifests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileVersion:
    """What tells two versions of a file apart without reading it."""

    inode: int
    size: int
    mtime_ns: int


def file_version(path: str | os.PathLike[str]) -> FileVersion | None:
    """The version of the file at `path` (links followed), or None when it cannot be seen."""
    try:
        status = os.stat(path)  # follows links: a ConfigMap's ..data swap is a new inode
    except OSError:
        return None
    return FileVersion(status.st_ino, status.st_size, status.st_mtime_ns)


class FileWatch:
    """Files followed for changes: `changed()` is True once after any of them changed.

    The versions are taken when the watch is made, so the first `changed()` compares with
    the files as they were then.
    """

    def __init__(self, *paths: str | os.PathLike[str]) -> None:
        self.paths = tuple(Path(path) for path in paths)
        self.versions = self._current()

    def changed(self) -> bool:
        """Whether any file's version differs from the last look; remembers the new ones."""
        current = self._current()
        if current == self.versions:
            return False
        self.versions = current
        return True

    def _current(self) -> tuple[FileVersion | None, ...]:
        return tuple(file_version(path) for path in self.paths)
