"""A real Prometheus server (Debian's `prometheus`) scraping the exporter, which reads a
stub JSON-RPC server whose counters grow at a rate the test changes: checks through
Prometheus's HTTP query API that the per-host rate and the held-time histogram arrive
and follow the load. Runs without SPDK (the test against a real nvmf_tgt is
test_real_target.py). Skipped, saying so, when prometheus is not installed."""

import subprocess
import sys
import threading
import time

import pytest
from promserver import PROMETHEUS, Prometheus

from conftest import EXPORTER, domain, free_port, host

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason='SKIPPED: no prometheus binary '
                                '(apt-get install prometheus; .ci/run installs it)')


class Load:
    """Counters that grow at `rate` I/O per second; every 10th I/O held 2 ms."""

    def __init__(self, rate):
        self.lock = threading.Lock()
        self.rate = rate
        self.t = time.monotonic()
        self.ios = 0.0

    def set_rate(self, rate):
        with self.lock:
            self._advance()
            self.rate = rate

    def _advance(self):
        now = time.monotonic()
        self.ios += self.rate * (now - self.t)
        self.t = now

    def stats(self, params):
        with self.lock:
            self._advance()
            ios = int(self.ios)
        held = ios // 10
        cum = [ios - held] * 9 + [ios] * 10  # 2 ms lands in the 2.5 ms bucket (index 8)
        cum[8] = ios
        return [domain('d0', [host('nqn.h1', ios, cum, held * 2_000_000, res_iops=1000)])]


@pytest.fixture
def exporter(stub):
    load = Load(1000)
    s = stub({'qos_stats_get': load.stats})
    port = free_port()
    p = subprocess.Popen([sys.executable, EXPORTER + '/nvmf_qos_exporter.py', '-s', s.path, '-p', str(port)],
                         stdout=subprocess.DEVNULL)
    yield load, port
    p.terminate()
    p.wait(10)


def test_prometheus_sees_rates_and_held_histogram_follow_the_load(exporter):
    load, port = exporter
    prom = Prometheus(['127.0.0.1:%d' % port])
    try:
        rate = 'rate(nvmf_qos_host_completed_ios_total{host_nqn="nqn.h1"}[4s])'
        r = prom.wait_for(rate, lambda r: r and 800 < r[0][1] < 1200)
        assert r[0][0]['domain'] == 'd0'
        p99 = 'histogram_quantile(0.99, rate(nvmf_qos_host_held_seconds_bucket{host_nqn="nqn.h1"}[4s]))'
        r = prom.wait_for(p99, lambda r: r and 0.001 <= r[0][1] <= 0.0025)
        held = 'rate(nvmf_qos_host_held_seconds_sum[4s]) / rate(nvmf_qos_host_held_seconds_count[4s])'
        prom.wait_for(held, lambda r: r and abs(r[0][1] - 0.0002) < 0.00005)
        load.set_rate(5000)
        prom.wait_for(rate, lambda r: r and 4000 < r[0][1] < 6000)
        load.set_rate(0)
        prom.wait_for(rate, lambda r: r and r[0][1] < 1)
        up = prom.query('nvmf_qos_up{plugin="target"}')
        assert up and up[0][1] == 1
    finally:
        prom.stop()
