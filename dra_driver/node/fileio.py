"""The node's file writes: atomic (and, when asked, durable) replacement, directories created with
exact modes, leftovers of interrupted writes, and OSErrors told as what to do about them.

The checkpoint, the CDI specs and the device metadata files are all written here, so every file
the plugin writes is replaced the same way; the socket directories are made here too, and the lock
files that plugin instances of one node share (:class:`FileLock`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from dra_driver import failpoints


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and, unless ``durable`` is False, durably; the file
    gets exactly ``mode``.

    Atomic: readers see the old file or the new one, whole, also after the writing process is
    killed (the page cache keeps what it wrote). Durable: also after a power loss, which costs two
    fsyncs (the file, then its directory for the rename); without them a power loss may leave
    the old file, no file, or an empty or partial one at ``path``.

    The temporary file is a hidden ``.<name>.tmp-<random>`` in the same directory (CDI runtimes
    ignore it: it does not end in ``.json``). On any error the temporary file is removed and the
    OSError propagates (``errno.ENOSPC`` for a full disk).
    """
    directory = path.parent
    tmp = directory / f"{temp_name_prefix(path)}{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have cleared bits we need (0644 for CDI)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        failpoints.hit("atomic-write.before-rename")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def holds(path: Path, data: bytes, mode: int | None = None) -> bool:
    """Whether ``path`` is a file with exactly ``data`` in it (and ``mode``, when given); a missing
    one is not. Writers skip a file that holds what they would write: it keeps its inode, so a
    running container's bind mount of it stays the file the path names."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size != len(data) or (mode is not None and st.st_mode & 0o7777 != mode):
                return False
            return f.read() == data
    except (FileNotFoundError, IsADirectoryError):
        return False


def temp_name_prefix(path: Path) -> str:
    """How :func:`atomic_write` names its temporary files for ``path`` (prefix, a random tail follows)."""
    return f".{path.name}.tmp-"


def remove_stale_temp_files(directory: Path, matches: Callable[[str], bool]) -> list[str]:
    """Delete temporary files that a process killed inside :func:`atomic_write` left behind.

    ``matches(name)`` says which hidden names are ours: the directory may be shared (``/var/run/cdi``).
    Call it only while nothing else writes these files (start-up, before serving). Returns the
    names removed; errors are ignored (a leftover is harmless, just untidy).
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if name.startswith(".") and ".tmp-" in name and matches(name):
            with contextlib.suppress(OSError):
                os.unlink(directory / name)
                removed.append(name)
    return removed


def ensure_dir(directory: Path, mode: int) -> None:
    """Create ``directory`` (and missing parents); every directory created here gets exactly ``mode``.

    Existing directories are left as they are (they may be shared, like ``/var/run/cdi``).
    """
    if directory.is_dir():
        return
    missing: list[Path] = []
    current = directory
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        os.chmod(path, mode)  # mkdir's mode is filtered by the umask


def restrict_dir(directory: Path, allowed: int) -> bool:
    """Take from an existing directory of the driver's own every permission bit outside ``allowed``.

    The chart's hostPath mount makes the plugin's directory itself (the kubelet creates it 0755), so
    the plugin tightens it at start instead of relying on having created it. Returns whether it
    changed anything; a missing directory is left to be created by :func:`ensure_dir`.
    """
    try:
        mode = stat.S_IMODE(os.lstat(directory).st_mode)
    except FileNotFoundError:
        return False
    if not mode & ~allowed:
        return False
    os.chmod(directory, mode & allowed)
    return True


def describe_os_error(exc: OSError, what: str) -> str:
    if exc.errno == errno.ENOSPC:
        return f"no space left on device while writing {what}: free disk space on the node"
    if exc.errno == errno.EDQUOT:
        return f"disk quota exceeded while writing {what}"
    if exc.errno == errno.EROFS:
        return f"read-only file system while writing {what}"
    return f"writing {what}: {exc.strerror or exc}"


class FileLock:
    """An exclusive ``flock`` on a lock file (0600) that several processes of a node share.

    The kernel drops the lock when its holder exits, SIGKILL included, so a crashed instance never
    leaves it taken. The lock belongs to this object's open file: two objects over one file exclude
    each other even inside one process (which is how tests run two plugin instances).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            ensure_dir(self.path.parent, 0o700)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def acquire(self, *, blocking: bool = True) -> bool:
        """Take the lock; without ``blocking``, False when another holder has it."""
        try:
            fcntl.flock(self._open(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The lock around a block (failpoints ``lock.acquired`` and ``lock.before-release``)."""
        self.acquire()
        try:
            failpoints.hit("lock.acquired")
            yield
            failpoints.hit("lock.before-release")
        finally:
            self.release()

    def close(self) -> None:
        """Release the lock (if held) and close the file."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
