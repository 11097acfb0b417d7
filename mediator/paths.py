"""Confined paths: every filesystem path built from request data goes through here.

Issue 11 §1 (docs/security.md, "Paths"): a ``run_id`` of ``..`` once made the record folder the
records root's parent, and the record routes served the tokens file beside it. The rules:

* a path is built only from *parts* that are plain names — letters, digits, ``.``, ``_``, ``-``,
  never empty, never starting with ``.`` (so never ``.``, ``..`` or a hidden file), never a
  separator, NUL or anything a percent- or Unicode-spelling could turn into one;
* the joined path is resolved and must stay inside its root (:func:`confined`) — or, for the
  descriptor helpers below, is never joined at all: plain names under a no-symlink walk cannot
  leave it;
* files are opened by walking from the root one part at a time with ``O_NOFOLLOW`` (and
  ``O_DIRECTORY`` for folders), so a symlink anywhere on the way — planted before or swapped in
  between a check and the open — is refused, not followed; reads also use ``O_NONBLOCK`` and
  serve regular files only, so a planted FIFO or device cannot hang a thread.

The descriptor helpers (``open_folder`` and the ``*_at`` functions) are what a record's open and
seal use: the folder is reached once by the no-symlink walk and every file is then created, read,
linked or renamed relative to its descriptor, so no path is resolved again (issue 13: the
``resolve()`` of :func:`confined` cost more than the writes themselves).

Pure standard library; ``records`` is the user (``mediator/tickets`` confines its own paths).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

from mediator.core.errors import ContractError

PART: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: a FIFO planted in a record must not hang the thread that opens it.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
# What opening a name with O_NOFOLLOW (and O_DIRECTORY) says when something other than a plain
# file (folder) is there: a symlink, a file where a folder belongs, a socket.
_NOT_PLAIN: Final = frozenset({errno.ELOOP, errno.ENOTDIR, errno.ENXIO})
STAGED: Final = ".staging-"
_STAGED_NAME: Final = re.compile(r"\.staging-[0-9a-f]{16}")


class UnsafePath(ContractError):
    """A path part that is not a plain name, or a path that leaves its root. HTTP 400."""

    code = "unsafe_path"


def safe_part(part: object) -> bool:
    """Whether ``part`` may be one component of a path under a root."""
    return isinstance(part, str) and PART.fullmatch(part) is not None


def check_part(part: object, field: str) -> str:
    """``part`` itself if it is a plain name, else :class:`UnsafePath` naming ``field``."""
    if not safe_part(part):
        raise UnsafePath(
            f"{field} must be a plain name: letters, digits, '.', '_' or '-', not starting "
            "with '.'.",
            field=field,
        )
    return str(part)


def confined(root: Path, *parts: str, field: str = "path") -> Path:
    """``root/parts…`` after checking every part and that the resolved result stays in ``root``.

    ``root`` should already be resolved (``Records`` resolves its root once). The unresolved join
    is returned: opening it still goes through :func:`read_bytes` / :func:`write_exclusive`,
    which refuse symlinks on the way.
    """
    for part in parts:
        check_part(part, field)
    path = root.joinpath(*parts)
    real = path.resolve(strict=False)
    base = root.resolve(strict=False)
    if real != base and base not in real.parents:
        raise UnsafePath(f"{field} leads outside its folder.", field=field)
    return path


@contextmanager
def _walk(root: Path, folders: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of ``root/folders…``, reached without following any symlink."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in folders:
            check_part(part, "path")
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def read_bytes(root: Path, *parts: str) -> bytes | None:
    """The bytes of the regular file ``root/parts…``; None if it is absent, not a regular file,
    or reached through a symlink."""
    if not parts or not all(safe_part(p) for p in parts):
        return None
    try:
        with _walk(root, parts[:-1]) as dir_fd:
            # O_NONBLOCK: a FIFO planted in a record must not hang the reading thread.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(parts[-1], flags, dir_fd=dir_fd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)
    except OSError:  # ENOENT, ENOTDIR, ELOOP (a symlink), EACCES
        return None


def write_exclusive(
    root: Path, *parts: str, data: bytes, mode: int = 0o644, sync: bool = True
) -> bool:
    """Create ``root/parts…`` with ``data`` unless it exists; True if this call created it.

    ``O_EXCL`` never follows a symlink at the last part, and the folders on the way are walked
    with ``O_NOFOLLOW``. ``sync=False`` skips the fsync: for a file whose durability a later
    step guarantees (a record's ``contract.json``, checked and synced at seal, docs/design.md
    §12).
    """
    with _walk(root, parts[:-1]) as dir_fd:
        return write_new_at(dir_fd, check_part(parts[-1], "path"), data, mode=mode, sync=sync)


def make_dir(root: Path, *parts: str) -> Path:
    """``mkdir -p`` under ``root`` that refuses to pass through or end on a symlink."""
    path = confined(root, *parts)
    for i in range(1, len(parts) + 1):
        step = root.joinpath(*parts[:i])
        try:
            os.mkdir(step, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(step).st_mode):
                raise UnsafePath("A record folder is not a plain folder.", field="path") from None
    return path


def files_under(folder: Path, *, links: bool = False) -> list[str]:
    """Relative names of the regular files under ``folder``, hidden names (staging folders)
    left out and no symlink followed — what a record route may show. With ``links``, symlinks
    are listed too (by their own name), so ``records verify`` reports a planted one."""
    found = []
    for here, dirs, files in os.walk(folder, followlinks=False):
        linked = [d for d in dirs if os.path.islink(os.path.join(here, d))]
        dirs[:] = [d for d in dirs if safe_part(d) and d not in linked]
        for name in [*files, *linked]:
            full = os.path.join(here, name)
            mode = os.lstat(full).st_mode
            if safe_part(name) and (stat.S_ISREG(mode) or (links and stat.S_ISLNK(mode))):
                found.append(os.path.relpath(full, folder))
    return sorted(found)


# ---- descriptor helpers: a folder reached once, its files handled relative to it (issue 13) ----


def open_folder(
    root: str | os.PathLike[str], *parts: str, create: bool = False, field: str = "path"
) -> int:
    """A descriptor of the folder ``root/parts…``, reached from ``root`` one part at a time
    without following any symlink, each part made first if missing (with ``create``); the
    caller closes it.

    :class:`UnsafePath` (naming ``field``) for a part that is not a plain name, or that is there
    as anything but a plain folder — a symlink, a file, a FIFO is refused, never followed. Only
    plain names under an ``O_NOFOLLOW`` walk: nothing can lead outside ``root``, so no path is
    resolved (what :func:`confined` checks is true by construction).
    """
    for part in parts:
        check_part(part, field)
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            nxt = folder_at(fd, part, create=create)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def folder_at(dir_fd: int, name: str, *, create: bool = False) -> int:
    """A descriptor of the folder ``name`` in ``dir_fd`` (made first if missing, with
    ``create``); :class:`UnsafePath` if something other than a plain folder is there."""
    check_part(name, "path")
    if create:
        # made already — or something else is there, which the open below refuses
        with suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in _NOT_PLAIN:
            raise UnsafePath("A record folder is not a plain folder.", field="path") from None
        raise


def _name(name: str) -> str:
    """``name`` itself if it is a plain name or a staged file's (:func:`stage_at`): what the
    ``*_at`` helpers accept, so no separator or ``..`` ever reaches an ``openat``."""
    if PART.fullmatch(name) is None and _STAGED_NAME.fullmatch(name) is None:
        raise UnsafePath("A record file name must be a plain name.", field="path")
    return name


def exists_at(dir_fd: int, name: str) -> bool:
    """Whether anything — a symlink included, never followed — is called ``name`` in
    ``dir_fd``."""
    _name(name)
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_new_at(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int = 0o644,
    sync: bool = True,
    read_only: bool = False,
) -> bool:
    """Create ``name`` in ``dir_fd`` with ``data`` unless anything is called that already; True
    if this call created it. ``O_EXCL`` never follows a symlink at ``name``. ``read_only``
    makes it ``0444`` through the descriptor before the fsync, so the mode is as durable as the
    bytes."""
    try:
        fd = os.open(_name(name), _NEW_FLAGS, mode, dir_fd=dir_fd)
    except FileExistsError:
        return False
    try:
        _write_all(fd, data)
        if read_only:
            os.fchmod(fd, 0o444)
        if sync:
            os.fsync(fd)
    except BaseException:
        # A full disk (ENOSPC, EFBIG) or any failure half way: the name is ours (O_EXCL) and
        # holds a torn file, so it goes — a staged file would otherwise stay for ever, a
        # record file would be a torn one (issue 25 §10).
        with suppress(OSError):
            os.unlink(_name(name), dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)
    return True


def stage_at(dir_fd: int, data: bytes, *, read_only: bool = False) -> str:
    """Write ``data`` to a new hidden file in ``dir_fd`` and fsync it; returns its name.

    The name is ``.staging-`` and 16 random hex digits, created with ``O_EXCL``: no other
    writer — thread or process — can have it, so concurrent stagers never touch each other's
    files (issue 11 §7). Hidden names are not record files: :func:`files_under` leaves them
    out and :func:`safe_part` refuses them, so nothing serves or verifies a staged file.
    Publish it with :func:`link_at` or :func:`replace_at`; remove it with :func:`discard_at`.
    """
    while True:
        name = STAGED + os.urandom(8).hex()
        if write_new_at(dir_fd, name, data, read_only=read_only):
            return name


def sweep_staged(root: str, older_than_s: float) -> int:
    """Remove the staged files (``.staging-`` and 16 hex digits) under ``root/<run>/`` and
    ``root/<run>/steps/`` last changed more than ``older_than_s`` seconds ago: what a seal
    killed half way (a crash, a full disk) left behind (issue 25 §10). A younger one may be a
    concurrent sealer's (another process sharing the root) and stays. Only regular files with
    exactly that name are removed; nothing is followed. Returns how many were removed."""
    limit = time.time() - older_than_s
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
    try:
        top = os.open(root, flags)
    except OSError:
        return 0
    removed = 0
    try:
        for name in _entries(top):
            if PART.fullmatch(name) is None:
                continue
            try:
                run = os.open(name, flags, dir_fd=top)  # a symlink or a file here: skipped
            except OSError:
                continue
            try:
                removed += _sweep_folder(run, limit)
                try:
                    steps = os.open("steps", flags, dir_fd=run)
                except OSError:
                    continue
                try:
                    removed += _sweep_folder(steps, limit)
                finally:
                    os.close(steps)
            finally:
                os.close(run)
    finally:
        os.close(top)
    return removed


def _entries(dir_fd: int) -> list[str]:
    try:
        with os.scandir(dir_fd) as it:
            return [e.name for e in it]
    except OSError:
        return []


def _sweep_folder(dir_fd: int, limit: float) -> int:
    removed = 0
    for name in _entries(dir_fd):
        if _STAGED_NAME.fullmatch(name) is None:
            continue
        with suppress(OSError):
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mtime < limit:
                os.unlink(name, dir_fd=dir_fd)
                removed += 1
    return removed


def link_at(dir_fd: int, staged: str, name: str) -> bool:
    """Publish the staged file ``staged`` as ``name`` (both in ``dir_fd``) unless something is
    called ``name`` already. True means ``name`` is now the staged file itself, for good.

    A hard link never replaces its destination (``EEXIST``, a symlink there included), so of
    concurrent publishers exactly one wins and nobody's file is swapped away afterwards: the
    winner knows the bytes behind ``name`` without reading them back. On a file system without
    hard links the staged file is renamed in when ``name`` is absent — a check-then-rename
    another publisher may overtake — and False is returned, so the caller reads back what is
    there.
    """
    try:
        os.link(
            _name(staged), _name(name), src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False
        )
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if not exists_at(dir_fd, name):
            os.replace(staged, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return False
    return True


def replace_at(dir_fd: int, staged: str, name: str) -> None:
    """Rename the staged file over ``name`` (a repair: what is there is known bad). A rename
    replaces the name itself and never follows a symlink at the destination."""
    os.replace(_name(staged), _name(name), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def discard_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` from ``dir_fd`` if it is still there (a staged file after publishing)."""
    with suppress(FileNotFoundError):
        os.unlink(_name(name), dir_fd=dir_fd)


def read_at(dir_fd: int, name: str, *, freeze: bool = False) -> bytes | None:
    """The bytes of the regular file ``name`` in ``dir_fd``; None if nothing is called that.

    Anything else there — a symlink, a FIFO, a folder, a device — is :class:`UnsafePath`:
    refused without following it and before anything is synced. ``freeze`` then makes the file
    ``0444`` and fsyncs it through the same descriptor: what a seal does to a file it covers
    but did not write itself.
    """
    try:
        fd = os.open(_name(name), _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in _NOT_PLAIN:
            raise UnsafePath(f"The record file {name} is not a plain file.", field="path") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"The record file {name} is not a plain file.", field="path")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        if freeze:
            os.fchmod(fd, 0o444)
            os.fsync(fd)
        return b"".join(chunks)
    finally:
        os.close(fd)
