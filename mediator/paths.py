"""Confined paths: every filesystem path built from request data goes through here.

Issue 11 §1 (docs/security.md, "Paths"): a ``run_id`` of ``..`` once made the record folder the
records root's parent, and the record routes served the tokens file beside it. The rules:

* a path is built only from *parts* that are plain names — letters, digits, ``.``, ``_``, ``-``,
  never empty, never starting with ``.`` (so never ``.``, ``..`` or a hidden file), never a
  separator, NUL or anything a percent- or Unicode-spelling could turn into one;
* the joined path is resolved and must stay inside its root;
* files are opened by walking from the root one part at a time with ``O_NOFOLLOW`` (and
  ``O_DIRECTORY`` for folders), so a symlink anywhere on the way — planted before or swapped in
  between a check and the open — is refused, not followed; reads also use ``O_NONBLOCK`` and
  serve regular files only, so a planted FIFO or device cannot hang a thread.

Pure standard library; ``records`` is the user (``mediator/tickets`` confines its own paths).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from mediator.errors import ContractError

PART: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


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
        check_part(parts[-1], "path")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(parts[-1], flags, mode, dir_fd=dir_fd)
        except FileExistsError:
            return False
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    return True


def move_in(source: Path, root: Path, *parts: str) -> bool:
    """Rename ``source`` to ``root/parts…`` unless something is there already; True if moved.

    The destination folder is reached by the no-symlink walk and the rename is made relative to
    its descriptor, so a folder swapped for a link in between cannot redirect it.
    """
    with _walk(root, parts[:-1]) as dir_fd:
        name = check_part(parts[-1], "path")
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.replace(source, name, dst_dir_fd=dir_fd)
            return True
    return False


def replace_file(source: Path, root: Path, *parts: str) -> None:
    """Rename ``source`` over ``root/parts…`` (a repair: the file there is known bad).

    A rename replaces the name itself and never follows a symlink at the destination; the
    folders on the way are walked with ``O_NOFOLLOW``.
    """
    with _walk(root, parts[:-1]) as dir_fd:
        os.replace(source, check_part(parts[-1], "path"), dst_dir_fd=dir_fd)


def sync(root: Path, *parts: str) -> None:
    """fsync the file or folder ``root/parts…`` (no part may be a symlink): what a seal does
    to every file of the record and to its folders before ``seal.json`` exists."""
    with _walk(root, parts[:-1] if parts else ()) as dir_fd:
        if not parts:
            os.fsync(dir_fd)
            return
        fd = os.open(
            check_part(parts[-1], "path"),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
            dir_fd=dir_fd,
        )
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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


def make_read_only(root: Path, *parts: str) -> None:
    """``chmod 0444`` without following a symlink (Linux has no ``lchmod``: open, then fchmod)."""
    with _walk(root, parts[:-1]) as dir_fd:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)


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
