"""The Grafana dashboard (dashboards/nvmf-qos.json): its structure, that every query
names only metrics the exporter emits, and that a real Prometheus accepts every query
and answers it with series when it scrapes the exporter (in front of a stub target and
initiator). Grafana itself is in neither Debian's nor PyPI's packages, so it is not
started."""

import json
import os
import re
import subprocess
import sys
import time

import nvmf_qos_exporter as ex
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from promserver import PROMETHEUS, Prometheus

from conftest import EXPORTER, cumulative, domain, free_port, host

DASHBOARD = os.path.join(os.path.dirname(EXPORTER), 'dashboards', 'nvmf-qos.json')
INI = [{'name': 'qh1', 'pacer_group': 'default',
        'state': {'mode': 'cooperative', 'held': 0, 'held_total': 4, 'ios': 100, 'large_ios': 2, 'chunks': 32,
                  'vendor_sent': 5, 'vendor_errors': 0, 'aborted': 0, 'held_ns': 1000, 'paced_ns': 2000},
        'pacer': {'allowed_bytes_per_sec': 1e9}}]


def answers(t0=[None]):  # noqa: B006 - a clock shared by the callables
    def stats(_):
        n = int((time.monotonic() - (t0[0] or time.monotonic())) * 1000)
        if t0[0] is None:
            t0[0] = time.monotonic()
        h = host('nqn.h1', n, cumulative(n - n // 10, n // 10, 5), n // 10 * 200_000, res_iops=500, max_iops=2000)
        h['min']['total']['mibps'] = 1
        h['max']['total']['mibps'] = 10
        h['burst'] = {'iops': 6000, 'mibps': None, 'seconds': 30, 'credit_seconds': 30 - n % 30,
                      'bursting': n % 2 == 0, 'bursting_periods': n // 100}
        d = domain('d0', [h])
        # Over the hosts' circulation (the dashboard plots its hold target).
        d['operating_point']['circulation'] = {'commands': 160, 'hold_target': 50, 'held': 49}
        # The estimator's log, which the exporter reads for the tick gap.
        d['estimator_periods'] = [{'epoch': 11, 'longest_tick_gap_ns': 1_200_000}]
        return [d]
    return {'qos_stats_get': stats, 'qos_ini_stats_get': INI}


def panels(d):
    for p in d['panels']:
        yield p
        yield from p.get('panels', [])


def exprs(d):
    return [(p['title'], t['expr']) for p in panels(d) for t in p.get('targets', [])]


def emitted(stub):
    s = stub(answers())
    reg = CollectorRegistry()
    reg.register(ex.QosCollector(ex.Source(s.path, 2.0)))
    names = set()
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        names.update(sample.name for sample in fam.samples)
    return names


def test_dashboard_structure():
    d = json.load(open(DASHBOARD))
    assert d['uid'] and d['title'] and isinstance(d['schemaVersion'], int)
    ids = [p['id'] for p in panels(d)]
    assert len(ids) == len(set(ids)), 'panel ids are unique'
    variables = {v['name'] for v in d['templating']['list']}
    assert {'datasource', 'instance', 'domain', 'host'} <= variables
    titles = ' '.join(p['title'] for p in panels(d)).lower()
    for needed in ('reservation', 'latency', 'held', 'periods', 'capacity', 'burst'):
        assert needed in titles, needed
    for p in panels(d):
        g = p['gridPos']
        assert g['x'] + g['w'] <= 24 and g['h'] > 0
        if p['type'] == 'row':
            continue
        assert p['type'] == 'timeseries' and p['targets'] and p['datasource']['uid'] == '${datasource}'
        for t in p['targets']:
            assert t['refId'] and t['expr']
            for var in re.findall(r'\$(\w+)', t['expr']):
                assert var in variables or var.startswith('__'), (p['title'], var)
            # Per target: every exporter is its own instance, and domain names repeat
            # across targets (a cluster gives every target domain `d`), so every query
            # keeps the instance apart instead of summing over targets.
            assert 'instance=~"$instance"' in t['expr'], (p['title'], t['expr'])
            for by in re.findall(r'by \(([^)]*)\)', t['expr']):
                assert 'instance' in by, (p['title'], t['expr'])


def test_every_query_uses_metrics_the_exporter_emits(stub):
    names = emitted(stub)
    d = json.load(open(DASHBOARD))
    used = set()
    for title, expr in exprs(d):
        for m in re.findall(r'\bnvmf_qos_[a-z_]+', expr):
            assert m in names, '%s: %s is not emitted by the exporter' % (title, m)
            used.add(m)
    assert len(used) >= 15


@pytest.mark.skipif(PROMETHEUS is None, reason='SKIPPED: no prometheus binary (apt-get install prometheus)')
def test_prometheus_accepts_and_answers_every_query(stub):
    s = stub(answers())
    port = free_port()
    p = subprocess.Popen([sys.executable, EXPORTER + '/nvmf_qos_exporter.py', '-s', s.path, '-p', str(port)],
                         stdout=subprocess.DEVNULL)
    prom = Prometheus(['127.0.0.1:%d' % port])
    try:
        d = json.load(open(DASHBOARD))
        prom.wait_for('nvmf_qos_host_completed_ios_total', lambda r: r, timeout=20)
        time.sleep(4)  # a few scrapes, so that rates have two samples
        for title, expr in exprs(d):
            q = (expr.replace('$__rate_interval', '10s').replace('$domain', '.*').replace('$host', '.*')
                 .replace('$instance', '.*'))
            r = prom.query(q)  # asserts status success (the query parses and runs)
            assert r, '%s: no series for %s' % (title, q)
    finally:
        prom.stop()
        p.terminate()
        p.wait(10)
