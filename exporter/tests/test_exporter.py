"""The exporter against a stub JSON-RPC server (no SPDK): metric names, labels, the
held-time histogram, the initiator's metrics, plugins that are not loaded, a target
that does not answer, and the command line."""

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import nvmf_qos_exporter as ex
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BOUNDS_NS, EXPORTER, cumulative, domain, free_port, host

INI_BDEV = {
    'name': 'qh1', 'base_bdev_name': 'Nvme0n1', 'pacer_group': 'default',
    'state': {'mode': 'cooperative', 'held': 2, 'held_total': 40, 'ios': 1000, 'large_ios': 10,
              'large_whole_ios': 7,
              'chunks': 160, 'vendor_sent': 55, 'vendor_errors': 1, 'aborted': 0,
              'held_ns': 2_500_000_000, 'paced_ns': 1_000_000_000, 'vendor_late': 2, 'vendor_submit_failed': 0,
              'probes_sent': 9, 'engine_restarts': 1, 'acquire_deferred': 3},
    'pacer': {'name': 'default', 'allowed_bytes_per_sec': 2_000_000_000, 'latency_target_ns': 200_000,
              'base_latency_ns': 40_000, 'probes_lost': 4, 'chunk_bytes': 45056},
}


def scrape(socket_path, compact=True):
    reg = CollectorRegistry()
    reg.register(ex.QosCollector(ex.Source(socket_path, 2.0), compact=compact))
    text = generate_latest(reg).decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return text, samples


def value(samples, name, **labels):
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


def test_target_metrics_names_labels_and_histogram(stub):
    h1 = host('nqn.h1', 1000, cumulative(900, 100, 3), 100 * 40_000, res_iops=5000, max_iops=9000)
    h1['held_by'] = {'limit': 60, 'burst': 0, 'reservation': 40, 'share': 0, 'budget': 0, 'window': 0,
                     'bypassed': 5}
    h2 = host('nqn.h2', 50, cumulative(50, 0, 0), 0)
    del h2['held_by']  # a target older than the held-reason counters
    s = stub({'qos_stats_get': [dict(domain('d0', [h1, h2]), pool_paced=True)]})
    text, m = scrape(s.path)
    assert s.calls[0] == ('qos_stats_get', {'compact': True})
    assert value(m, 'nvmf_qos_up', plugin='target') == 1
    # An application without the initiator plugin: its up series is there, at 0.
    assert value(m, 'nvmf_qos_up', plugin='initiator') == 0
    assert value(m, 'nvmf_qos_host_completed_ios_total', domain='d0', host_nqn='nqn.h1') == 1000
    assert value(m, 'nvmf_qos_host_completed_bytes_total', host_nqn='nqn.h1') == 1000 * 4096
    assert value(m, 'nvmf_qos_host_throttled_ios_total', host_nqn='nqn.h1') == 100
    assert value(m, 'nvmf_qos_host_held_ios', host_nqn='nqn.h2') == 3
    # Why commands waited, by rule, and what a bypass let through.
    assert value(m, 'nvmf_qos_host_held_by_reason_ios_total', host_nqn='nqn.h1', reason='limit') == 60
    assert value(m, 'nvmf_qos_host_held_by_reason_ios_total', host_nqn='nqn.h1', reason='reservation') == 40
    assert value(m, 'nvmf_qos_host_held_by_reason_ios_total', host_nqn='nqn.h1', reason='window') == 0
    assert value(m, 'nvmf_qos_host_bypassed_ios_total', host_nqn='nqn.h1') == 5
    assert not [lab for lab, _ in m.get('nvmf_qos_host_bypassed_ios_total', []) if lab['host_nqn'] == 'nqn.h2']
    assert value(m, 'nvmf_qos_domain_bypass', domain='d0') == 0
    assert value(m, 'nvmf_qos_domain_pool_paced', domain='d0') == 1
    assert value(m, 'nvmf_qos_host_periods_total', host_nqn='nqn.h1', outcome='missed', backlogged='true') == 4
    assert value(m, 'nvmf_qos_host_periods_total', host_nqn='nqn.h1', outcome='met', backlogged='false') == 5
    assert value(m, 'nvmf_qos_host_reservation_iops', host_nqn='nqn.h1', direction='total') == 5000
    assert value(m, 'nvmf_qos_host_limit_iops', host_nqn='nqn.h1', direction='total') == 9000
    assert not [lab for lab, _ in m.get('nvmf_qos_host_limit_iops', []) if lab['host_nqn'] == 'nqn.h2']
    assert value(m, 'nvmf_qos_host_reservation_at_risk', host_nqn='nqn.h1') == 1
    assert value(m, 'nvmf_qos_host_reservation_unreachable', host_nqn='nqn.h1') == 1
    assert value(m, 'nvmf_qos_host_reservation_unreachable', host_nqn='nqn.h2') == 0
    assert value(m, 'nvmf_qos_domain_capacity_estimate_iops', domain='d0') == 400_000
    assert value(m, 'nvmf_qos_domain_global_pool_ops', domain='d0') == 1234
    assert 'nvmf_qos_domain_capacity_estimate_bytes_per_second' not in m  # null: no bandwidth capacity
    assert value(m, 'nvmf_qos_domain_operating_point_in_flight', domain='d0') == 96
    assert value(m, 'nvmf_qos_host_in_flight_at_base', host_nqn='nqn.h1') == 2.5
    assert value(m, 'nvmf_qos_host_reservation_depth_needed', host_nqn='nqn.h1') == 0.75
    assert not [lab for lab, _ in m.get('nvmf_qos_host_reservation_depth_needed', []) if lab['host_nqn'] == 'nqn.h2']
    assert value(m, 'nvmf_qos_host_contending', host_nqn='nqn.h1') == 1
    assert value(m, 'nvmf_qos_host_entitled_ops_per_second', host_nqn='nqn.h1') == 40000
    assert value(m, 'nvmf_qos_host_achieved_ops_per_second', host_nqn='nqn.h1') == 39000
    assert value(m, 'nvmf_qos_host_entitlement_shortfall_ops_per_second', host_nqn='nqn.h1') == 1000
    assert value(m, 'nvmf_qos_host_queue_depth_needed', host_nqn='nqn.h1') == 6.5
    # No entitlement before the depth curve has a sample: no series.
    assert not [lab for lab, _ in m.get('nvmf_qos_host_entitled_ops_per_second', []) if lab['host_nqn'] == 'nqn.h2']
    assert value(m, 'nvmf_qos_domain_operating_point_ops_per_second', domain='d0') == 640_000
    assert value(m, 'nvmf_qos_domain_depth_curve_max_ops_per_second', domain='d0') == 655_000
    assert value(m, 'nvmf_qos_domain_operating_point_latency_seconds', domain='d0') == 150e-6
    # Not over the hosts' circulation: no circulation series.
    assert 'nvmf_qos_domain_circulation_commands' not in m
    # The histogram: one bucket per bound plus +Inf, cumulative, in seconds.
    buckets = [(lab['le'], v) for lab, v in m['nvmf_qos_host_held_seconds_bucket'] if lab['host_nqn'] == 'nqn.h1']
    assert len(buckets) == len(BOUNDS_NS) + 1
    assert buckets[0] == ('0.0', 900)
    assert float(buckets[3][0]) == 50e-6 and buckets[3][1] == 1000
    assert buckets[-1] == ('+Inf', 1000)
    assert value(m, 'nvmf_qos_host_held_seconds_count', host_nqn='nqn.h1') == 1000
    assert abs(value(m, 'nvmf_qos_host_held_seconds_sum', host_nqn='nqn.h1') - 0.004) < 1e-12
    # No group label unless some host is in a group.
    assert 'group=' not in text
    h1['group'] = h2['group'] = None
    s2 = stub({'qos_stats_get': [domain('d0', [h1, h2])]})
    assert 'group=' not in scrape(s2.path)[0]


def test_group_and_domain_capacity_metrics(stub):
    d = domain('d0', [host('nqn.h1', 10, cumulative(10, 0, 0), 0)])
    d['reserved'] = {'ops': 50_000, 'bytes': 0}
    d['capacity_learning'] = False
    d['groups'] = [{'name': 'g1', 'hosts': ['nqn.h1'], 'min': {'iops': 60000}, 'max': {'iops': 100000, 'mibps': 10},
                    'weight': 2, 'completed_this_period': {'ops': 700, 'bytes': 0},
                    'given_this_period': {'ops': 30, 'bytes': 0}}]
    s = stub({'qos_stats_get': [d]})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_group_hosts', domain='d0', group='g1') == 1
    assert value(m, 'nvmf_qos_group_weight', group='g1') == 2
    assert value(m, 'nvmf_qos_group_reservation_iops', group='g1') == 60000
    assert value(m, 'nvmf_qos_group_limit_iops', group='g1') == 100000
    assert value(m, 'nvmf_qos_group_limit_bytes_per_second', group='g1') == 10 * 1048576
    assert 'nvmf_qos_group_reservation_bytes_per_second' not in m
    assert value(m, 'nvmf_qos_group_completed_this_period_cost_ops', group='g1') == 700
    assert value(m, 'nvmf_qos_group_given_this_period_cost_ops', group='g1') == 30
    period_s = d['period_ns'] / 1e9
    assert value(m, 'nvmf_qos_domain_reserved_ops_per_second', domain='d0') == 50_000 / period_s
    assert value(m, 'nvmf_qos_domain_capacity_learning', domain='d0') == 0
    # While the capacity is learned there is no estimate to export (the budget is unbounded).
    d['capacity_learning'] = True
    s = stub({'qos_stats_get': [d]})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_domain_capacity_learning', domain='d0') == 1
    assert 'nvmf_qos_domain_capacity_estimate_iops' not in m


def test_burst_credit_metrics_of_hosts_and_groups(stub):
    burst = {'iops': 30000, 'mibps': None, 'seconds': 20, 'credit_seconds': 12.5, 'bursting': True,
             'bursting_periods': 7}
    h1 = dict(host('nqn.h1', 10, cumulative(10, 0, 0), 0, max_iops=10000), burst=burst, group='g1')
    h2 = host('nqn.h2', 10, cumulative(10, 0, 0), 0)
    d = domain('d0', [h1, h2])
    d['groups'] = [{'name': 'g1', 'hosts': ['nqn.h1'], 'max': {'mibps': 100}, 'weight': 1,
                    'burst': {'iops': None, 'mibps': 400, 'seconds': 60, 'credit_seconds': 0.0,
                              'bursting': False, 'bursting_periods': 0}}]
    _, m = scrape(stub({'qos_stats_get': [d]}).path)
    assert value(m, 'nvmf_qos_host_burst_credit_seconds', host_nqn='nqn.h1', group='g1') == 12.5
    assert value(m, 'nvmf_qos_host_bursting', host_nqn='nqn.h1') == 1
    assert value(m, 'nvmf_qos_host_bursting_periods_total', host_nqn='nqn.h1') == 7
    assert value(m, 'nvmf_qos_host_burst_iops', host_nqn='nqn.h1') == 30000
    assert value(m, 'nvmf_qos_host_burst_bucket_seconds', host_nqn='nqn.h1') == 20
    assert 'nvmf_qos_host_burst_bytes_per_second' not in m
    # A host without a burst has no burst series.
    assert not [lab for lab, _ in m['nvmf_qos_host_burst_credit_seconds'] if lab['host_nqn'] == 'nqn.h2']
    assert value(m, 'nvmf_qos_group_burst_bytes_per_second', group='g1') == 400 * 1048576
    assert value(m, 'nvmf_qos_group_burst_credit_seconds', group='g1') == 0
    assert value(m, 'nvmf_qos_group_bursting', group='g1') == 0
    assert value(m, 'nvmf_qos_group_bursting_periods_total', group='g1') == 0


def test_build_info_of_each_loaded_plugin(stub):
    version = {'plugin': 'target', 'version': '0.1.0', 'wire_protocol': 1, 'profile': 'release'}
    s = stub({'qos_stats_get': [domain('d0', [])], 'qos_version_get': version})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_build_info', plugin='target', version='0.1.0', wire_protocol='1',
                 profile='release') == 1
    assert len(m['nvmf_qos_build_info']) == 1  # no initiator plugin, no initiator series
    # A plugin without the version method: no series, the scrape still works.
    s = stub({'qos_stats_get': [domain('d0', [])]})
    _, m = scrape(s.path)
    assert 'nvmf_qos_build_info' not in m
    assert value(m, 'nvmf_qos_up', plugin='target') == 1


def test_group_label_when_the_target_reports_groups(stub):
    h1 = host('nqn.h1', 10, cumulative(10, 0, 0), 0, group='tenant-a')
    h2 = host('nqn.h2', 20, cumulative(20, 0, 0), 0, group=None)  # not in a group
    h2['group'] = None  # as the target reports it
    s = stub({'qos_stats_get': [domain('d0', [h1, h2])]})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_host_completed_ios_total', host_nqn='nqn.h1', group='tenant-a') == 10
    assert value(m, 'nvmf_qos_host_completed_ios_total', host_nqn='nqn.h2', group='') == 20
    assert all('group' in lab for lab, _ in m['nvmf_qos_host_held_seconds_bucket'])


@pytest.mark.parametrize('method', ['qos_ini_stats_get', 'qos_ini_bdev_get'])
def test_initiator_metrics(stub, method):
    s = stub({method: [INI_BDEV]})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_up', plugin='initiator') == 1
    assert value(m, 'nvmf_qos_up', plugin='target') == 0  # absent plugin: 0, not a missing series
    assert value(m, 'nvmf_qos_ini_chunks_total', bdev='qh1', pacer_group='default') == 160
    assert value(m, 'nvmf_qos_ini_large_whole_ios_total', bdev='qh1', pacer_group='default') == 7
    assert value(m, 'nvmf_qos_ini_throttled_ios_total', bdev='qh1') == 40
    assert value(m, 'nvmf_qos_ini_held_seconds_total', bdev='qh1') == 2.5
    assert value(m, 'nvmf_qos_ini_paced_seconds_total', bdev='qh1') == 1.0
    assert value(m, 'nvmf_qos_ini_mode', bdev='qh1', mode='cooperative') == 1
    assert value(m, 'nvmf_qos_ini_pacer_allowed_bytes_per_second', bdev='qh1') == 2e9
    # Health: late and refused vendor commands, probes, engine restarts, the pacer's latencies.
    assert value(m, 'nvmf_qos_ini_vendor_late_replies_total', bdev='qh1') == 2
    assert value(m, 'nvmf_qos_ini_vendor_submit_failures_total', bdev='qh1') == 0
    assert value(m, 'nvmf_qos_ini_probes_total', bdev='qh1') == 9
    assert value(m, 'nvmf_qos_ini_engine_restarts_total', bdev='qh1') == 1
    assert value(m, 'nvmf_qos_ini_acquires_deferred_total', bdev='qh1') == 3
    assert value(m, 'nvmf_qos_ini_pacer_latency_target_seconds', bdev='qh1') == 200e-6
    assert value(m, 'nvmf_qos_ini_pacer_base_latency_seconds', bdev='qh1') == 40e-6
    assert value(m, 'nvmf_qos_ini_pacer_chunk_bytes', bdev='qh1') == 45056
    assert value(m, 'nvmf_qos_ini_pacer_probes_lost_total', bdev='qh1') == 4


def test_rpc_error_other_than_unknown_method_is_not_hidden(stub):
    s = stub({'qos_stats_get': {'error': {'code': -22, 'message': 'bad'}}})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_up', plugin='target') == 0


def test_application_not_running_gives_up_zero(tmp_path):
    _, m = scrape(str(tmp_path / 'no.sock'))
    assert value(m, 'nvmf_qos_up', plugin='target') == 0
    assert value(m, 'nvmf_qos_up', plugin='initiator') == 0


def test_full_form_is_asked_without_params(stub):
    s = stub({'qos_stats_get': [domain('d0', [])]})
    scrape(s.path, compact=False)
    assert s.calls[0] == ('qos_stats_get', None)


def test_help_and_one_command_serving_metrics(stub):
    out = subprocess.run([sys.executable, EXPORTER + '/nvmf_qos_exporter.py', '--help'],
                         capture_output=True, text=True, check=True).stdout
    assert '--rpc-socket' in out and '--port' in out
    s = stub({'qos_stats_get': [domain('d0', [host('nqn.h1', 7, cumulative(7, 0, 0), 0)])]})
    port = free_port()
    p = subprocess.Popen([sys.executable, EXPORTER + '/nvmf_qos_exporter.py', '-s', s.path, '-p', str(port)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert 'serving http://127.0.0.1:%d/metrics' % port in p.stdout.readline()
        body = urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port, timeout=10).read().decode()
        assert 'nvmf_qos_host_completed_ios_total{domain="d0",host_nqn="nqn.h1"} 7.0' in body
    finally:
        p.terminate()
        p.wait(10)


# -- a hung application, the tick gap (issue 43) ------------------------------------------


def _silent_socket(tmp_path, accept):
    """A unix socket whose application never answers: like an nvmf_tgt stopped with
    SIGSTOP. `accept`: connections are accepted (and read, never answered); otherwise
    they stay in a listen queue of one, so that connecting blocks once it is full."""
    path = str(tmp_path / 'hung.sock')
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1 if accept else 0)
    conns = []
    stop = threading.Event()

    def serve():
        srv.settimeout(0.05)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                conns.append(c)
            except OSError:
                pass
    t = threading.Thread(target=serve, daemon=True)
    if accept:
        t.start()

    def close():
        stop.set()
        if accept:
            t.join(2)
        for c in conns:
            c.close()
        srv.close()
    return path, close


@pytest.mark.parametrize('accept', [True, False], ids=['accepts-never-answers', 'listen-queue-full'])
def test_a_hung_application_gives_up_zero_within_the_timeout_without_piling_up(tmp_path, accept):
    """Concurrent scrapes of a hung application each end within --timeout (plus a margin)
    with nvmf_qos_up 0: none waits for another's call, none blocks in connect."""
    path, close = _silent_socket(tmp_path, accept)
    try:
        reg = CollectorRegistry()
        reg.register(ex.QosCollector(ex.Source(path, 0.3)))
        took, ups = [], []

        def one():
            t0 = time.monotonic()
            text = generate_latest(reg).decode()
            took.append(time.monotonic() - t0)
            ups.append('nvmf_qos_up{plugin="target"} 0.0' in text)
        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert not any(t.is_alive() for t in threads), 'a scrape still waits'
        assert all(ups) and len(ups) == 8
        assert max(took) < 0.3 + 0.25, took
    finally:
        close()


def test_the_served_exporter_answers_a_hung_target_in_time_and_logs_one_line(tmp_path):
    """The exporter as the unit runs it, --timeout 0.3, in front of a hung application:
    12 scrapes started 50 ms apart (each overlapping the ones before, as when the scrape
    interval is below the time a hung target takes) each answer within a second with
    nvmf_qos_up 0, the process keeps a handful of threads, and each failed scrape is one
    line of log."""
    path, close = _silent_socket(tmp_path, accept=True)
    port = free_port()
    p = subprocess.Popen([sys.executable, EXPORTER + '/nvmf_qos_exporter.py', '-s', path, '-p', str(port),
                          '--timeout', '0.3'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert 'serving' in p.stdout.readline()
        bodies = []

        def one():
            t0 = time.monotonic()
            body = urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port, timeout=5).read().decode()
            bodies.append((time.monotonic() - t0, body))
        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)
        assert len(bodies) == 12
        for took, body in bodies:
            assert took < 1.0, took
            assert 'nvmf_qos_up{plugin="target"} 0.0' in body
        time.sleep(0.5)
        assert len(os.listdir('/proc/%d/task' % p.pid)) < 8, 'threads left waiting'
    finally:
        p.terminate()
        _, err = p.communicate(timeout=10)
        close()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 12 and all('scrape failed' in ln for ln in lines), err


def test_timeout_must_be_positive():
    out = subprocess.run([sys.executable, EXPORTER + '/nvmf_qos_exporter.py', '--timeout', '0'],
                         capture_output=True, text=True)
    assert out.returncode == 2 and '--timeout must be above 0' in out.stderr


def _estimator_log(epochs_gaps):
    return [{'epoch': e, 'budget': 1, 'used': 1, 'offered': 1, 'evidence': 'none', 'step': 'averaged',
             'next': 1, 'longest_tick_gap_ns': g} for e, g in sorted(epochs_gaps, reverse=True)]


def test_longest_tick_gap_over_the_periods_of_the_last_ten_seconds(stub):
    """One host-less full call gives the estimator's log: the gauge is the longest gap of
    the periods that ended in the last 10 s (1 s periods: the last 10), not older ones."""
    d = domain('d0', [host('nqn.h1', 7, cumulative(7, 0, 0), 0)])
    d['epoch'] = 40
    log = dict(domain('d0', []), epoch=40, estimator_periods=_estimator_log(
        [(39, 1_000_000), (35, 48_000_000), (30, 2_000_000), (29, 900_000_000)]))
    fast = dict(domain('e', []), name='e', period_ns=100_000_000, epoch=500)
    fast_log = dict(fast, estimator_periods=_estimator_log([(499, 1_500_000), (400, 700_000_000)]))

    def stats(params):
        if params.get('host_nqn') == '':
            assert params['periods'] == 64, params  # 100 ms periods: 10 s is 100 of them, at most 64
            return [log, fast_log]
        return [d, fast]
    s = stub({'qos_stats_get': stats})
    _, m = scrape(s.path)
    assert ('qos_stats_get', {'periods': 64, 'host_nqn': ''}) in s.calls
    assert value(m, 'nvmf_qos_domain_longest_tick_gap_seconds', domain='d0') == pytest.approx(0.048)
    assert value(m, 'nvmf_qos_domain_longest_tick_gap_seconds', domain='e') == pytest.approx(0.0015)


def test_no_tick_gap_from_a_plugin_without_it(stub):
    calls = []

    def stats(params):
        calls.append(params)
        if params.get('host_nqn') == '':
            return {'error': {'code': -22, 'message': 'Invalid parameters'}}
        return [domain('d0', [])]
    s = stub({'qos_stats_get': stats})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_up', plugin='target') == 1
    assert 'nvmf_qos_domain_longest_tick_gap_seconds' not in m
    # The full form has the log already: no second call.
    full = dict(domain('d0', []), epoch=5, estimator_periods=_estimator_log([(4, 3_000_000)]))
    s2 = stub({'qos_stats_get': [full]})
    _, m = scrape(s2.path, compact=False)
    assert [c for c in s2.calls if c[0] == 'qos_stats_get'] == [('qos_stats_get', None)]
    assert value(m, 'nvmf_qos_domain_longest_tick_gap_seconds', domain='d0') == pytest.approx(0.003)


def test_requirements_are_pinned_and_the_lock_has_the_same_pins_with_hashes():
    """requirements.txt pins exact versions; requirements.lock (make install's, pip
    --require-hashes) pins the same ones, each with at least one sha256."""
    def reqs(name):
        text = open(os.path.join(EXPORTER, name)).read().replace('\\\n', ' ')
        out = {}
        for line in text.splitlines():
            line = line.split('#', 1)[0].strip()
            if line:
                pin, *hashes = line.split()
                assert '==' in pin, '%s: %s is not an exact pin' % (name, pin)
                pkg, version = pin.split('==')
                out[pkg.lower()] = (version, [h for h in hashes if h.startswith('--hash=sha256:')])
        return out
    pinned, locked = reqs('requirements.txt'), reqs('requirements.lock')
    assert {k: v for k, (v, _) in pinned.items()} == {k: v for k, (v, _) in locked.items()}
    for pkg, (_, hashes) in locked.items():
        assert hashes and all(len(h) == len('--hash=sha256:') + 64 for h in hashes), pkg


def test_the_circulation_of_a_domain_over_it(stub):
    """Over the hosts' circulation (issue 39) the domain's N, H* and held commands are
    gauges."""
    d = domain('d0', [])
    d['operating_point']['circulation'] = {'commands': 160, 'hold_target': 50, 'held': 49}
    s = stub({'qos_stats_get': [d]})
    _, m = scrape(s.path)
    assert value(m, 'nvmf_qos_domain_circulation_commands', domain='d0') == 160
    assert value(m, 'nvmf_qos_domain_circulation_hold_target', domain='d0') == 50
    assert value(m, 'nvmf_qos_domain_circulation_held', domain='d0') == 49
    # Not learned (N* given): no ratio; learned for eta: the held/open rate.
    assert 'nvmf_qos_domain_circulation_held_open_ratio' not in m
    d['operating_point']['circulation']['learned'] = {'n_star': 110, 'ratio': 0.975, 'triplets': 40}
    _, m = scrape(stub({'qos_stats_get': [d]}).path)
    assert value(m, 'nvmf_qos_domain_circulation_held_open_ratio', domain='d0') == 0.975
