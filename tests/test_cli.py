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
