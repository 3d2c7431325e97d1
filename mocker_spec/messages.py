"""Printing text that may hold user input (file names, field values, request ids).

rich reads square brackets in a printed string as markup: a value such as ``[/x]`` raised
``MarkupError`` and ``[b]`` vanished from the message.  Everything the CLI prints that carries
user text goes through here, as :class:`rich.text.Text`, which rich never parses.
"""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.text import Text


def error(text: str, label: str = "error") -> None:
    """One line ``label: text`` on standard error (bad input, usage errors, failed runs)."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text.assemble((f"{label}:", "bold red"), " ", text))


def say(console: Console, text: str, style: Optional[str] = None) -> None:
    """Print ``text`` literally on ``console`` (no markup, no highlighting, no wrapping)."""
    console.print(Text(text, style=style or ""), highlight=False, soft_wrap=True)


def literal(text: str, style: Optional[str] = None) -> Text:
    """``text`` as a table cell or fragment that rich shows as is."""
    return Text(text, style=style or "")


def _ancestor_problem(path: str) -> Optional[str]:
    """Why the nearest existing ancestor of ``path`` cannot hold what will be created (or None)."""
    import os

    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        return f"{probe!r} is not a directory"
    if probe and not os.access(probe, os.W_OK):
        return f"{probe!r} is not writable"
    if probe:
        # ``os.access`` answers yes to root almost everywhere (``/proc``, a read-only mount): a real
        # file created and removed at once is the only sure probe, and it leaves nothing behind
        import tempfile

        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError as exc:
            return f"{probe!r} is not writable ({exc.strerror or exc})"
    return None


def output_file_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot receive an output file, checked before a run starts (or None)."""
    import os

    if os.path.isdir(path):
        return "is a directory"
    return _ancestor_problem(os.path.dirname(os.path.abspath(path)))


def output_dir_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be (or be created as) an output directory (or None)."""
    import os

    if os.path.exists(path) and not os.path.isdir(path):
        return "exists and is not a directory"
    return _ancestor_problem(path)
