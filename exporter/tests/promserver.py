"""A real Prometheus server for tests (Debian's `prometheus` package): started on
127.0.0.1 on a port of its own with its own config and storage, scraping the given
targets every second (job `nvmf_qos`, and further jobs when given), evaluating the
given rule files as often, stopped (and its files removed) when the test ends."""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

from conftest import free_port

PROMETHEUS = shutil.which('prometheus') or ('/usr/bin/prometheus' if os.path.exists('/usr/bin/prometheus') else None)


class Prometheus:
    def __init__(self, targets, scrape_interval='1s', rule_files=(), jobs=None):
        """`targets` are scraped by job `nvmf_qos`; `jobs` maps further job names to
        their targets; `rule_files` are paths of rule files."""
        self.dir = tempfile.mkdtemp(prefix='qos-prom-')
        self.port = free_port()
        config = os.path.join(self.dir, 'prometheus.yml')
        all_jobs = {'nvmf_qos': targets, **(jobs or {})}
        with open(config, 'w') as f:
            f.write('global:\n  scrape_interval: %s\n  evaluation_interval: %s\n' % (scrape_interval,
                                                                                     scrape_interval))
            if rule_files:
                f.write('rule_files: [%s]\n' % ', '.join('"%s"' % r for r in rule_files))
            f.write('scrape_configs:\n')
            for job, tgts in all_jobs.items():
                f.write('  - job_name: %s\n    static_configs:\n      - targets: [%s]\n' % (
                    job, ', '.join('"%s"' % t for t in tgts)))
        self.log = open(os.path.join(self.dir, 'prometheus.log'), 'w')
        self.proc = subprocess.Popen(
            [PROMETHEUS, '--config.file=' + config, '--storage.tsdb.path=' + os.path.join(self.dir, 'data'),
             '--web.listen-address=127.0.0.1:%d' % self.port],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = 'http://127.0.0.1:%d' % self.port
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + '/-/ready', timeout=2).read()
                break
            except OSError as ex:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.log_text()
                    self.stop()
                    raise RuntimeError('prometheus did not start; log:\n' + log) from ex
                time.sleep(0.2)

    def log_text(self):
        with open(os.path.join(self.dir, 'prometheus.log')) as f:
            return f.read()

    def query(self, expr):
        """Instant query; returns [(labels, float value)]."""
        url = self.url + '/api/v1/query?' + urllib.parse.urlencode({'query': expr})
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body['status'] == 'success', body
        return [(r['metric'], float(r['value'][1])) for r in body['data']['result']]

    def alerts(self):
        """The alerts of the loaded rules now (GET /api/v1/alerts): each with `labels`
        (`alertname` among them), `state` (pending or firing) and `annotations`."""
        body = json.loads(urllib.request.urlopen(self.url + '/api/v1/alerts', timeout=10).read())
        assert body['status'] == 'success', body
        return body['data']['alerts']

    def rules(self):
        """The loaded rule groups (GET /api/v1/rules): their rules with health and
        last error."""
        body = json.loads(urllib.request.urlopen(self.url + '/api/v1/rules', timeout=10).read())
        assert body['status'] == 'success', body
        return body['data']['groups']

    def wait_for(self, expr, ok, timeout=30):
        """Polls `expr` until ok(result) holds; returns the result (asserts on time-out)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.query(expr)
            if ok(last):
                return last
            time.sleep(0.5)
        raise AssertionError('%s: condition not met within %ss; last result %r' % (expr, timeout, last))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
