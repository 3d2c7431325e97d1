"""The CLI's kernel-level commands print what the model defines."""

from __future__ import annotations

import subprocess
import sys

from mocker_spec.cli import main


def test_transitions_lists_every_pending_rule(capsys):
    assert main(["transitions", "--machine", "PendingDestinations"]) == 0
    out = capsys.readouterr().out
    for rule in ("PEND-1", "PEND-3", "PEND-4", "PEND-5", "PEND-6", "PEND-7"):
        assert rule in out


def test_invariants_lists_the_registry(capsys):
    assert main(["invariants"]) == 0
    assert "pend_fifo_bound" in capsys.readouterr().out


def test_bad_arguments_exit_2():
    proc = subprocess.run([sys.executable, "-m", "mocker_spec.cli", "no-such-command"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


def test_usage_errors_are_one_line_naming_the_option_and_value(capsys):
    """A bad choice or a malformed number is one line (no usage dump), exit status 2."""
    import pytest

    for argv, fragments in ((["replay", "--router-mode", "foo"], ("--router-mode", "'foo'")),
                            (["replay", "--num-workers", "two"], ("--num-workers", "'two'")),
                            (["gen-cases"], ("--out",))):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: mocker-spec"), lines
        assert all(f in lines[0] for f in fragments), lines[0]
