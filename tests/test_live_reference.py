"""Live differential check: the model against the compiled reference, when it is installed.

A bounded version of ``mocker-spec gen-cases --record`` followed by ``mocker-spec diff --corpus``
(spec/fidelity.md): a few small seeded cases (mocker_spec/casegen.py), one per kind (aggregated
vLLM / TRT-LLM / SGLang, disaggregated vLLM / SGLang), once plain and once in concurrency mode
(``gen-cases --concurrency``, spec/replay.md WL-20), each replayed by the compiled
``ai-dynamo-runtime==1.3.0.post1`` in a subprocess with a timeout (it can spin forever, LIVE-5) and
by the model, then compared with ``mocker_spec.reference.compare`` (per-request fields, summary,
dead-end messages; a reference hang agrees only with a model livelock diagnosis).

Without the wheel (``pip install -e '.[test,reference]'`` installs it on Linux x86_64/aarch64) the
tests skip and say why.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import attrs
import pytest

from mocker_spec.casegen import KINDS, generate_case
from mocker_spec.reference import check_loaded_case, compare, run_model, run_reference

#: the case family used here (the fidelity figure in spec/fidelity.md uses family 1)
SEED = 2
#: cases per kind, and the largest trace (rows) a picked case may have: keeps the run to seconds
PER_KIND = 1
MAX_ROWS = 12
#: seconds before a reference run counts as a hang
TIMEOUT_S = 60.0


def _pick_cases(concurrency: bool = False):
    """The first ``PER_KIND`` cases of each kind with at most ``MAX_ROWS`` rows (deterministic);
    with ``concurrency``, among the cases ``gen-cases --concurrency`` gives a cap (WL-20)."""
    picked = {kind: [] for kind in KINDS}
    for index in range(500):
        case, rows = generate_case(SEED, index, concurrency)
        if concurrency and "replay_concurrency" not in case:
            continue
        args = case.get("engine_args") or case["prefill_engine_args"]
        kind = (case["mode"], args["engine_type"])
        if len(rows) <= MAX_ROWS and len(picked[kind]) < PER_KIND:
            picked[kind].append(index)
        if all(len(v) == PER_KIND for v in picked.values()):
            break
    tag = "-concurrency" if concurrency else ""
    return [(f"{mode}-{engine}{tag}-{i}", i, concurrency) for (mode, engine), idx in picked.items() for i in idx]


CASES = _pick_cases() + _pick_cases(concurrency=True)


@pytest.fixture(scope="module")
def reference_python():
    """The interpreter that can import the compiled reference, or a skip with the reason."""
    from mocker_spec.reference import reference_problem

    problem = reference_problem(sys.executable)
    if problem is not None:
        pytest.skip(f"{problem}; install it with pip install -e '.[test,reference]'")
    return sys.executable


def test_cases_cover_every_kind():
    """The live diff touches each engine and runtime kind at least once, and its SGLang cases
    carry ``sglang`` sub-arguments (so the reference runner's nested constructors are exercised)."""
    assert len(CASES) == 2 * len(KINDS) * PER_KIND
    for name, index, concurrency in CASES:
        case, _ = generate_case(SEED, index, concurrency)
        assert ("replay_concurrency" in case) == concurrency
        args = case.get("engine_args") or case["prefill_engine_args"]
        if args["engine_type"] == "sglang":
            assert isinstance(args.get("sglang"), dict), name


@pytest.mark.reference
@pytest.mark.parametrize("name, index, concurrency", CASES, ids=[c[0] for c in CASES])
def test_live_case_matches_reference(reference_python, tmp_path, name, index, concurrency):
    case, rows = generate_case(SEED, index, concurrency)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = dict(case, trace_file=str(trace))
    ref = run_reference(job, timeout_s=TIMEOUT_S, python=reference_python)
    assert not ref.message.startswith("the reference crashed"), ref.message
    assert not ref.message.startswith("compiled reference not installed"), ref.message
    ours = run_model(job)
    div = compare(ours, ref)
    assert div is None, f"{name}: {div.describe()}"
    if ref.status == "ok":
        # the comparison saw every reference row
        assert len(ours.records) == len(ref.records) == len(rows)


@pytest.mark.reference
def test_gen_cases_records_in_worker_processes(reference_python, tmp_path, capsys):
    """``gen-cases --record --jobs 2`` records the same outcomes as one process: the same statuses,
    and the model agrees with both recordings (rows, order and sums of the reference itself vary
    between its runs, FID-1, so the files are compared through ``diff --corpus``)."""
    from mocker_spec.cli import main
    from mocker_spec.reference import reference_available

    assert reference_available(reference_python)
    assert not reference_available(str(tmp_path / "no-such-python"))
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        assert main(["gen-cases", "--out", str(out), "--seed", str(SEED), "--count", "4", "--record",
                     "--timeout", str(TIMEOUT_S), "--jobs", jobs, "--no-progress"]) == 0
        assert main(["diff", "--corpus", str(out), "--jobs", jobs]) == 0
    capsys.readouterr()
    statuses = {jobs: sorted((d.name, (d / "expected.status").read_text()) for d in (tmp_path / f"jobs{jobs}").iterdir())
                for jobs in ("1", "2")}
    assert statuses["1"] == statuses["2"] and len(statuses["1"]) == 4


@pytest.mark.reference
def test_live_engine_args_dialects_match_the_reference(reference_python, tmp_path):
    """DRV-19, ARGS-13: the same engine-args object read as a case's constructor keywords and as
    the CLI's JSON (``from_cli``): upper-case ``VLLM`` and the JSON-only ``is_prefill`` are refused
    by the first and accepted by the second, and a boolean count the other way round; each time
    the model and the reference agree on the outcome."""
    case, rows = generate_case(SEED, 0)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    base = {"mode": "agg", "num_workers": 1, "trace_block_size": case["trace_block_size"], "trace_file": str(trace)}
    upper = {"engine_type": "VLLM", "is_prefill": False, "block_size": 16, "num_gpu_blocks": 256}
    boolean = {"block_size": 16, "num_gpu_blocks": 256, "max_num_seqs": True}
    statuses = {}
    for name, args, from_cli in [("upper-case", upper, False), ("upper-json", upper, True),
                                 ("bool-case", boolean, False), ("bool-json", boolean, True)]:
        job = dict(base, engine_args=args, **({"from_cli": True} if from_cli else {}))
        ref = run_reference(job, timeout_s=TIMEOUT_S, python=reference_python)
        _, _, div = check_loaded_case(job, ref)  # a model refusal compared as diff --corpus does
        assert div is None, f"{name}: {div.describe()}"
        statuses[name] = ref.status
    assert statuses == {"upper-case": "error", "upper-json": "ok", "bool-case": "ok", "bool-json": "error"}


@pytest.mark.reference
def test_live_json_dialect_validation_refusals_agree(reference_python, tmp_path):
    """FID-10, DRV-19: a CLI job's engine arguments that parse but fail validation are refused with
    the JSON dialect's prefix before the validator's text; each agrees with the model's refusal of
    the same argument (a range on either pool, a cross-field rule, serde's errors in nested objects
    and its enumeration texts), and not with another one."""
    case, rows = generate_case(SEED, 0)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    args = {"block_size": 16, "num_gpu_blocks": 256}
    disagg = {"mode": "disagg", "from_cli": True, "trace_block_size": 16, "trace_file": str(trace),
              "num_prefill_workers": 1, "num_decode_workers": 1,
              "prefill_engine_args": dict(args, worker_type="prefill"),
              "decode_engine_args": dict(args, worker_type="decode")}
    jobs = {
        "prefill-range": dict(disagg, prefill_engine_args=dict(args, worker_type="prefill", num_gpu_blocks=0)),
        "decode-range": dict(disagg, decode_engine_args=dict(args, worker_type="decode", max_num_seqs=0)),
        "cross-field": {"mode": "agg", "from_cli": True, "num_workers": 1, "trace_block_size": 16,
                        "trace_file": str(trace), "engine_args": {"engine_type": "sglang", "block_size": 8,
                                                                  "num_gpu_blocks": 64, "sglang": {"page_size": 4}}},
    }
    agg = {"mode": "agg", "from_cli": True, "num_workers": 1, "trace_block_size": 16, "trace_file": str(trace)}
    sglang = dict(args, engine_type="sglang")
    for name, engine_args in {  # serde's own texts in the same dialect (ARGS-11, ARGS-13)
        "member-path": dict(sglang, sglang={"page_size": 16, "max_prefill_tokens": "x"}),
        "sequence-element": dict(sglang, sglang=["lpm", "x"]),
        "sequence-too-long": dict(sglang, sglang=["lpm", 16, 1024, 64, 32, 0.5, 7]),
        "enum-text": dict(args, preemption_mode="x"),
        "unnamed-enum-text": dict(args, router_queue_policy="X"),
    }.items():
        jobs[name] = dict(agg, engine_args=engine_args)
    for name, job in jobs.items():
        ref = run_reference(job, timeout_s=TIMEOUT_S, python=reference_python)
        assert ref.status == "error" and ref.message.startswith("Failed to parse MockEngineArgs JSON: "), name
        ours, _, div = check_loaded_case(job, ref)
        assert div is None, f"{name}: {div.describe()}"
        # a refusal of another argument, in the model's own words, is a divergence
        other = attrs.evolve(ours, refused=ours.refused.split(".", 1)[0] + ".max_num_batched_tokens",
                             message="max_num_batched_tokens: invalid")
        assert compare(other, ref) is not None, name


@pytest.mark.reference
def test_live_diff_compares_a_refusal_raised_during_the_replay(reference_python, tmp_path, capsys):
    """KV-1, FID-10: ``mocker-spec diff`` on one job whose model refusal comes during the replay
    (a vLLM block size that is not a power of two, refused when the worker is built) compares it
    with the compiled build's panic instead of stopping with a traceback."""
    from mocker_spec.cli import main

    case, rows = generate_case(SEED, 0)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    argv = ["diff", str(trace), "--trace-block-size", "16", "--extra-engine-args",
            json.dumps({"block_size": 12, "num_gpu_blocks": 64})]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "model: error: block_size must be a power of 2, got 12" in out and "agree" in out


@pytest.mark.reference
def test_live_argument_check_order_matches_the_reference(reference_python, tmp_path):
    """DRV-1: given two bad arguments, the model refuses the one the compiled build refuses, on the
    trace entry point (worker counts, then router_mode, then trace_format, max_sim_time_ms, the SLA,
    replay_concurrency) and on the synthetic one (the SLA first). The recorded goldens
    ``args-order-*`` keep five trace-entry pairs; these run live, so a new build is checked too."""
    case, rows = generate_case(SEED, 0)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    args = {"block_size": 16, "num_gpu_blocks": 256}
    agg = {"mode": "agg", "num_workers": 1, "engine_args": args, "trace_block_size": 16}
    disagg = {"mode": "disagg", "trace_block_size": 16, "num_prefill_workers": 1, "num_decode_workers": 1,
              "prefill_engine_args": dict(args, worker_type="prefill"),
              "decode_engine_args": dict(args, worker_type="decode")}
    synthetic = {"synthetic": {"input_tokens": 32, "output_tokens": 2, "request_count": 2}}
    jobs = {
        "cli-workers-before-router": dict(agg, from_cli=True, num_prefill_workers=2, router_mode="bogus"),
        "disagg-workers-before-concurrency": dict(disagg, from_cli=True, num_workers=2, replay_concurrency=-1),
        "router-before-format": dict(agg, router_mode="bogus", trace_format="bogus"),
        "format-before-concurrency": dict(agg, trace_format="bogus", replay_concurrency=-1),
        "cap-before-concurrency": dict(agg, max_sim_time_ms=-1.0, replay_concurrency=-1),
        "sla-before-args18": dict(disagg, sla_e2e_ms=-1.0, decode_engine_args=dict(args, worker_type="prefill")),
        "synthetic-sla-before-router": dict(agg, router_mode="bogus", sla_ttft_ms=-1.0, **synthetic),
        "synthetic-sla-before-workers": dict(agg, from_cli=True, num_prefill_workers=2, sla_itl_ms=-1.0, **synthetic),
        "synthetic-router-before-concurrency": dict(agg, router_mode="bogus", replay_concurrency=-1, **synthetic),
    }
    refused = {}
    for name, job in jobs.items():
        if "synthetic" not in job:
            job = dict(job, trace_file=str(trace))
        ref = run_reference(job, timeout_s=TIMEOUT_S, python=reference_python)
        assert ref.status == "error", f"{name}: {ref.label()}"
        _, _, div = check_loaded_case(job, ref)
        assert div is None, f"{name}: {div.describe()}"
        refused[name] = ref.message.split(" ", 1)[0]
    assert refused["synthetic-sla-before-router"] == "sla_ttft_ms"
    assert refused["router-before-format"] == "router_mode"


@pytest.mark.reference
def test_live_numbers_are_valued_as_serde_json_values_them(reference_python, tmp_path):
    """WL-2, ARGS-13: the build reads trace timestamps and ``from_json`` engine arguments with
    serde_json's default number parse, which is not correctly rounded; about one in ten random
    floats written by Python lands 1 ulp away. The model's ``serde_json_number`` gives the build's
    value every time (the trace's first arrival is 0 and the ratio 1, so each report arrival is
    the parsed timestamp exactly)."""
    from model.rustlib import serde_json_number

    rng = random.Random(11)
    stamps = sorted(rng.uniform(0, 100000) for _ in range(150))
    stamps[0] = 0.0
    trace = tmp_path / "ts.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 16, "output_length": 1,
                                         "hash_ids": [i + 1]}) + "\n" for i, t in enumerate(stamps)))
    job = {"mode": "agg", "engine_args": {"block_size": 16, "num_gpu_blocks": 4096}, "trace_file": str(trace),
           "trace_block_size": 16, "num_workers": 1}
    ref = run_reference(job, timeout_s=TIMEOUT_S, python=reference_python)
    got = sorted(r["arrival_time_ms"] for r in ref.records)
    assert got == sorted(float(serde_json_number(repr(t))) for t in stamps)
    assert got != stamps  # the sample holds values that Python rounds the other way
    ours = run_model(job)
    assert sorted(r["arrival_time_ms"] for r in ours.records) == got

    floats = [rng.uniform(0, 1) for _ in range(400)]
    script = ("import json, sys\nfrom dynamo._core import MockEngineArgs\n"
              "xs = json.load(sys.stdin)\n"
              "print(json.dumps([MockEngineArgs.from_json(json.dumps({'gpu_memory_utilization': x}))"
              ".gpu_memory_utilization for x in xs]))\n")
    out = subprocess.run([reference_python, "-c", script], input=json.dumps(floats), capture_output=True,
                         text=True, timeout=TIMEOUT_S, check=True).stdout
    build = json.loads(out.strip().splitlines()[-1])
    assert build == [float(serde_json_number(repr(x))) for x in floats]
    assert build != floats


@pytest.mark.reference
def test_live_synthetic_argument_order_matches_the_reference(reference_python):
    """DRV-1: test_replay.SYNTHETIC_ORDER_CASES, each refused by the build with the recorded text
    and by the model alike."""
    from test_replay import SYNTHETIC_ORDER_CASES

    for job, message in SYNTHETIC_ORDER_CASES:
        ref = run_reference(job, timeout_s=TIMEOUT_S, python=reference_python)
        assert (ref.status, ref.message) == ("error", message)
        _, _, div = check_loaded_case(job, ref)
        assert div is None, div.describe()


@pytest.mark.reference
def test_live_refusal_texts_are_the_builds(reference_python):
    """ARGS-20: test_engine_args.UPSTREAM_TEXTS against the build itself (nested mappings built as
    the case runner builds them)."""
    from test_engine_args import UPSTREAM_TEXTS

    script = (
        "import json, sys\nfrom dynamo._core import MockEngineArgs, SglangArgs, TrtllmArgs, ReasoningConfig\n"
        "out = []\n"
        "for kw in json.loads(sys.stdin.read()):\n"
        "    kw = {k: (bytes(v['bytes'], 'latin-1') if isinstance(v, dict) and 'bytes' in v else v) for k, v in kw.items()}\n"
        "    for key, cls in (('reasoning', ReasoningConfig), ('sglang', SglangArgs), ('trtllm', TrtllmArgs)):\n"
        "        if isinstance(kw.get(key), dict):\n"
        "            try:\n"
        "                kw[key] = cls(**kw[key])\n"
        "            except Exception as e:\n"
        "                out.append(str(e)); break\n"
        "    else:\n"
        "        try:\n"
        "            MockEngineArgs(**kw); out.append('ok')\n"
        "        except Exception as e:\n"
        "            out.append(str(e))\n"
        "print(json.dumps(out))\n")
    payload = [{k: ({"bytes": v.decode("latin-1")} if isinstance(v, bytes) else v) for k, v in kw.items()}
               for kw, _ in UPSTREAM_TEXTS]
    out = subprocess.run([reference_python, "-c", script], input=json.dumps(payload), capture_output=True,
                         text=True, timeout=TIMEOUT_S, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [text for _, text in UPSTREAM_TEXTS]
