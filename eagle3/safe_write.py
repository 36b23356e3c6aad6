"""Every write into a dir the project owns (a run dir, a dataset dir it builds, a cache entry) goes through here,
and none follows a symlink there: a link at the file's name, or at any dir between the owned dir (`base`) and the
file, is refused with one message naming it, before anything is written; the link and what it points to are left
as they are. A link is what an existence check follows (a dangling one looks absent, a live one looks like the
file it points to), so a writer that checked and then opened would write outside its dir or over another file.

- `open_write(base, file, mode)`: "w" (truncate), "a" (append) or "x" (create, never over an existing name);
  opened with O_NOFOLLOW, so a link planted after the check is refused by the OS too.
- `replace_file(base, file, write)` / `write_text`: whole or not at all, through a temporary sibling renamed
  into place (a rename replaces the name, never what a link there points to).
- `create_file(base, file, text)`: whole or not at all, and never over an existing name (reports).
- `replace_dir(base, target, build, tmp, old)`: a dir built beside `target` and renamed into place (checkpoints, cache
  entries), the previous one kept until the new one is whole.
- `fresh_temp(base, tmp)`: a temporary name of ours, emptied: whatever stands there goes (a link itself, never
  what it points to).
- `hold_lock(base, file, holder)`: an exclusive lock whose file names its holder, for the one who is refused
  (`holds`, `release`); `lock_holder(file)` sees another holder without writing anything.
- `refuse_links(base, file)`, `refuse_links_in(base, dir)`: the same refusal as a check before the work starts
  (before a rank, a server or a model), and for the files a library writes (datasets' Arrow files).

`base` itself may be a link (a run dir under a linked outputs dir is the user's choice); what is under it may not.
Imports nothing of eagle3 but its errors: every writer, low or high, can use it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from eagle3.errors import UserError


class LinkRefused(UserError):
    """A file the project would write (or a dir on its way) is a symlink; nothing was written through it."""


class LockHeld(UserError):
    """Another process holds the lock; `holder` is what it wrote into the lock file (its pid and command)."""

    def __init__(self, file: Path, holder: str) -> None:
        super().__init__(f"{file} is held by {holder or 'another process'}")
        self.file, self.holder = file, holder or "another process"


def link_on_the_way(base: Path, file: Path) -> Path | None:
    """The first symlink among the dirs between `base` and `file` and `file` itself, or None. `file` must be
    under `base` (given as it is, or as an absolute path of the same prefix)."""
    base, file = Path(base), Path(file)
    try:
        parts = file.relative_to(base).parts
    except ValueError:
        parts = file.absolute().relative_to(base.absolute()).parts
    here = base
    for part in parts:
        here = here / part
        if here.is_symlink():
            return here
        if not here.exists():
            return None  # nothing further down can exist
    return None


def refuse_links(base: Path, file: Path, what: str = "") -> None:
    """LinkRefused naming the link when `file`, or a dir between `base` and it, is a symlink."""
    link = link_on_the_way(Path(base), Path(file))
    if link is not None:
        raise LinkRefused(link_message(Path(base), link, what or str(file)))


def link_message(base: Path, link: Path, what: str) -> str:
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    state = "" if link.exists() else ", which does not exist"
    return (f"{link} is a symlink (to {target}{state}): nothing is written through a link in {base}, where it "
            f"would land outside it or on another file; nothing was written ({what}). Remove the link, or "
            "choose another dir")


def refuse_links_in(base: Path, directory: Path, what: str) -> None:
    """LinkRefused naming the first symlink in `directory` or in its subdirs one level down (a dir the project
    builds holds only files it writes: none may be a link), or on the way from `base` to it."""
    base, directory = Path(base), Path(directory)
    refuse_links(base, directory, what)
    if not directory.is_dir():
        return
    top = sorted(directory.iterdir())
    for entry in top + [e for d in top if d.is_dir() and not d.is_symlink() for e in sorted(d.iterdir())]:
        if entry.is_symlink():
            raise LinkRefused(link_message(base, entry, what))


def make_dirs(base: Path, path: Path) -> Path:
    """`path` and the dirs between `base` and it, created where missing; none of them a link."""
    refuse_links(base, path)
    path.mkdir(parents=True, exist_ok=True)
    return path


_MODES = {"w": os.O_TRUNC, "a": os.O_APPEND, "x": os.O_EXCL}


def open_write(base: Path, file: Path, mode: str = "w", binary: bool = False, **kwargs: Any) -> IO[Any]:
    """`file` opened for writing (mode "w", "a" or "x"), never through a link; its parent dirs made. "x" raises
    FileExistsError when the name exists (as a file, a dir or a link)."""
    base, file = Path(base), Path(file)
    make_dirs(base, file.parent)
    refuse_links(base, file)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | _MODES[mode] | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(file, flags, 0o666)
    except OSError as e:
        if file.is_symlink():  # planted between the check and the open: O_NOFOLLOW refused it
            raise LinkRefused(link_message(base, file, str(file))) from None
        raise e
    if not binary:
        kwargs.setdefault("encoding", "utf-8")
    return os.fdopen(fd, mode + ("b" if binary else ""), **kwargs)


def fresh_temp(base: Path, tmp: Path) -> Path:
    """`tmp` (a temporary name of ours) with nothing there: a link there is removed itself, never followed."""
    refuse_links(base, tmp.parent)
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def temp_sibling(file: Path) -> Path:
    return file.with_name(f".{file.name}.{os.getpid()}.tmp")


def replace_file(base: Path, file: Path, write: Callable[[Path], object], what: str = "") -> None:
    """`write(tmp)` writes the new content to a fresh temporary sibling, which then replaces `file` whole: a kill
    or a full disk mid-write never leaves half a file, and no link is written through (LinkRefused naming `what`)."""
    base, file = Path(base), Path(file)
    make_dirs(base, file.parent)
    refuse_links(base, file, what)
    tmp = fresh_temp(base, temp_sibling(file))
    try:
        write(tmp)
        os.replace(tmp, file)
    finally:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()


def write_text(base: Path, file: Path, text: str) -> None:
    """`text` into `file`, whole or not at all, never through a link."""
    def write(tmp: Path) -> None:
        with open_write(base, tmp, "x") as f:
            f.write(text)

    replace_file(base, file, write)


def create_file(base: Path, file: Path, text: str) -> None:
    """`text` as the new file `file`, whole or not at all, never over an existing name (a file, a dir or a link):
    FileExistsError then. Written to a temporary sibling, then hard-linked at `file` (which fails when the name
    exists, at the moment it is made)."""
    base, file = Path(base), Path(file)
    make_dirs(base, file.parent)
    refuse_links(base, file)
    tmp = fresh_temp(base, temp_sibling(file))
    try:
        with open_write(base, tmp, "x") as f:
            f.write(text)
        os.link(tmp, file, follow_symlinks=False)
    finally:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()


def replace_dir(base: Path, target: Path, build: Callable[[Path], object], tmp: Path, old: Path) -> None:
    """`build(tmp)` fills the fresh dir `tmp`, which then takes `target`'s place; the previous `target` is moved to
    `old` meanwhile and removed after. None of the three names is followed when it is a link: `target` as a link
    is refused, `tmp` and `old` (names of ours) are emptied first."""
    base, target = Path(base), Path(target)
    make_dirs(base, target.parent)
    refuse_links(base, target)
    fresh_temp(base, tmp)
    try:
        build(tmp)
    except BaseException:
        fresh_temp(base, tmp)
        raise
    fresh_temp(base, old)  # left by a save killed between its renames
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    fresh_temp(base, old)


_held: dict[str, IO[str]] = {}  # the locks this process holds, by real path: held until it exits


def hold_lock(base: Path, file: Path, holder: str | None = None) -> IO[str]:
    """`file` locked exclusively by this process until it exits, with `holder` (default: this pid and command line)
    written into it; LockHeld with the holder's line when another holds it (another process, or another open file
    of it in this one: see `holds`)."""
    key = os.path.realpath(file)
    lock = open_write(base, file, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        try:
            held_by = file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            held_by = ""
        raise LockHeld(file, held_by) from None
    os.ftruncate(lock.fileno(), 0)
    lock.write((holder or this_process()) + "\n")
    lock.flush()
    _held[key] = lock
    return lock


def lock_holder(file: Path) -> str | None:
    """The holder line of the lock `file` when another process holds it (or another open file of it in this one),
    else None; seen without taking the lock or writing anything. A link at `file` is not looked through (the writers
    refuse it)."""
    if holds(file):
        return None
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # absent, or a link
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused only while someone holds it exclusively
    except BlockingIOError:
        with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "another process"
    os.close(fd)  # closing lets go of the shared lock
    return None


def holds(file: Path) -> bool:
    """Whether this process holds the lock `file` (a run that serves itself at its end takes it no second time)."""
    return os.path.realpath(file) in _held


def release(file: Path) -> None:
    """Lets go of the lock `file` this process holds (hold_lock)."""
    lock = _held.pop(os.path.realpath(file), None)
    if lock is not None:
        lock.close()


def this_process() -> str:
    """`pid N: <command line>`, as a holder names itself."""
    return f"pid {os.getpid()}: {' '.join(getattr(sys, 'orig_argv', sys.argv))}"
