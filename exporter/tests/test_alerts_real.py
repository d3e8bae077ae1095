"""Every alert of dashboards/alerts.yml fires in a real Prometheus (Debian's
`prometheus`) that scrapes the exporter in front of a real nvmf_tgt with the target
plugin and of bdevperf with the initiator plugin (and, in a test of its own, the
cluster agent's /metrics), each alert driven by the condition it describes:

- NvmfQosExporterDown: an exporter stopped.
- NvmfQosReservationMissed, NvmfQosReservationUnreachable, NvmfQosHeldLatencyHigh,
  NvmfQosReservationsAboveCapacity: a starved reservation. Host `capped` reserves 2000
  IOPS but has a limit of 1 MiB/s (256 of its 4 KiB reads a second) and 64 commands
  outstanding: held at its limit every period (backlogged) and short of its
  reservation (missed), lagging all period in vain (unreachable), its reads waiting
  about 250 ms in QoS (held p99); the estimator of its domain sees reservations
  starve, drops the estimate and holds it at the reservations (reservations take all
  of the estimate).
- NvmfQosHostNotConfigured: host `unconf` does I/O through a QoS bdev at the target
  without QoS settings (best effort).
- NvmfQosTargetDown: the target hung (SIGSTOP), then restarted without the plugin (no
  LD_PRELOAD): the exporter reports nvmf_qos_up{plugin="target"} 0 both times; the
  exporter in front of bdevperf (no target plugin there) never fires it.
- NvmfQosInitiatorVendorErrors and NvmfQosInitiatorPassThrough: that restart fails the
  token-protocol commands of the initiator QoS bdevs (hosts `coop` and `unconf`:
  aborted at the disconnection, then refused with invalid opcode by the target without
  the plugin) and their engines give up (pass-through).
- NvmfQosAgentEtcdUnreachable, NvmfQosAgentShareRefused, NvmfQosAgentDown:
  nvmf-qos-agent `run --listen` in front of a stub target that refuses a host's share,
  then stops answering (no etcd alert then), with its etcd stopped, then killed.

The rules are loaded as a copy with every duration divided by 60 (`for: 5m` becomes
5s, a `[10m]` range 10s: a minute of the real rules is a second here), each alert's
expression otherwise unchanged (checked). Prometheus scrapes and evaluates every
second; the exporters' RPC timeout is 0.7 s, below the 1 s scrape timeout (the
operations guide asks the same of a real deployment). After each alert fires, the
commands of its runbook section (docs/operations.md) are run as written: the queries
against the test's target or initiator, the commands that change things checked
against rpc.py's own parser (their method and options exist), one of them run; what
needs systemd, a kernel host or a TLS etcd is listed as not run.

Runs where SPDK is present and both plugins are built (`make test-exporter` builds
them); the agent test where etcd (Debian's `etcd-server`) and the agent are. Elsewhere
each is skipped with the reason."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml
from promserver import PROMETHEUS, Prometheus
from spdkapp import (RELEASE, REPO, SPDK_DIR, Proc, initiator_lib, plugin_lib, remove_shm, remove_socket, skip_reason,
                     start_app)

from conftest import EXPORTER, free_port

RULES = os.path.join(REPO, 'dashboards', 'alerts.yml')
RUNBOOK = os.path.join(REPO, 'docs', 'operations.md')
PROMTOOL = shutil.which('promtool')
SCALE = 60
EXPORTER_TIMEOUT = '0.7'
NQN = 'nqn.2014-08.io.nvmf-qos:alerts-'
SUBNQN = 'nqn.2016-06.io.spdk:alerts-'
# Hosts: (name, domain, QD of its bdevperf job, initiator QoS bdev over its namespace).
HOSTS = [('capped', 'd', 64, None), ('unconf', 'e', 4, 'qu'), ('coop', 'e', 8, 'qc')]
NS_UUID = '6a1e7700-0000-4000-8000-00000000000%d'


# -- the rules, scaled ----------------------------------------------------------------

_UNITS = {'ms': 0.001, 's': 1, 'm': 60, 'h': 3600, 'd': 86400}


def _seconds(d):
    m = re.fullmatch(r'(\d+)(ms|s|m|h|d)', d)
    assert m, 'duration %r: only one unit is scaled' % d
    return int(m.group(1)) * _UNITS[m.group(2)]


def _scaled(d):
    s = _seconds(d) / SCALE
    assert s == int(s), 'duration %s is not a whole number of seconds / %d' % (d, SCALE)
    return '%ds' % s


_RANGE = re.compile(r'\[(\d+(?:ms|s|m|h|d))\]')


def scaled_rules():
    """dashboards/alerts.yml with every `for:` and range window divided by SCALE."""
    rules = yaml.safe_load(open(RULES))
    for g in rules['groups']:
        for r in g['rules']:
            r['expr'] = _RANGE.sub(lambda m: '[%s]' % _scaled(m.group(1)), r['expr'])
            if 'for' in r:
                r['for'] = _scaled(r['for'])
    return rules


def test_the_scaled_rules_differ_only_in_durations(tmp_path):
    """The copy the real-target test loads: the same alerts, labels, annotations and
    expressions but for the durations (scaled by 1/60), valid for promtool."""
    orig = yaml.safe_load(open(RULES))
    scaled = scaled_rules()
    blank = lambda e: _RANGE.sub('[R]', e)  # noqa: E731
    pairs = [(a, b) for g, h in zip(orig['groups'], scaled['groups']) for a, b in zip(g['rules'], h['rules'])]
    assert len(pairs) == sum(len(g['rules']) for g in orig['groups']) >= 10
    for a, b in pairs:
        assert blank(a['expr']) == blank(b['expr']), a['alert']
        assert [_seconds(x) for x in _RANGE.findall(a['expr'])] == \
            [SCALE * _seconds(x) for x in _RANGE.findall(b['expr'])], a['alert']
        assert _seconds(a.get('for', '0s')) == SCALE * _seconds(b.get('for', '0s')), a['alert']
        assert {k: v for k, v in a.items() if k not in ('expr', 'for')} == \
            {k: v for k, v in b.items() if k not in ('expr', 'for')}
    if PROMTOOL:
        path = tmp_path / 'alerts.yml'
        path.write_text(yaml.safe_dump(scaled))
        out = subprocess.run([PROMTOOL, 'check', 'rules', str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


# -- watching the alerts --------------------------------------------------------------

class AlertWatch:
    """Polls Prometheus's /api/v1/alerts every 0.3 s in a thread and keeps when each
    alert (label set) was seen firing, once per episode (a short-lived alert, such as
    vendor errors in a 5 s window, is not missed between two looks)."""

    def __init__(self, prom):
        self.prom = prom
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.firing = []  # (seconds since start, labels): each time an alert began firing
        self.episodes = []
        self.active = []  # the last answer
        self.errors = 0
        self.stop_flag = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop_flag:
            try:
                alerts = self.prom.alerts()
            except Exception:  # noqa: BLE001 - Prometheus busy; next look
                self.errors += 1
                time.sleep(0.3)
                continue
            now = time.monotonic() - self.t0
            with self.lock:
                self.active = alerts
                for a in alerts:
                    # One entry per episode: a resolved alert that fires again has a new activeAt.
                    key = (a['labels'], a.get('activeAt'))
                    if a['state'] == 'firing' and key not in self.episodes:
                        self.episodes.append(key)
                        self.firing.append((now, a['labels']))
            time.sleep(0.3)

    def fired(self, name, **labels):
        with self.lock:
            return [(t, lv) for t, lv in self.firing if lv['alertname'] == name
                    and all(lv.get(k) == v for k, v in labels.items())]

    def is_active(self, name, **labels):
        with self.lock:
            return any(a['labels']['alertname'] == name and all(a['labels'].get(k) == v for k, v in labels.items())
                       for a in self.active)

    def wait_firing(self, name, timeout, since=0.0, **labels):
        """The labels of alert `name` (with `labels`) once it fired after `since`
        (seconds of the watch); fails after `timeout` s with what was active."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [(t, lv) for t, lv in self.fired(name, **labels) if t >= since]
            if hits:
                print('  %-36s firing at %5.1f s: %s' % (name, hits[0][0], {k: v for k, v in hits[0][1].items()
                                                                          if k not in ('alertname', 'severity')}))
                return hits[0][1]
            time.sleep(0.2)
        with self.lock:
            active = [(a['labels'], a['state']) for a in self.active]
        raise AssertionError('%s %s did not fire within %ss; active: %r' % (name, labels, timeout, active))

    def wait_resolved(self, name, timeout, **labels):
        deadline = time.monotonic() + timeout
        while self.is_active(name, **labels):
            assert time.monotonic() < deadline, '%s %s still active after %ss' % (name, labels, timeout)
            time.sleep(0.2)

    def now(self):
        return time.monotonic() - self.t0

    def stop(self):
        self.stop_flag = True
        self.thread.join(5)


# -- the runbook ----------------------------------------------------------------------

def runbook_spans(alert):
    """The inline code of alert's runbook section (whitespace folded)."""
    text = open(RUNBOOK).read()
    m = re.search(r'^### %s\n(.*?)(?=^#)' % alert, text, re.M | re.S)
    assert m, 'docs/operations.md has no section ### %s' % alert
    return [' '.join(s.split()) for s in re.findall(r'`([^`]+)`', m.group(1))]


class Runbook:
    """Runs the commands of runbook sections as written: `rpc` is the rpc.py of the SPDK
    the target runs (SPDK_DIR/scripts/rpc.py; the PyPI package's newer spdk-rpc sends
    save_config options v25.09 refuses) with the qos_rpc plugin (rpc-scripts on
    PYTHONPATH) against the target's socket, or the initiator's for qos_ini_* methods."""

    QUERY = re.compile(r'^(\w+_get|spdk_get_version|thread_get_stats|save_config)$')

    def __init__(self, target_sock, ini_sock, ports):
        self.socks = {'target': target_sock, 'initiator': ini_sock}
        self.ports = ports  # documented port -> the test's
        rpc_py = os.path.join(SPDK_DIR, 'scripts', 'rpc.py')
        if os.path.isfile(rpc_py):
            self.env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'rpc-scripts') + ':' +
                            os.path.join(SPDK_DIR, 'python'))
            self.rpc_py = [sys.executable, rpc_py]
        else:
            self.env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'rpc-scripts'))
            self.rpc_py = [os.path.join(os.path.dirname(sys.executable), 'spdk-rpc')]
        self.not_run = []
        self.ran = 0

    def rpc(self, *args, timeout=None, sock=None):
        argv = [*self.rpc_py, '--plugin', 'qos_rpc', '-s', sock or self.socks['target']]
        if timeout is not None:
            argv += ['-t', str(timeout)]
        return subprocess.run(argv + list(args), env=self.env, capture_output=True, text=True, timeout=60)

    def run(self, alert, values, expect=None, rpc_timeout=None):
        """Every command of alert's section, placeholders (DOMAIN, NQN, N, HOST) from
        `values`; `expect` maps a command as written (or its method) to text its output
        must hold, or to 'fails' when it must fail. Returns {method: output}."""
        outs = {}
        for span in runbook_spans(alert):
            words = span.split()
            if words[0] == 'rpc':
                want = (expect or {}).get(span, (expect or {}).get(words[1]))
                outs[words[1]] = self._rpc(alert, span, values, want, rpc_timeout)
            elif words[0].startswith('qos_') and len(words) > 1 and words[1].startswith('-'):
                self._options_exist(alert, words)
            elif words[0] == 'curl':
                self._curl(alert, span)
            elif words[0] in ('systemctl', 'journalctl', 'nvme'):
                self.not_run.append('%s: `%s` (no systemd unit or kernel host in this test)' % (alert, span))
        return outs

    def _rpc(self, alert, span, values, expect, rpc_timeout):
        span = span.split(' > ')[0]  # `rpc save_config > file`: the output is enough
        words = [values.get(w, w) for w in shlex.split(span)[1:]]
        method = words[0]
        if '...' in words or not self.QUERY.match(method) and method != values.get('run_change'):
            self._options_exist(alert, [w for w in words if w != '...'])
            return None
        sock = self.socks['initiator' if method.startswith('qos_ini_') else 'target']
        out = self.rpc(*words, timeout=rpc_timeout, sock=sock)
        text = out.stdout + out.stderr
        self.ran += 1
        if expect == 'fails':
            assert out.returncode != 0, '%s: `%s` answered:\n%s' % (alert, span, text)
        else:
            assert out.returncode == 0, '%s: `%s` failed:\n%s' % (alert, span, text)
            for want in [expect] if isinstance(expect, str) else expect or []:
                assert want in text, '%s: `%s` does not say %r:\n%s' % (alert, span, want, text[-3000:])
        return text

    def _options_exist(self, alert, words):
        """A command that changes things: its method and options exist in rpc.py."""
        out = self.rpc(words[0], '-h')
        assert out.returncode == 0, '%s: no rpc.py method %s:\n%s' % (alert, words[0], out.stdout + out.stderr)
        for w in words[1:]:
            if w.startswith('-'):
                assert re.search(r'(^|[\s,\[])%s[\s,=\]]' % re.escape(w), out.stdout), \
                    '%s: rpc.py %s has no option %s:\n%s' % (alert, words[0], w, out.stdout)

    def _curl(self, alert, span):
        if shutil.which('curl') is None:
            self.not_run.append('%s: `%s` (no curl here: apt-get install curl)' % (alert, span))
            return
        if any(p in span for p in ('CA', 'CERT', 'ETCD')):
            self.not_run.append('%s: `%s` (a TLS etcd; the agent test runs a plain one)' % (alert, span))
            return
        cmd = span.replace('HOST', '127.0.0.1')
        for doc_port, port in self.ports.items():
            cmd = cmd.replace(':%d/' % doc_port, ':%d/' % port)
        out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout, '%s: `%s` gave nothing:\n%s' % (alert, cmd, out.stderr)
        self.ran += 1


# -- the real target ------------------------------------------------------------------

def _configure(c, port, plugin):
    """The target's bdevs, domains, hosts and subsystems (with the plugin), or the same
    subsystems over plain malloc bdevs (without it)."""
    c.call('nvmf_create_transport', {'trtype': 'TCP'})
    if plugin:
        c.call('qos_domain_create', {'name': 'd', 'capacity_iops': 20000, 'capacity_mibps': 1000,
                                     'period_ms': 500})
        c.call('qos_domain_create', {'name': 'e', 'capacity_iops': 20000, 'period_ms': 500, 'estimator': False})
        c.call('qos_host_set', {'domain': 'd', 'host_nqn': NQN + 'capped', 'min_iops': 2000, 'max_mibps': 1})
        c.call('qos_host_set', {'domain': 'e', 'host_nqn': NQN + 'coop', 'min_iops': 500, 'max_iops': 4000})
    for i, (name, dom, _, _) in enumerate(HOSTS):
        c.call('bdev_malloc_create', {'name': 'M' + name, 'num_blocks': 16384, 'block_size': 4096})
        bdev = 'M' + name
        if plugin:
            c.call('qos_bdev_create', {'name': 'q' + name, 'base_bdev_name': bdev, 'domain': dom,
                                       'host_nqn': NQN + name})
            bdev = 'q' + name
        c.call('nvmf_create_subsystem', {'nqn': SUBNQN + name, 'allow_any_host': False})
        c.call('nvmf_subsystem_add_host', {'nqn': SUBNQN + name, 'host': NQN + name})
        c.call('nvmf_subsystem_add_ns', {'nqn': SUBNQN + name, 'namespace': {'bdev_name': bdev,
                                                                            'uuid': NS_UUID % i}})
        c.call('nvmf_subsystem_add_listener', {'nqn': SUBNQN + name, 'listen_address': {
            'trtype': 'TCP', 'adrfam': 'IPv4', 'traddr': '127.0.0.1', 'trsvcid': str(port)}})


def _bdevperf_config(port):
    """bdevperf's bdev configuration: a controller per host (reconnecting every second
    for ever, I/O retried), the initiator QoS bdevs; and its job file."""
    cfg = [{'method': 'bdev_nvme_set_options', 'params': {'bdev_retry_count': -1}}]
    jobs = ''
    for name, _, qd, ini in HOSTS:
        cfg.append({'method': 'bdev_nvme_attach_controller', 'params': {
            'name': 'N' + name, 'trtype': 'TCP', 'adrfam': 'IPv4', 'traddr': '127.0.0.1', 'trsvcid': str(port),
            'subnqn': SUBNQN + name, 'hostnqn': NQN + name, 'ctrlr_loss_timeout_sec': -1,
            'reconnect_delay_sec': 1}})
        if ini:
            cfg.append({'method': 'qos_ini_bdev_create', 'params': {'name': ini, 'base_bdev_name': 'N%sn1' % name}})
        jobs += '[%s]\nfilename=%s\nrw=randread\nbs=4096\niodepth=%d\n' % (name, ini or 'N%sn1' % name, qd)
    cfg.append({'method': 'bdev_wait_for_examine'})
    return {'subsystems': [{'subsystem': 'bdev', 'config': cfg}]}, jobs


def _exporter(sock, tmp_path, tag):
    port = free_port()
    p = Proc([sys.executable, os.path.join(EXPORTER, 'nvmf_qos_exporter.py'), '-s', sock, '-p', str(port),
              '-t', EXPORTER_TIMEOUT], tmp_path / ('exporter-%s.log' % tag))
    return p, '127.0.0.1:%d' % port


@pytest.mark.skipif(skip_reason(initiator=True) is not None, reason=skip_reason(initiator=True) or '')
def test_every_alert_fires_on_a_real_target(tmp_path, spdk_lock, hugepages):
    t_start = time.monotonic()
    rules = tmp_path / 'alerts.yml'
    rules.write_text(yaml.safe_dump(scaled_rules()))
    tgt_sock = '/var/tmp/nvmf-qos-alerts-it-%d.sock' % os.getpid()
    ini_sock = '/var/tmp/nvmf-qos-alerts-ini-%d.sock' % os.getpid()
    port = free_port()
    procs = []
    prom = watch = bp = None
    try:
        tgt, c = start_app('bin/nvmf_tgt', ['-m', '0x1', '-i', '73'], tgt_sock, tmp_path / 'nvmf_tgt.log',
                           preload=plugin_lib(), max_secs=240)
        procs.append(tgt)
        _configure(c, port, plugin=True)
        cfg, jobs = _bdevperf_config(port)
        (tmp_path / 'bdev.json').write_text(json.dumps(cfg))
        (tmp_path / 'jobs.conf').write_text(jobs)
        bp, _ = start_app('examples/bdevperf', ['--json', str(tmp_path / 'bdev.json'), '-j',
                                                 str(tmp_path / 'jobs.conf'), '-t', '200', '-m', '0x2', '-i', '74',
                                                 '-f'], ini_sock, tmp_path / 'bdevperf.log',
                           preload=initiator_lib(), max_secs=240, probe='bdev_get_bdevs')
        procs.append(bp)
        ex_t, at_t = _exporter(tgt_sock, tmp_path, 'target')
        ex_i, at_i = _exporter(ini_sock, tmp_path, 'initiator')
        ex_spare, at_spare = _exporter(tgt_sock, tmp_path, 'spare')
        procs += [ex_t, ex_i, ex_spare]
        prom = Prometheus([at_t, at_i, at_spare], rule_files=[str(rules)])
        health = [(r['name'], r['health'], r.get('lastError')) for g in prom.rules() for r in g['rules']]
        assert len(health) >= 10 and all(h != 'err' for _, h, _ in health), health
        watch = AlertWatch(prom)
        book = Runbook(tgt_sock, ini_sock, {9633: int(at_t.split(':')[1])})
        print('\nstarted in %.1f s; phase 1: the target under load' % (time.monotonic() - t_start))

        # 1. An exporter stops.
        prom.wait_for('up{instance="%s"}' % at_spare, lambda r: r and r[0][1] == 1)
        ex_spare.stop()
        watch.wait_firing('NvmfQosExporterDown', 20, instance=at_spare)
        book.run('NvmfQosExporterDown', {})
        # 2. The starved reservation, the host without settings, the initiator told so.
        capped, unconf = NQN + 'capped', NQN + 'unconf'
        watch.wait_firing('NvmfQosReservationMissed', 40, host_nqn=capped, instance=at_t)
        # The target retries an unreachable host after 2, 4, 8, 16 periods, clearing the
        # flag each time, and the scaled rule's `for: 5s` restarts then: it fires once the
        # retries are far enough apart (11 s here alone; it did not within 40 s once in a
        # full `make test` on 2026-11-29, and fired at 11 s when rerun right after).
        watch.wait_firing('NvmfQosReservationUnreachable', 90, host_nqn=capped, instance=at_t)
        watch.wait_firing('NvmfQosHeldLatencyHigh', 40, host_nqn=capped, instance=at_t)
        watch.wait_firing('NvmfQosReservationsAboveCapacity', 40, domain='d', instance=at_t)
        watch.wait_firing('NvmfQosHostNotConfigured', 40, host_nqn=unconf, instance=at_t)
        on_capped = {'DOMAIN': 'd', 'NQN': capped, 'N': '2000', 'run_change': 'qos_host_update'}
        book.run('NvmfQosReservationMissed', on_capped, {'rpc qos_stats_get -d DOMAIN --table': ['MET', 'FLAGS', '0.0%'],
                                                         'rpc qos_stats_get -d DOMAIN': 'estimator_periods'})
        book.run('NvmfQosReservationUnreachable', on_capped, {'qos_stats_get': ['"in_flight_at_base"', '"reservation_depth_needed"']})
        book.run('NvmfQosReservationsAboveCapacity', on_capped, {
            'rpc qos_stats_get -d DOMAIN --table': '(reservations take all of it)',
            'rpc qos_stats_get -d DOMAIN': ['"estimator_periods"', '"reserved"']})
        book.run('NvmfQosHeldLatencyHigh', on_capped, {'qos_stats_get': capped})
        outs = book.run('NvmfQosHostNotConfigured', {'DOMAIN': 'e', 'NQN': unconf},
                        {'qos_bdev_get': unconf, 'save_config': 'qos_bdev_create'})
        assert unconf not in outs['qos_host_get'], 'the host is missing from qos_host_get'

        # 3. The target hangs.
        print('phase 2: the target stopped (SIGSTOP) at %.1f s' % watch.now())
        since = watch.now()
        tgt.signal_app(signal.SIGSTOP)
        try:
            watch.wait_firing('NvmfQosTargetDown', 20, since=since, instance=at_t)
            book.run('NvmfQosTargetDown', {}, {'spdk_get_version': 'fails', 'qos_domain_get': 'fails',
                                               'thread_get_stats': 'fails'}, rpc_timeout=1)
        finally:
            tgt.signal_app(signal.SIGCONT)
        watch.wait_resolved('NvmfQosTargetDown', 20, instance=at_t)

        # 4. Restarted without the plugin.
        print('phase 3: the target restarted without the plugin at %.1f s' % watch.now())
        since = watch.now()
        c.close()
        tgt.stop()
        remove_socket(tgt_sock)
        tgt, c = start_app('bin/nvmf_tgt', ['-m', '0x1', '-i', '75'], tgt_sock, tmp_path / 'nvmf_tgt-plain.log',
                           preload=None, max_secs=120)
        procs.append(tgt)
        _configure(c, port, plugin=False)
        watch.wait_firing('NvmfQosTargetDown', 20, since=since, instance=at_t)
        book.run('NvmfQosTargetDown', {}, {'qos_domain_get': 'fails'})
        out = book.rpc('qos_domain_get')
        assert 'Method not found' in out.stdout + out.stderr, out
        watch.wait_firing('NvmfQosInitiatorVendorErrors', 30, bdev='qc', instance=at_i)
        for bdev in ('qc', 'qu'):
            watch.wait_firing('NvmfQosInitiatorPassThrough', 30, bdev=bdev, instance=at_i)
        book.run('NvmfQosInitiatorVendorErrors', {}, {'qos_ini_stats_get': '"vendor_errors"'})
        book.run('NvmfQosInitiatorPassThrough', {'DOMAIN': 'e'},
                 {'qos_ini_stats_get': '"pass_through"', 'qos_host_get': 'fails'})

        # An initiator's exporter (no target plugin there) is not a target down.
        assert not watch.fired('NvmfQosTargetDown', instance=at_i), watch.fired('NvmfQosTargetDown')
        assert bp.p.poll() is None, 'bdevperf exited:\n' + bp.log_text()[-3000:]
        print('runbook: %d commands run as written; not run here: %s' % (
            book.ran, '; '.join(book.not_run) or 'none'))
        print('every target and initiator alert fired; %.0f s in all' % (time.monotonic() - t_start))
    finally:
        if watch is not None:
            watch.stop()
        if prom is not None:
            prom.stop()
        for p in reversed(procs):
            # bdevperf with controllers that reconnect for ever takes 20 s to end on
            # SIGTERM: nothing of it is checked after, so it is killed after 2 s.
            p.stop(grace=2 if p is bp else 20)
        remove_shm(74)
        remove_socket(tgt_sock)
        remove_socket(ini_sock)


# -- the cluster agent ----------------------------------------------------------------

ETCD = shutil.which('etcd') or ('/usr/bin/etcd' if os.path.exists('/usr/bin/etcd') else None)


def agent_binary():
    for profile in ('release', 'debug'):
        p = os.path.join(os.path.dirname(RELEASE), profile, 'nvmf-qos-agent')
        if os.path.isfile(p):
            return p
    return None


def _agent_skip():
    if PROMETHEUS is None:
        return 'SKIPPED: no prometheus binary (apt-get install prometheus)'
    if ETCD is None:
        return 'SKIPPED: no etcd binary (apt-get install etcd-server)'
    if agent_binary() is None:
        return 'SKIPPED: nvmf-qos-agent not built (cargo build --release -p nvmf-qos-agent)'
    return None


@pytest.mark.skipif(_agent_skip() is not None, reason=_agent_skip() or '')
def test_agent_alerts_fire(tmp_path, stub):
    """nvmf-qos-agent `run --listen` in front of a stub target (the agent's RPC calls
    answered as the plugin would): the target refuses the host's share
    (NvmfQosAgentShareRefused, and `show` says so); the target stops answering while etcd
    is fine (no NvmfQosAgentEtcdUnreachable: the agent still checks etcd); etcd stopped
    (NvmfQosAgentEtcdUnreachable, and the runbook's health check says why); the agent
    killed (NvmfQosAgentDown)."""
    rules = tmp_path / 'alerts.yml'
    rules.write_text(yaml.safe_dump(scaled_rules()))
    hosts = {}
    target = stub({'qos_stats_get': [{'name': 'agent', 'period_ns': 500_000_000,
                                      'capacity_estimate': {'ops': 25_000}, 'hosts': []}],
                   'qos_host_get': lambda p: list(hosts.values()),
                   'qos_host_set': lambda p: hosts.update({p['host_nqn']: p}) or True,
                   'qos_host_remove': lambda p: hosts.pop(p['host_nqn'], None) and True})
    client, peer, listen = free_port(), free_port(), free_port()
    url = 'http://127.0.0.1:%d' % client
    etcd = Proc([ETCD, '--name', 'alerts', '--data-dir', str(tmp_path / 'etcd'), '--listen-client-urls', url,
                 '--advertise-client-urls', url, '--listen-peer-urls', 'http://127.0.0.1:%d' % peer,
                 '--initial-advertise-peer-urls', 'http://127.0.0.1:%d' % peer,
                 '--initial-cluster', 'alerts=http://127.0.0.1:%d' % peer], tmp_path / 'etcd.log')
    agent = prom = watch = None
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + '/health', timeout=1).read()
                break
            except OSError:
                assert time.monotonic() < deadline, 'etcd did not start:\n' + etcd.log_text()
                time.sleep(0.2)
        created = subprocess.run([agent_binary(), '--etcd', url, 'cluster', 'create', '--cluster', 'c'],
                                 capture_output=True, text=True, timeout=30)
        assert created.returncode == 0, created.stdout + created.stderr
        agent = Proc([agent_binary(), '--etcd', url, 'run', '--cluster', 'c', '--target', 't1', '--domain', 'agent',
                      '--rpc-socket', target.path, '--interval-ms', '200', '--lease-ttl-s', '2',
                      '--listen', '127.0.0.1:%d' % listen], tmp_path / 'agent.log')
        at = '127.0.0.1:%d' % listen
        prom = Prometheus([], rule_files=[str(rules)], jobs={'nvmf_qos_agent': [at]})
        prom.wait_for('nvmf_qos_agent_etcd_up{instance="%s"}' % at, lambda r: r and r[0][1] == 1)
        watch = AlertWatch(prom)
        # The target refuses the share of a host set right after the agent started.
        target.answers['qos_host_set'] = {'error': {'code': -28, 'message': 'reservation exceeds the capacity'}}
        nqn = 'nqn.2014-08.io.nvmf-qos:agent-h1'
        host_set = subprocess.run([agent_binary(), '--etcd', url, 'host', 'set', '--cluster', 'c', '--host-nqn', nqn,
                                   '--min-iops', '1000'], capture_output=True, text=True, timeout=30)
        assert host_set.returncode == 0, host_set.stdout + host_set.stderr
        watch.wait_firing('NvmfQosAgentShareRefused', 30, instance=at, host_nqn=nqn)
        show = subprocess.run([agent_binary(), '--etcd', url, 'show', '--cluster', 'c'], capture_output=True,
                              text=True, timeout=30)
        assert 'REFUSED share of %s (reservation 1000 IOPS, no limit, weight 1): target refused qos_host_set: ' \
            'reservation exceeds the capacity (code -28)' % nqn in show.stdout, show.stdout + show.stderr
        target.answers['qos_host_set'] = lambda p: hosts.update({p['host_nqn']: p}) or True
        watch.wait_resolved('NvmfQosAgentShareRefused', 30, instance=at)
        # The target stops answering; etcd is fine: no etcd alert (5 times its `for:`).
        stats = target.answers.pop('qos_stats_get')
        prom.wait_for('nvmf_qos_agent_target_up{instance="%s"}' % at, lambda r: r and r[0][1] == 0)
        time.sleep(5)
        assert not watch.fired('NvmfQosAgentEtcdUnreachable'), watch.fired('NvmfQosAgentEtcdUnreachable')
        target.answers['qos_stats_get'] = stats
        prom.wait_for('nvmf_qos_agent_target_up{instance="%s"}' % at, lambda r: r and r[0][1] == 1)
        etcd.stop()
        watch.wait_firing('NvmfQosAgentEtcdUnreachable', 30, instance=at)
        book = Runbook(target.path, target.path, {9635: listen})
        book.run('NvmfQosAgentEtcdUnreachable', {})
        health = urllib.request.Request('http://%s/healthz' % at)
        try:
            body = urllib.request.urlopen(health, timeout=5).read().decode()
        except urllib.error.HTTPError as ex:  # 503 once etcd is away longer than the lease
            body = ex.read().decode()
        assert 'etcd' in body, body
        print('\n/healthz: %s; not run here: %s' % (body.strip(), '; '.join(book.not_run)))
        agent.stop()
        watch.wait_firing('NvmfQosAgentDown', 30, instance=at)
    finally:
        if watch is not None:
            watch.stop()
        if prom is not None:
            prom.stop()
        if agent is not None:
            agent.stop()
        etcd.stop()
