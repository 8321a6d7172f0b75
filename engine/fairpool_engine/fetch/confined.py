"""The cache's entries, reached without following a link out of it.

The model cache may be written by others: a ReadWriteMany claim is mounted by every pod of
the pool, and by whatever else mounts the claim. fetch-model runs there with the source's
credentials and reads, writes, renames and deletes, so an entry someone replaced by a
symbolic link must not carry any of that outside the cache. The cache's root is trusted (it
is the mount the operator or `fairpool up` chose); nothing below it is.

`CacheDirectory` holds a directory open and reaches what is below it one name at a time,
relative to that descriptor and with O_NOFOLLOW, so a name swapped for a link between a
check and its use is refused, not followed: a rename or an unlink always acts on the
directory that was checked, which was reached from the root without crossing a link.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from fairpool_engine.fetch import FetchError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW


def planted(path: Path, detail: str = "") -> FetchError:
    """The failure for a link in the cache that fetch-model did not make (`detail` says
    where it leads): it names the link, so that whoever runs the cache can remove it and
    find what wrote it."""
    return FetchError(
        "FetchFailed",
        f"{path} is a symbolic link{detail} that fetch-model did not make, in a cache others "
        "can write: it is not followed; remove it, and find what made it",
    )


class CacheDirectory:
    """A directory of the cache, held open; everything below it is reached through it."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path  # for messages only: the descriptor is what is used

    @classmethod
    def root(cls, path: Path) -> CacheDirectory:
        """The cache's root: the one place a link is followed (the root is configured,
        not written by others)."""
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def __enter__(self) -> CacheDirectory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.close(self.fd)

    def subdirectory(self, relative: PurePosixPath, create: bool = True) -> CacheDirectory:
        """The real directory `relative` below this one (made where missing, with
        `create`), each step refusing a link."""
        below = CacheDirectory(os.open(".", _DIRECTORY, dir_fd=self.fd), self.path)
        for name in relative.parts:
            parent = below
            with parent:  # closed once the step below it is open
                if create:
                    parent._make_directory(name)
                below = CacheDirectory(parent._open(name, _DIRECTORY), parent.path / name)
        return below

    def _make_directory(self, name: str) -> None:
        with suppress(FileExistsError):
            os.mkdir(name, dir_fd=self.fd)  # never follows: a link there is EEXIST

    def _open(self, name: str, flags: int, mode: int = 0o666) -> int:
        """`name` opened here, not through a link (the umask applies to `mode`, as with
        `open`)."""
        try:
            return os.open(name, flags | _NOFOLLOW, mode, dir_fd=self.fd)
        except OSError as error:
            # O_NOFOLLOW says ELOOP for a link, or ENOTDIR with O_DIRECTORY
            if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
                self.entry(name)  # raises when it is a link
            raise

    def entry(self, name: str) -> os.stat_result | None:
        """What `name` is (None: nothing), refusing a link."""
        try:
            status = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(status.st_mode):
            raise planted(self.path / name)
        return status

    def read(self, name: str) -> bytes | None:
        """The content of the regular file `name` (None: there is none)."""
        try:
            fd = self._open(name, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO does not block
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return file.read()

    def write(self, name: str, fill: Callable[[BinaryIO], None]) -> None:
        """Makes `name` the file `fill` writes, whole or not at all: into a new
        `name.partial` (created here, so never through a link), then renamed over `name`
        (a rename replaces a link; it does not follow one)."""
        partial = name + ".partial"
        self.remove(partial)  # an interrupted fetch's
        with os.fdopen(self._open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as file:
            fill(file)
        os.replace(partial, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Removes the file `name` if it is there (a link there is refused)."""
        if self.entry(name) is not None:
            os.unlink(name, dir_fd=self.fd)

    def names(self) -> Iterator[tuple[str, bool]]:
        """Each entry's name and whether it is a directory, refusing a link."""
        with os.scandir(self.fd) as entries:
            listed = [
                (entry.name, entry.is_symlink(), entry.is_dir(follow_symlinks=False))
                for entry in entries
            ]
        for name, is_link, is_directory in listed:
            if is_link:
                raise planted(self.path / name)
            yield name, is_directory

    @contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Holds an exclusive flock on the file `name` (made if missing, never through a
        link): the lock filelock's FileLock takes on the same file, so fetches by older
        versions wait for this one too."""
        fd = self._open(name, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock
