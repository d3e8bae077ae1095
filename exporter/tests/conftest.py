"""Shared pieces of the exporter's tests: a stub SPDK JSON-RPC server on a unix socket
(answers from a dict of method -> result or callable), statistics shaped like the
target plugin's `qos_stats_get` (compact form), free ports, and for the tests against
real SPDK applications the machine-wide SPDK lock and hugepages."""

import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

EXPORTER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, EXPORTER)

BOUNDS_NS = [0, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
             5_000_000, 10_000_000, 25_000_000, 50_000_000, 100_000_000, 250_000_000,
             500_000_000, 1_000_000_000, 2_500_000_000]


class StubRpcServer:
    """A JSON-RPC 2.0 server on a unix socket, speaking like SPDK's: one JSON object
    per request, answers with `result` or `error`. Unknown methods answer -32601."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []
        self.dir = tempfile.mkdtemp(prefix='qos-stub-')
        self.path = os.path.join(self.dir, 'spdk.sock')
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        buf = ''
        dec = json.JSONDecoder()
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data.decode()
                while True:
                    buf = buf.lstrip()
                    try:
                        req, idx = dec.raw_decode(buf)
                    except ValueError:
                        break
                    buf = buf[idx:]
                    conn.sendall(json.dumps(self._answer(req)).encode())

    def _answer(self, req):
        method = req.get('method')
        params = req.get('params')
        self.calls.append((method, params))
        reply = {'jsonrpc': '2.0', 'id': req.get('id')}
        if method not in self.answers:
            reply['error'] = {'code': -32601, 'message': 'Method not found'}
            return reply
        a = self.answers[method]
        if callable(a):
            a = a(params)
        if isinstance(a, dict) and set(a) == {'error'}:
            reply['error'] = a['error']
        else:
            reply['result'] = a
        return reply

    def close(self):
        self._stop = True
        try:
            self.sock.close()
        finally:
            if os.path.exists(self.path):
                os.unlink(self.path)
            os.rmdir(self.dir)


def host(nqn, ios, held_cum, sum_ns, group=None, res_iops=None, max_iops=None):
    """One host of a compact qos_stats_get answer."""
    h = {
        'host_nqn': nqn, 'configured': True,
        'min': {'total': {'iops': res_iops}} if res_iops else {},
        'max': {'total': {'iops': max_iops}} if max_iops else {},
        'weight': 1, 'priority': 'medium',
        'reservation_per_period': {'ops': res_iops or 0, 'bytes': 0},
        'completed_this_period': {'ops': 10, 'bytes': 40960, 'ios': 10},
        'completed_total': {'ops': ios, 'bytes': ios * 4096, 'ios': ios},
        'held': 3, 'throttled_ios': held_cum[-1] - held_cum[0], 'hold_events': 7,
        'held_by': {'limit': held_cum[-1] - held_cum[0], 'burst': 0, 'reservation': 0, 'share': 0,
                    'budget': 0, 'window': 0, 'bypassed': 0},
        'held_time': {'cumulative': held_cum, 'count': held_cum[-1], 'sum_ns': sum_ns},
        'periods_total': {'met': 5, 'missed': 1, 'met_backlogged': 2, 'missed_backlogged': 4},
        'reservation_met_fraction': 0.58, 'reservation_tokens': {'ops': 1, 'bytes': None},
        'credit_tokens': {'ops': 0, 'bytes': 0}, 'limit_left': {'ops': None, 'bytes': None},
        'underuse_flag': False, 'reservation_at_risk': True, 'reservation_unreachable': res_iops is not None,
        'in_flight_at_base': 2.5, 'reservation_depth_needed': 0.75 if res_iops else None,
        'entitlement': {'contending': True, 'held_fraction': 0.8, 'at_target': 30.0, 'at_target_peak': 36, 'cap': None,
                        'entitled': 40000, 'achieved': 39000, 'shortfall': 1000,
                        'queue_depth_needed': 6.5} if res_iops else None,
    }
    if group is not None:
        h['group'] = group
    return h


def cumulative(n_zero, n_held, bucket_index):
    """Cumulative bucket counts: n_zero at 0 s, n_held in bucket `bucket_index`."""
    out = []
    for i in range(len(BOUNDS_NS) + 1):
        out.append(n_zero + (n_held if i >= bucket_index else 0))
    return out


def domain(name, hosts, estimate_ops=400_000):
    return {'name': name, 'epoch': 12, 'period_ns': 1_000_000_000, 'elapsed_ns': 300_000_000,
            'capacity_estimate': {'ops': estimate_ops, 'bytes': None},
            'global_available': {'ops': 1234, 'bytes': None},
            'operating_point': {'efficiency_milli': 970, 'in_flight': 96, 'ops_per_s': 640_000,
                                'max_ops_per_s': 655_000, 'latency_ns': 150_000,
                                'depth_curve': [{'in_flight': 16, 'ops_per_s': 340_000},
                                                {'in_flight': 96, 'ops_per_s': 640_000}]},
            'held_time_bounds_ns': BOUNDS_NS, 'bypass': False, 'pool_paced': False, 'hosts': hosts}


@pytest.fixture
def stub():
    servers = []

    def start(answers):
        s = StubRpcServer(answers)
        servers.append(s)
        return s
    yield start
    for s in servers:
        s.close()


_handed_out = set()


def free_port():
    """A port free now and not handed out before in this test run.

    The kernel may give the same free port twice in a row: a test that takes one for the
    exporter and then one for Prometheus, before the exporter has bound its own, then
    starts both on one port (a `.ci/run` failed so: Address already in use)."""
    while True:
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


@pytest.fixture
def spdk_lock():
    """With NVMF_QOS_SPDK_LOCK=PATH, holds that lock while SPDK runs (on a machine shared
    by several measuring sessions); without it the caller arranges that (e.g. `flock PATH
    make test`: taking the lock here too would wait for the caller forever)."""
    path = os.environ.get('NVMF_QOS_SPDK_LOCK')
    if not path:
        yield
        return
    with open(path, 'w') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
        fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def hugepages():
    """1024 hugepages and a mounted hugetlbfs for the test; both given back after."""
    path = '/proc/sys/vm/nr_hugepages'
    with open(path) as f:
        before = int(f.read().strip() or 0)
    if before < 1024:
        with open(path, 'w') as f:
            f.write('1024')
    with open('/proc/mounts') as f:
        mounted = any(line.split()[2:3] == ['hugetlbfs'] for line in f)
    if not mounted:
        os.makedirs('/dev/hugepages', exist_ok=True)
        subprocess.run(['mount', '-t', 'hugetlbfs', 'nodev', '/dev/hugepages'], check=True)
    yield
    if not mounted:
        subprocess.run(['umount', '/dev/hugepages'], check=False)
    if before < 1024:
        with open(path, 'w') as f:
            f.write(str(before))
