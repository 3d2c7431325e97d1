"""Writing a set of files all or nothing (the explorer's ``--out`` directory, MC-47; also the
conformance-vector corpus, VEC-1, and each case ``gen-cases`` writes).

:func:`publish` writes every file into a temporary staging directory first and only then puts
them in place, so a write that fails part-way (a full disk) leaves the destination as it was and
takes away again the directories it created.  It lives here, in the lowest layer the three writers
share, because the explorer cannot import the command-line package.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from typing import Callable, List, Sequence, Tuple, Union

#: what a file is made of: its text (written as UTF-8), or a function that writes the file at the
#: path it is given (for writers such as networkx's GraphML that want a path)
Content = Union[str, Callable[[pathlib.Path], None]]


def publish(dest: pathlib.Path, files: Sequence[Tuple[str, Content]]) -> List[pathlib.Path]:
    """Write ``files`` (relative names, in order) into the directory ``dest``, all or nothing.

    An absent or empty ``dest`` becomes the staging directory, renamed into place; an existing
    one keeps what it holds and gets the files moved in one by one (replacing files of the same
    name).  On a failure the staging directory goes, and so do the directories this call created.
    Returns the paths written, in order."""
    dest = pathlib.Path(dest)
    created = make_dirs(dest.parent)
    try:
        whole = not dest.exists() or (dest.is_dir() and not any(dest.iterdir()))
        # staged beside an absent or empty destination (renamed at the end), else inside it
        stage = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent if whole else dest))
        try:
            for name, content in files:
                path = stage / name
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, str):
                    path.write_text(content, encoding="utf-8")
                else:
                    content(path)
            if whole:
                if dest.exists():
                    dest.rmdir()
                os.replace(stage, dest)
            else:
                for child in sorted(stage.iterdir()):
                    os.replace(child, dest / child.name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        remove_dirs(created)
        raise
    return [dest / name for name, _ in files]


def make_dirs(path: pathlib.Path) -> List[pathlib.Path]:
    """``path.mkdir(parents=True, exist_ok=True)``, returning the directories it created, deepest
    first, so that a failed write can take them away again (:func:`remove_dirs`)."""
    created = []
    probe = pathlib.Path(os.path.abspath(path))
    while not probe.exists() and probe.parent != probe:
        created.append(probe)
        probe = probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except BaseException:
        remove_dirs(created)  # a parent made before the failure goes too
        raise
    return created


def remove_dirs(created: List[pathlib.Path]) -> None:
    """Remove the directories :func:`make_dirs` created, deepest first, stopping at the first that
    is not empty (something else was written there meanwhile)."""
    for d in created:
        try:
            d.rmdir()
        except OSError:
            break
