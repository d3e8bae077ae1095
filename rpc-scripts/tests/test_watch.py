"""`qos_stats_get --watch`: a table of rates per host, refreshed; rates come from the
monotonic counters of two successive compact answers."""

import time

import pytest

from conftest import FakeClient, run

BOUNDS = [0, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
          10_000_000, 25_000_000, 50_000_000, 100_000_000, 250_000_000, 500_000_000, 1_000_000_000,
          2_500_000_000]


def answer(k):
    """The k-th answer: host h1 completes 2000 I/O (8 MiB) per refresh, 100 of them held
    about 3 ms (bucket <= 5 ms), 10 throttled; h2 idle."""
    ios = 2000 * k
    held = 100 * k
    cum = [ios - held] * 9 + [ios] * 10
    return [{'name': 'd0', 'held_time_bounds_ns': BOUNDS, 'hosts': [
        {'host_nqn': 'nqn.h1', 'min': {'total': {'iops': 900}}, 'max': {},
         'completed_total': {'ios': ios, 'bytes': ios * 4096, 'ops': ios}, 'held': 4,
         'throttled_ios': 10 * k, 'held_time': {'cumulative': cum},
         'held_by': {'limit': 8 * k, 'reservation': 2 * k, 'window': 0, 'bypassed': 0},
         'periods_total': {'met': 3, 'missed': 0, 'met_backlogged': 1, 'missed_backlogged': 1},
         'entitlement': {'contending': True, 'entitled': 1200, 'achieved': 1000, 'shortfall': 200,
                         'queue_depth_needed': 4.8}},
        {'host_nqn': 'nqn.h2', 'completed_total': {'ios': 5, 'bytes': 5, 'ops': 5}, 'held': 0,
         'held_time': {'cumulative': [5] * 19}},
    ]}]


@pytest.fixture
def clock(monkeypatch):
    t = [100.0]
    monkeypatch.setattr(time, 'monotonic', lambda: t[0])

    def sleep(s):
        t[0] += s
    monkeypatch.setattr(time, 'sleep', sleep)
    return t


def test_watch_prints_rates_from_two_samples(capsys, clock):
    k = [0]

    def stats(params):
        assert params == {'compact': True, 'domain': 'd0'}
        k[0] += 1
        return answer(k[0])
    run(['qos_stats_get', '-d', 'd0', '--table', '--watch', '2', '--iterations', '2'],
        FakeClient({'qos_stats_get': stats}))
    out = capsys.readouterr().out
    first, second = out.split('\n\n')
    assert 'every 2s' in first
    h1 = next(line.split() for line in first.splitlines() if 'nqn.h1' in line)
    assert h1[4:6] == ['-', '-'], 'no rate from one sample'
    header = next(line for line in second.splitlines() if line.startswith('DOMAIN'))
    assert header.split() == ['DOMAIN', 'HOST', 'MIN', 'MAX', 'IOPS', 'MiB/s', 'MET', 'HELD', 'THROTTLED/s',
                              'HELD', 'p99', 'HELD', 'BY/s', 'ENTITLED', 'SHORT/s', 'FLAGS']
    h1 = next(line.split() for line in second.splitlines() if 'nqn.h1' in line)
    # 2000 I/O and 2000 * 4096 bytes in 2 s; 10 throttled in 2 s; held p99 in the 5 ms bucket
    # (100 of 2000 held: 95% at 0, so the 99th percentile is a held one).
    # Held by the limit 8 and for a reservation 2 per refresh of 2 s.
    assert h1 == ['d0', 'nqn.h1', 'iops=900', '-', '1000', '3.9', '4/5', '4', '5', '<=5ms',
                  'limit:4', 'reservation:1', '1200/s:contending', '200', '-']
    h2 = next(line.split() for line in second.splitlines() if 'nqn.h2' in line)
    assert h2[4:6] == ['0', '0.0'] and h2[9] == '-' and h2[10:13] == ['-', '-', '-']


def test_watch_interval_is_checked():
    with pytest.raises(SystemExit):
        run(['qos_stats_get', '--watch', '0'])


def test_compact_and_host_filter_are_sent(fake):
    run(['qos_stats_get', '--compact', '-q', 'nqn.h1'], fake)
    assert fake.calls == [('qos_stats_get', {'compact': True, 'host_nqn': 'nqn.h1'})]


def test_watch_with_dry_run_client_stops(capsys, clock):
    run(['qos_stats_get', '--watch'], FakeClient({'qos_stats_get': None}))
    assert capsys.readouterr().out == ''
