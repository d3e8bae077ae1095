#  SPDX-License-Identifier: Apache-2.0
"""What a scrape costs the target: starts nvmf_tgt with the target plugin, configures
one domain with N + 1 hosts and times qos_host_set (adding the last hosts, updating
some) and qos_stats_get in its full form, its compact form (what the exporter asks
for), for one host and for no host (the exporter's call for the monitor's tick gap), printing the app thread's busy time per call (from
thread_get_stats, less its idle load), the mean wall time per call seen by the client
and the size of the answer.

    flock /tmp/nvmf-qos-target.lock .venv/bin/python exporter/tools/stats_cost.py --hosts 1024

SPDK_DIR (default /opt/spdk) and NVMF_QOS_TGT_LIB (default target/release/) choose the
builds. The calls run on nvmf_tgt's app thread, the thread of the QoS monitor, so the
time per call is time the monitor cannot run.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nvmf_qos_exporter import Client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--hosts', type=int, default=1024)
    p.add_argument('--calls', type=int, default=20)
    p.add_argument('--lib', default=os.environ.get('NVMF_QOS_TGT_LIB',
                                                    os.path.join(REPO, 'target/release/libnvmf_qos_tgt.so')))
    p.add_argument('--old', action='store_true', help='the plugin predates compact/host_nqn: time the full form only')
    args = p.parse_args()
    spdk = os.environ.get('SPDK_DIR', '/opt/spdk')
    sock = '/var/tmp/nvmf-qos-stats-cost-%d.sock' % os.getpid()
    tgt = subprocess.Popen(['timeout', '-s', 'KILL', '600', 'env', 'LD_LIBRARY_PATH=%s/build/lib' % spdk,
                            'LD_PRELOAD=' + args.lib, '%s/build/bin/nvmf_tgt' % spdk, '-m', '0x1', '-i', '73',
                            '-u', '--disable-cpumask-locks', '-r', sock],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        c = None
        for _ in range(100):
            try:
                c = Client(sock, timeout=60.0)
                c.call('spdk_get_version')
                break
            except Exception:
                c = None
                time.sleep(0.3)
        assert c is not None, 'nvmf_tgt did not start'
        c.call('qos_domain_create', {'name': 'd0', 'capacity_iops': 4_000_000, 'estimator': False})

        def app_busy():
            st = c.call('thread_get_stats')
            app = next(t for t in st['threads'] if t['name'] == 'app_thread')
            return app['busy'], st['tick_rate']

        def host(i, max_iops=2000):
            return {'domain': 'd0', 'host_nqn': 'nqn.2014-08.io.example:host-%04d' % i,
                    'min_iops': 1000, 'max_iops': max_iops}

        first = max(args.hosts - args.calls, 0)
        t0 = time.monotonic()
        for i in range(first):
            c.call('qos_host_set', host(i))
        set_ms = (time.monotonic() - t0) * 1000 / max(first, 1)
        # The app thread's own load (monitor ticks, pollers) over an idle second, with
        # all but the last hosts configured.
        b0, rate = app_busy()
        time.sleep(1.0)
        b1, _ = app_busy()
        idle_ms = (b1 - b0) * 1000 / rate

        def busy_per_call(calls):
            """App-thread time per call of `calls` (a list of (method, params)), ms."""
            b0, _ = app_busy()
            t0 = time.monotonic()
            for method, params in calls:
                r = c.call(method, params)
            wall = time.monotonic() - t0
            b1, _ = app_busy()
            busy = (b1 - b0) / rate - idle_ms / 1000 * wall
            return busy * 1000 / len(calls), wall * 1000 / len(calls), r

        add_ms, add_wall, _ = busy_per_call([('qos_host_set', host(i)) for i in range(first, args.hosts + 1)])
        upd_ms, upd_wall, _ = busy_per_call([('qos_host_set', host(i % args.hosts, 3000 + i))
                                             for i in range(args.calls)])
        time.sleep(2.5)  # a few periods of history
        forms = [('full', {})]
        if not args.old:
            forms += [('compact', {'compact': True}),
                      ('one host', {'compact': True, 'host_nqn': 'nqn.2014-08.io.example:host-0007'}),
                      # The exporter's second call: the estimator log for the tick gap.
                      ('no host', {'periods': 10, 'host_nqn': ''})]
        print('nvmf_tgt with %d hosts in one domain (%s)' % (args.hosts + 1, args.lib))
        print('  qos_host_set: %.2f ms wall per call on average while adding them' % set_ms)
        print('  app thread busy without calls: %.1f ms per second' % idle_ms)
        print('  qos_host_set add:     %8.2f ms of app thread per call (%7.2f ms wall), the last %d hosts'
              % (add_ms, add_wall, args.hosts + 1 - first))
        print('  qos_host_set update:  %8.2f ms of app thread per call (%7.2f ms wall), %d calls'
              % (upd_ms, upd_wall, args.calls))
        for name, params in forms:
            c.call('qos_stats_get', params)  # warm
            ms, wall, r = busy_per_call([('qos_stats_get', params)] * args.calls)
            size = len(json.dumps(r))
            print('  qos_stats_get %-9s %8.2f ms of app thread per call (%7.2f ms wall), %9d bytes of JSON'
                  % (name + ':', ms, wall, size))
    finally:
        try:
            os.killpg(tgt.pid, 15)
            tgt.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(tgt.pid, 9)
        if os.path.exists(sock):
            os.unlink(sock)
    return 0


if __name__ == '__main__':
    sys.exit(main())
