"""Every rule id of a spec file resolves to code and to a test (spec/README.md conventions).

A spec file joins ``SPEC_AREAS`` when its layer lands; the areas list which id
prefixes that file defines.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

SPEC_AREAS = {
    "handoff-lifecycle.md": ("ID", "PROTO", "CHAN", "SRC", "DST", "ACT", "PEND", "LEDGER", "ADM", "FPM"),
    "core-commands.md": ("CORE", "CMD", "RETRY"),
    "engine-args.md": ("ARGS",),
    "vllm-core.md": ("VLLM", "TRT", "VGEN"),
    "sglang-core.md": ("SG", "SGQ", "SGGEN"),
    "kv-vllm.md": ("HASH", "SEQ", "KV"),
    "kv-sglang.md": ("POOL", "RADIX", "SGKV"),
    "timing.md": ("TIME",),
    "replay.md": ("WL", "REP", "DRV", "DIS", "LIVE"),
    "model-checking.md": ("MC",),
    "scenarios.md": ("SCN",),
    "step-trace.md": ("STEP",),
    "oracle-kit.md": ("VEC", "HARN"),
}

RULE_RE = re.compile(r"\b([A-Z][A-Z]*(?:-[A-Z]+)*-Q?\d+)\b")


def _ids(spec_file, areas):
    text = (ROOT / "spec" / spec_file).read_text()
    return sorted({m for m in RULE_RE.findall(text) if m.rsplit("-", 1)[0] in areas})


def _corpus(*dirs, exclude=()):
    parts = []
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            if path.name not in exclude:
                parts.append(path.read_text())
    return "\n".join(parts)


CODE = _corpus("model", "invariants", "explorer", "mocker_spec")
TESTS = _corpus("tests", exclude=("test_spec_links.py",))


def _cited(rule, text):
    return re.search(rf"(?<![A-Z0-9-]){re.escape(rule)}(?![0-9])", text) is not None


@pytest.mark.parametrize("spec_file", sorted(SPEC_AREAS))
def test_every_rule_id_resolves_to_code_and_tests(spec_file):
    ids = _ids(spec_file, SPEC_AREAS[spec_file])
    assert ids, f"{spec_file} defines no rule ids"
    missing_code = [r for r in ids if not _cited(r, CODE)]
    missing_tests = [r for r in ids if not _cited(r, TESTS)]
    assert not missing_code, f"rule ids with no model/invariant citation: {missing_code}"
    assert not missing_tests, f"rule ids with no test citation: {missing_tests}"
