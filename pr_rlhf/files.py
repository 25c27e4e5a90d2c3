"""Writes that a crash can never leave half done, and the COMPLETE marker that says a folder is whole.

Every artifact a later run resumes from (checkpoints, stage folders, caches, indexes, reports) is written through
here: the bytes go to a temporary sibling first and are moved into place with one ``os.replace``/``os.rename``, so
a reader sees the old file, the new file, or nothing, never a torn one.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

COMPLETE = "COMPLETE"  # written last into a folder: only folders holding it are read back (resumed, skipped)
_UMASK = os.umask(0o022)  # read once (umask can only be read by setting it), restored at once
os.umask(_UMASK)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` writes the content to a temporary sibling of ``path``, which then replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; give it the mode a plain open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


@contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = True) -> Iterator[Path]:
    """Build a folder in a temporary sibling (yielded) and move it to ``path`` when the block succeeds.

    ``replace``: an existing ``path`` is removed first; otherwise a ``path`` that appeared meanwhile (another
    process won the race with a complete copy) is kept and the new copy dropped.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it private; the result may be shared by every process of the user
        if replace:
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if replace or not path.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def mark_complete(folder: str | os.PathLike) -> None:
    """Write the COMPLETE marker: call last, after everything else in ``folder`` is written."""
    atomic_write_text(Path(folder) / COMPLETE, "ok\n")


def is_complete(folder: str | os.PathLike) -> bool:
    return (Path(folder) / COMPLETE).is_file()
