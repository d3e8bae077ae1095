"""The alerts as issue 43's operator trial met them, on a real nvmf_tgt with the plugin,
bdevperf on another core, the exporter with its default --timeout (1 s) and a real
Prometheus scraping and evaluating every 2 s with dashboards/alerts.yml as installed
(not scaled):

1. A load starts on a healthy target (the trial's three hosts, each held at its limit),
   four fifths into a QoS period (bdevperf -z, then perform_tests at that moment), so
   that its first period is a short one: no alert fires in the 2 minutes after
   (NVMF_QOS_TRIAL_HEALTHY_SECS). The trial saw NvmfQosReservationMissed 2-4 s after
   every load start: the first, partial period counted as missed. Whether the target
   counts that period as backlogged varies from run to run, so the test prints whether
   the rule before issue 43, queried beside it, would have fired (the promtool fixtures
   pin the rule down). An alert here fails the test with the target's own account of
   the periods: a busy machine can make the target miss whole periods for real.
2. A CPU quota on nvmf_tgt (3 ms of every 10, cgroup cpu controller): ReservationMissed
   fires within 20 s, and nvmf_qos_domain_longest_tick_gap_seconds shows gaps of at
   least the 7 ms the quota keeps the thread off its core.
3. The target hangs (SIGSTOP): NvmfQosTargetDown fires, and the exporter keeps
   answering Prometheus (up stays 1: no NvmfQosExporterDown). The trial saw the
   opposite: its exporter's calls piled up behind a 3 s timeout.

Runs where SPDK is present and the target plugin is built, with a writable cgroup cpu
controller (v1 or v2); elsewhere SKIPPED with the reason. About 4 minutes."""

import json
import os
import signal
import sys
import time

import pytest
from promserver import Prometheus
from spdkapp import Proc, plugin_lib, remove_shm, remove_socket, skip_reason, start_app
from test_alerts_real import RULES, AlertWatch

from conftest import EXPORTER, free_port

HEALTHY_SECS = int(os.environ.get('NVMF_QOS_TRIAL_HEALTHY_SECS', '120'))
NQN = 'nqn.2014-08.io.nvmf-qos:trial-'
SUBNQN = 'nqn.2016-06.io.spdk:trial-'
# The trial's hosts: (name, reservation IOPS, limit IOPS), each with 32 commands outstanding.
HOSTS = [('h1', 100000, 200000), ('h2', 50000, 150000), ('h3', None, 50000)]
CGROUP_V1 = '/sys/fs/cgroup/cpu'
CGROUP_V2 = '/sys/fs/cgroup'


class CpuQuota:
    """A cgroup with a CPU quota (`quota_us` of every `period_us`) that threads are moved
    into, and out of again (back to the root group) when it is lifted; then removed."""

    def __init__(self, name, quota_us, period_us):
        if os.path.isfile(os.path.join(CGROUP_V1, 'cpu.cfs_quota_us')):
            self.v2, self.root = False, CGROUP_V1
        elif os.path.isfile(os.path.join(CGROUP_V2, 'cgroup.subtree_control')):
            self.v2, self.root = True, CGROUP_V2
        else:
            raise OSError('no cgroup cpu controller at %s or %s' % (CGROUP_V1, CGROUP_V2))
        self.dir = os.path.join(self.root, name)
        os.mkdir(self.dir)
        try:
            if self.v2:
                with open(os.path.join(self.root, 'cgroup.subtree_control'), 'w') as f:
                    f.write('+cpu')
                self._write('cpu.max', '%d %d' % (quota_us, period_us))
            else:
                self._write('cpu.cfs_period_us', str(period_us))
                self._write('cpu.cfs_quota_us', str(quota_us))
        except OSError:
            os.rmdir(self.dir)
            raise
        self.moved = []

    def _write(self, name, value, base=None):
        with open(os.path.join(base or self.dir, name), 'w') as f:
            f.write(value)

    def add(self, pid):
        """Every thread of `pid` (v1: each thread; v2: the process)."""
        if self.v2:
            self._write('cgroup.procs', str(pid))
            self.moved.append(pid)
            return
        for tid in os.listdir('/proc/%d/task' % pid):
            self._write('tasks', tid)
            self.moved.append(int(tid))

    def lift(self):
        name = 'cgroup.procs' if self.v2 else 'tasks'
        for t in self.moved:
            try:
                self._write(name, str(t), base=self.root)
            except OSError:  # the thread ended
                pass
        self.moved = []
        os.rmdir(self.dir)


def quota_skip():
    try:
        q = CpuQuota('nvmf-qos-probe-%d' % os.getpid(), 3000, 10000)
        q.lift()
        return None
    except OSError as ex:
        return 'SKIPPED: no writable cgroup cpu controller for the CPU quota (%s)' % ex


def _skip():
    return skip_reason() or (quota_skip() if not skip_reason() else None)


def _configure(c, port):
    c.call('nvmf_create_transport', {'trtype': 'TCP'})
    c.call('qos_domain_create', {'name': 'd', 'capacity_iops': 600000, 'capacity_iops_stddev': 20000,
                                 'per_host_max_iops': 600000})
    for i, (name, res, lim) in enumerate(HOSTS):
        p = {'domain': 'd', 'host_nqn': NQN + name, 'max_iops': lim}
        if res:
            p['min_iops'] = res
        c.call('qos_host_set', p)
        c.call('bdev_malloc_create', {'name': 'M' + name, 'num_blocks': 16384, 'block_size': 4096})
        c.call('qos_bdev_create', {'name': 'q' + name, 'base_bdev_name': 'M' + name, 'domain': 'd',
                                   'host_nqn': NQN + name})
        c.call('nvmf_create_subsystem', {'nqn': SUBNQN + name, 'allow_any_host': False})
        c.call('nvmf_subsystem_add_host', {'nqn': SUBNQN + name, 'host': NQN + name})
        c.call('nvmf_subsystem_add_ns', {'nqn': SUBNQN + name, 'namespace': {'bdev_name': 'q' + name}})
        c.call('nvmf_subsystem_add_listener', {'nqn': SUBNQN + name, 'listen_address': {
            'trtype': 'TCP', 'adrfam': 'IPv4', 'traddr': '127.0.0.1', 'trsvcid': str(port)}})


def _bdevperf_files(tmp_path, port):
    cfg = [{'method': 'bdev_nvme_attach_controller', 'params': {
        'name': 'N' + name, 'trtype': 'TCP', 'adrfam': 'IPv4', 'traddr': '127.0.0.1', 'trsvcid': str(port),
        'subnqn': SUBNQN + name, 'hostnqn': NQN + name}} for name, _, _ in HOSTS]
    cfg.append({'method': 'bdev_wait_for_examine'})
    (tmp_path / 'bdev.json').write_text(json.dumps({'subsystems': [{'subsystem': 'bdev', 'config': cfg}]}))
    (tmp_path / 'jobs.conf').write_text(''.join(
        '[%s]\nfilename=N%sn1\nrw=randread\nbs=4096\niodepth=32\n' % (name, name) for name, _, _ in HOSTS))


def _history(c):
    """The target's own account of the last periods (why an alert fired): per host
    (epoch, ops, met, backlogged), and the estimator's decisions."""
    d = c.call('qos_stats_get', {'domain': 'd', 'periods': 128})[0]
    lines = ['%s %s %s' % (h['host_nqn'][-2:], h['periods_total'], [
        (p['epoch'], p['ops'], int(p['met']), int(p['backlogged'])) for p in reversed(h['periods'])])
        for h in d['hosts']]
    lines += ['estimator %s' % [(r['epoch'], r['budget'], r['used'], r['evidence'], r['step'], r['next'],
                                 r['longest_tick_gap_ns'] // 1000) for r in reversed(d['estimator_periods'])]]
    return '\n'.join(lines)


# The rule before issue 43, to say whether this load start is one it fired on.
OLD_MISSED = ('sum by (host_nqn) (increase(nvmf_qos_host_periods_total{outcome="missed", backlogged="true"}[10m]))'
              ' / sum by (host_nqn) (increase(nvmf_qos_host_periods_total{backlogged="true"}[10m])) > 0.01')


@pytest.mark.skipif(_skip() is not None, reason=_skip() or '')
def test_alerts_at_a_load_start_a_cpu_quota_and_a_hung_target(tmp_path, spdk_lock, hugepages):
    t0 = time.monotonic()
    sock = '/var/tmp/nvmf-qos-trial-%d.sock' % os.getpid()
    bp_sock = '/var/tmp/nvmf-qos-trial-bp-%d.sock' % os.getpid()
    port = free_port()
    procs, quota, tgt = [], None, None
    prom = watch = None
    try:
        tgt, c = start_app('bin/nvmf_tgt', ['-m', '0x1', '-i', '83'], sock, tmp_path / 'nvmf_tgt.log',
                           preload=plugin_lib(), max_secs=600)
        procs.append(tgt)
        _configure(c, port)
        _bdevperf_files(tmp_path, port)
        ex_port = free_port()
        exporter = Proc([sys.executable, os.path.join(EXPORTER, 'nvmf_qos_exporter.py'), '-s', sock,
                         '-p', str(ex_port)], tmp_path / 'exporter.log')  # the default --timeout
        procs.append(exporter)
        at = '127.0.0.1:%d' % ex_port
        prom = Prometheus([at], scrape_interval='2s', rule_files=[RULES])
        prom.wait_for('nvmf_qos_up{plugin="target", instance="%s"}' % at, lambda r: r and r[0][1] == 1)
        time.sleep(6)  # the idle target scraped a few times: the load's start is seen
        watch = AlertWatch(prom)

        # 1. The load starts on a healthy target.
        print('\nstarted in %.1f s; phase 1: a load starts, %d s watched' % (time.monotonic() - t0, HEALTHY_SECS))
        bp, bpc = start_app('examples/bdevperf', ['--json', str(tmp_path / 'bdev.json'), '-j',
                                                   str(tmp_path / 'jobs.conf'), '-t', '500', '-m', '0x2', '-i', '84',
                                                   '-z'], bp_sock, tmp_path / 'bdevperf.log', max_secs=600,
                             probe='bdev_get_bdevs')
        procs.append(bp)
        # Four fifths into a period: the load's first period is a fifth of one.
        d = c.call('qos_stats_get', {'domain': 'd', 'compact': True, 'host_nqn': ''})[0]
        period = d['period_ns'] / 1e9
        time.sleep((0.8 - d['elapsed_ns'] / 1e9 / period) % 1.0 * period)
        # perform_tests answers when the run ends: sent, not waited for.
        bpc.send('perform_tests', {})
        started = watch.now()
        old_fired = set()
        while watch.now() < started + HEALTHY_SECS:
            for s in prom.query(OLD_MISSED):
                old_fired.add(s[0]['host_nqn'])
            time.sleep(2)
        assert not watch.firing, 'alerts fired on a healthy target after a load start: %s\n%s' % (
            watch.firing, _history(c))
        rates = {s[0]['host_nqn']: s[1] for s in prom.query('rate(nvmf_qos_host_completed_ios_total[30s])')}
        backlogged = {s[0]['host_nqn']: s[1] for s in prom.query(
            'sum by (host_nqn) (increase(nvmf_qos_host_periods_total{backlogged="true"}[%ds]))' % HEALTHY_SECS)}
        missed = {s[0]['host_nqn']: s[1] for s in prom.query(
            'sum by (host_nqn) (increase(nvmf_qos_host_periods_total{outcome="missed", backlogged="true"}[%ds]))'
            % HEALTHY_SECS)}
        short = lambda d: {k[-2:]: round(v) for k, v in d.items()}  # noqa: E731
        print('  no alert in %d s; IOPS per host %s; backlogged periods %s, missed %s; the rule before issue 43 '
              'would have fired for %s' % (HEALTHY_SECS, short(rates), short(backlogged), short(missed),
                                           sorted(k[-2:] for k in old_fired) or 'none'))
        for name, _, lim in HOSTS:
            assert rates.get(NQN + name, 0) > lim * 0.5, ('the host did not run at its limit', name, rates)
            assert backlogged.get(NQN + name, 0) > HEALTHY_SECS / 2, ('the host was not held', name, backlogged)

        # 2. A CPU quota on the target: 3 ms of every 10.
        since = watch.now()
        print('phase 2: a CPU quota on nvmf_tgt at %.1f s' % since)
        quota = CpuQuota('nvmf-qos-trial-%d' % os.getpid(), 3000, 10000)
        quota.add(tgt.app_pid())
        # 20 s: the rule needs three backlogged periods missed, and since the pace's steady
        # schedule (2026-11-29) a host is held for another only once that one is behind
        # its steady line: one .ci/run took more than 10 s, the next run 6.3 s.
        fired = watch.wait_firing('NvmfQosReservationMissed', 20, since=since, instance=at)
        took = [t for t, lv in watch.fired('NvmfQosReservationMissed') if t >= since][0] - since
        gap = prom.wait_for('max_over_time(nvmf_qos_domain_longest_tick_gap_seconds{instance="%s"}[10s])' % at,
                            lambda r: r and r[0][1] > 0.007, timeout=20)
        print('  ReservationMissed %.1f s after the quota (%s); longest tick gap %.1f ms' % (
            took, fired['host_nqn'], gap[0][1] * 1e3))
        quota.lift()
        quota = None

        # 3. The target hangs.
        since = watch.now()
        print('phase 3: nvmf_tgt stopped (SIGSTOP) at %.1f s' % since)
        tgt.signal_app(signal.SIGSTOP)
        try:
            watch.wait_firing('NvmfQosTargetDown', 90, since=since, instance=at)
            took = [t for t, lv in watch.fired('NvmfQosTargetDown') if t >= since][0] - since
            up = prom.query('min_over_time(up{instance="%s"}[%ds])' % (at, int(took) + 2))
            assert up and up[0][1] == 1, ('the exporter failed a scrape of the hung target', up)
            assert not watch.is_active('NvmfQosExporterDown'), watch.active
            print('  TargetDown %.1f s after the hang; the exporter answered every scrape' % took)
        finally:
            tgt.signal_app(signal.SIGCONT)
        assert bp.p.poll() is None, 'bdevperf exited:\n' + bp.log_text()[-3000:]
        print('%.0f s in all' % (time.monotonic() - t0))
    finally:
        if quota is not None:
            quota.lift()
        if watch is not None:
            watch.stop()
        if prom is not None:
            prom.stop()
        for p in reversed(procs):
            p.stop(grace=2 if p is not tgt else 20)
        remove_shm(84)
        remove_socket(sock)
        remove_socket(bp_sock)

