"""The exporter in front of a real nvmf_tgt (with the target plugin) under load from
spdk_nvme_perf, scraped by a real Prometheus: checks through Prometheus's HTTP query API
that the host's I/O rate and its held-time histogram are there and move when the load
changes (a limit of 1000 IOPS, then 4000, then no load).

Runs where SPDK is present (every path of spdk-present.list under SPDK_DIR, the
definition the Makefile uses) and the plugin is built (`make test-exporter` builds it);
elsewhere it is skipped with the reason. With NVMF_QOS_SPDK_LOCK=PATH it holds that lock
while SPDK runs, so that only one SPDK measurement runs on a shared machine at a time."""

import os
import subprocess
import sys
import time

import pytest
from promserver import Prometheus
from spdkapp import REPO, SPDK_DIR, Proc, plugin_lib, remove_socket, skip_reason, start_app

from conftest import EXPORTER, free_port

HOST = 'nqn.2014-08.io.nvmf-qos:exporter-it-host'
SUBSYS = 'nqn.2016-06.io.spdk:exporter-it'
PORT = '4471'

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or '')


@pytest.fixture
def target(tmp_path, spdk_lock, hugepages):
    sock = '/var/tmp/nvmf-qos-exporter-it-%d.sock' % os.getpid()
    tgt, client = start_app('bin/nvmf_tgt', ['-m', '0x1', '-i', '71'], sock, tmp_path / 'nvmf_tgt.log',
                            preload=plugin_lib())
    try:
        yield sock, client
        client.close()
    finally:
        tgt.stop()
        remove_socket(sock)


def screenshot(prom, exprs, path):
    """Prometheus's graph page with `exprs`, drawn by headless Chromium (Debian's
    `chromium`)."""
    import shutil
    import urllib.parse
    q = {'g%d.%s' % (i, k): v for i, e in enumerate(exprs)
         for k, v in (('expr', e), ('tab', '0'), ('range_input', '1m'), ('stacked', '0'))}
    url = prom.url + '/graph?' + urllib.parse.urlencode(q)
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    assert chromium, 'QOS_SCREENSHOT needs chromium (apt-get install chromium)'
    subprocess.run([chromium, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                    '--window-size=1400,1420', '--virtual-time-budget=8000', '--screenshot=' + os.path.abspath(path),
                    url], check=True, capture_output=True, timeout=120)


def test_prometheus_follows_a_real_target_under_load(target, tmp_path):
    sock, c = target
    c.call('bdev_malloc_create', {'name': 'Malloc0', 'num_blocks': 65536, 'block_size': 512})
    c.call('qos_domain_create', {'name': 'd0', 'capacity_iops': 20000, 'period_ms': 500,
                                 'estimator': False})
    c.call('qos_host_set', {'domain': 'd0', 'host_nqn': HOST, 'min_iops': 500, 'max_iops': 1000})
    c.call('qos_bdev_create', {'name': 'qos0', 'base_bdev_name': 'Malloc0', 'domain': 'd0', 'host_nqn': HOST})
    c.call('nvmf_create_transport', {'trtype': 'TCP'})
    c.call('nvmf_create_subsystem', {'nqn': SUBSYS, 'allow_any_host': False})
    c.call('nvmf_subsystem_add_host', {'nqn': SUBSYS, 'host': HOST})
    c.call('nvmf_subsystem_add_ns', {'nqn': SUBSYS, 'namespace': {'bdev_name': 'qos0'}})
    c.call('nvmf_subsystem_add_listener', {'nqn': SUBSYS, 'listen_address': {
        'trtype': 'TCP', 'adrfam': 'IPv4', 'traddr': '127.0.0.1', 'trsvcid': PORT}})

    port = free_port()
    exporter = Proc([sys.executable, os.path.join(EXPORTER, 'nvmf_qos_exporter.py'), '-s', sock, '-p', str(port)],
                    tmp_path / 'exporter.log')
    prom = None
    perf = None
    try:
        prom = Prometheus(['127.0.0.1:%d' % port])
        trid = 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:%s subnqn:%s hostnqn:%s' % (PORT, SUBSYS, HOST)
        perf = Proc(['timeout', '-s', 'KILL', '90', 'env', 'LD_LIBRARY_PATH=' + os.path.join(SPDK_DIR, 'build/lib'),
                     os.path.join(SPDK_DIR, 'build/bin/spdk_nvme_perf'), '-r', trid, '-q', '16', '-o', '4096',
                     '-w', 'randread', '-t', '60', '-c', '0x2', '-i', '72', '--no-huge', '-s', '256'],
                    tmp_path / 'perf.log')
        sel = '{host_nqn="%s",domain="d0"}' % HOST
        rate = 'rate(nvmf_qos_host_completed_ios_total%s[4s])' % sel
        p90 = 'histogram_quantile(0.9, rate(nvmf_qos_host_held_seconds_bucket%s[4s]))' % sel

        # Longer phases when the run is drawn for the docs.
        dwell = 12 if os.environ.get('QOS_SCREENSHOT') else 0
        # 1. Limited to 1000 IOPS with 16 commands outstanding: most I/O waits.
        # Between its reservation (500) and its limit (1000, +15% for the 4 s window).
        r1 = prom.wait_for(rate, lambda r: r and 450 <= r[0][1] <= 1150, timeout=40)
        h1 = prom.wait_for(p90, lambda r: r and r[0][1] >= 0.001, timeout=20)
        thr = prom.wait_for('rate(nvmf_qos_host_throttled_ios_total%s[4s])' % sel,
                            lambda r: r and r[0][1] > 100, timeout=20)
        time.sleep(dwell)
        watch = os.environ.get('QOS_WATCH_OUT')
        if watch:  # for docs/operations.md: the live view, against this target
            env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'rpc-scripts'))
            out = subprocess.run([os.path.join(os.path.dirname(sys.executable), 'spdk-rpc'), '-s', sock,
                                  '--plugin', 'qos_rpc', 'qos_stats_get', '--table', '--watch', '2',
                                  '--iterations', '2'], env=env, capture_output=True, text=True, timeout=30)
            with open(watch, 'w') as f:
                f.write(out.stdout + out.stderr)
        # 2. The limit goes up to 4000: the rate follows, the held time falls.
        c.call('qos_host_set', {'domain': 'd0', 'host_nqn': HOST, 'min_iops': 500, 'max_iops': 4000})
        r2 = prom.wait_for(rate, lambda r: r and r[0][1] >= max(2000, 1.8 * r1[0][1]), timeout=30)
        h2 = prom.wait_for(p90, lambda r: r and r[0][1] < h1[0][1], timeout=20)
        time.sleep(dwell)
        # The compact form (typed) carries the full form's fields but the history.
        full = c.call('qos_stats_get', {'domain': 'd0'})[0]
        compact = c.call('qos_stats_get', {'domain': 'd0', 'compact': True})[0]
        history = {'last_periods', 'periods', 'reservation_met_fraction_backlogged', 'soft_granted'}
        assert set(compact) == set(full) - {'estimator_periods'}
        assert {'budget', 'used', 'offered', 'evidence', 'step', 'next'} <= set(full['estimator_periods'][0])
        assert set(compact['hosts'][0]) == set(full['hosts'][0]) - history
        assert compact['hosts'][0]['min'] == full['hosts'][0]['min'] == {'total': {'iops': 500}}
        one = c.call('qos_stats_get', {'compact': True, 'host_nqn': HOST})
        assert [h['host_nqn'] for d in one for h in d['hosts']] == [HOST]
        periods = prom.query('sum(nvmf_qos_host_periods_total%s)' % sel)
        assert periods and periods[0][1] > 10
        est = prom.query('nvmf_qos_domain_capacity_estimate_iops{domain="d0"}')
        assert est and est[0][1] == 20000
        # 3. The load stops: the rate falls to zero.
        perf.stop()
        r3 = prom.wait_for(rate, lambda r: r and r[0][1] < 1, timeout=30)
        time.sleep(dwell / 2)
        shot = os.environ.get('QOS_SCREENSHOT')
        if shot:  # for docs/operations.md: Prometheus's own graph page
            screenshot(prom, [rate, p90], shot)
        print('\nrate at max 1000: %.0f/s, held p90 %.4f s, throttled %.0f/s; at max 4000: %.0f/s, held p90 %.5f s; '
              'after the load: %.1f/s' % (r1[0][1], h1[0][1], thr[0][1], r2[0][1], h2[0][1], r3[0][1]))
    finally:
        if perf is not None:
            perf.stop()
        if prom is not None:
            prom.stop()
        exporter.stop()
