"""FPM-1 / FPM-3: the batch forms agree bit for bit with the one-value-at-a-time definitions."""

import random

from model import fpm, protocol


def test_welford_batch_equals_repeated_add_on_random_floats_and_ints():
    rng = random.Random(20260)
    for n in list(range(0, 12)) + [100, 1000]:
        for kind in ("int", "float", "mixed"):
            values = []
            for _ in range(n):
                if kind == "int" or (kind == "mixed" and rng.random() < 0.5):
                    values.append(rng.randint(0, 10**7))
                else:
                    values.append(rng.uniform(-1e9, 1e9) * rng.random())
            acc = fpm.WelfordAcc()
            for v in values:
                acc = acc.add(float(v))
            got = fpm.welford(values)
            assert (got.count, got.sum.hex(), got.mean.hex(), got.m2.hex()) == (
                acc.count, acc.sum.hex(), acc.mean.hex(), acc.m2.hex())


def test_accept_length_sample_counts_distinct_requests():
    S = protocol.OutputSignal
    signals = [S("A", False), S("B", False), S("A", False), S("C", True, rejected=True), S("D", True)]
    assert fpm.accept_length_sample(signals) == (4, 3)
    assert fpm.accept_length_sample(iter(signals)) == (4, 3)


def test_an_empty_pass_snapshot_is_the_default_snapshot():
    # FPM-2: upstream's snapshot derives Default (every count, sum and variance 0); a pass that
    # schedules and queues nothing builds exactly that value, and has no scheduled work (FPM-4).
    empty = fpm.build_fpm_snapshot([], [], [], [], 0.0)
    assert empty == fpm.ForwardPassSnapshot()
    assert all(getattr(empty, f) == 0 for f in ("num_queued_decode", "num_queued_prefill", "num_decode_requests"))
    assert not empty.has_scheduled_work()
    # one scheduled prefill (prompt 8, no prefix, 8 computed) or one scheduled decode is work
    assert fpm.build_fpm_snapshot([(8, 0, 8)], [], [], [], 0.0).has_scheduled_work()
    assert fpm.build_fpm_snapshot([], [9], [], [], 0.0).has_scheduled_work()
