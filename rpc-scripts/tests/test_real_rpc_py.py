"""The plugin loaded by the real rpc.py, in a subprocess, with --dry-run and against a
fake JSON-RPC server on 127.0.0.1 (no SPDK needed).

Two rpc.py's are tried, each skipped when absent:
  - spdk-25.09: /opt/spdk/scripts/rpc.py (or $SPDK_DIR/scripts/rpc.py); it puts its own
    ../python first on sys.path;
  - pypi: `python -m spdk.spdk_rpc` of the PyPI package `spdk` (the `spdk-rpc` command),
    installed in the interpreter that runs the tests.
"""

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from conftest import RPC_SCRIPTS

SPDK_DIR = os.environ.get('SPDK_DIR', '/opt/spdk')
HOST = 'nqn.2014-08.org.nvmexpress:uuid:6f0c8a2e-1b1d-4a4e-9f57-0d3c2b1a0e11'
SUBSYS = 'nqn.2016-06.io.spdk:cnode1'


def _clean_env():
    env = dict(os.environ)
    env['PYTHONPATH'] = RPC_SCRIPTS
    return env


def _pypi_available():
    probe = subprocess.run([sys.executable, '-c', 'import spdk.spdk_rpc'], env=_clean_env(),
                           stdin=subprocess.DEVNULL, capture_output=True)
    return probe.returncode == 0


def _variants():
    rpc_py = os.path.join(SPDK_DIR, 'scripts', 'rpc.py')
    yield pytest.param([sys.executable, rpc_py], id='spdk-25.09',
                       marks=pytest.mark.skipif(not os.path.exists(rpc_py), reason='no %s' % rpc_py))
    yield pytest.param([sys.executable, '-m', 'spdk.spdk_rpc'], id='pypi',
                       marks=pytest.mark.skipif(not _pypi_available(),
                                                reason='PyPI package spdk not installed (pip install spdk)'))


@pytest.fixture(params=list(_variants()))
def rpc_py(request):
    return request.param


class FakeTarget:
    """A JSON-RPC 2.0 server on 127.0.0.1 that records requests and answers from a table
    (method -> result, or ('error', code, message)); unlisted methods are "Method not
    found", as SPDK answers them. Requests arrive as rpc.py sends them: JSON objects,
    not delimited, several per connection."""

    def __init__(self, answers):
        self.answers = answers
        self.requests = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = ''
        decoder = json.JSONDecoder()
        with conn:
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data.decode()
                while buf.strip():
                    try:
                        req, end = decoder.raw_decode(buf.lstrip())
                    except ValueError:
                        break
                    buf = buf.lstrip()[end:]
                    self.requests.append((req['method'], req.get('params', {})))
                    answer = self.answers.get(req['method'], ('error', -32601, 'Method not found'))
                    resp = {'jsonrpc': '2.0', 'id': req['id']}
                    if isinstance(answer, tuple) and answer[0] == 'error':
                        resp['error'] = {'code': answer[1], 'message': answer[2]}
                    else:
                        resp['result'] = answer
                    conn.sendall(json.dumps(resp).encode())

    def close(self):
        self.sock.close()


@pytest.fixture
def target():
    servers = []

    def start(answers):
        servers.append(FakeTarget(answers))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def rpc(cmd, argv, server=None, stdin=None):
    where = ['-s', '127.0.0.1', '-p', str(server.port)] if server else []
    return subprocess.run(cmd + where + ['--plugin', 'qos_rpc'] + argv, env=_clean_env(),
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def test_dry_run_prints_the_request(rpc_py):
    res = rpc(rpc_py, ['--dry-run', 'qos_host_set', '-d', 'dom0', '-q', HOST, '--min-iops', '1000',
                       '--max-iops', '5000', '-p', 'high'])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith('Request:\n')
    req = json.loads(res.stdout[len('Request:\n'):])
    assert req['method'] == 'qos_host_set'
    assert req['params'] == {'domain': 'dom0', 'host_nqn': HOST, 'min_iops': 1000, 'max_iops': 5000,
                             'priority': 'high'}


@pytest.mark.parametrize('argv,method,params', [
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '400000', '--sharing', 'first_come'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 400000, 'sharing': 'first_come'}),
    (['qos_domain_update', '-n', 'dom0', '--sharing', 'weighted'],
     'qos_domain_update', {'name': 'dom0', 'sharing': 'weighted'}),
    (['qos_group_create', '-d', 'dom0', '-n', 'tenant-a', '--min-iops', '60000', '--max-iops', '100000',
      '-w', '2'],
     'qos_group_create', {'domain': 'dom0', 'name': 'tenant-a', 'min_iops': 60000, 'max_iops': 100000,
                          'weight': 2}),
    (['qos_group_update', '-d', 'dom0', '-n', 'tenant-a', '--max-iops', '0', '--weight', '3'],
     'qos_group_update', {'domain': 'dom0', 'name': 'tenant-a', 'max_iops': 0, 'weight': 3}),
    (['qos_group_delete', '-d', 'dom0', '-n', 'tenant-a'], 'qos_group_delete', {'domain': 'dom0', 'name': 'tenant-a'}),
    (['qos_group_get', '-d', 'dom0', '-n', 'tenant-a'], 'qos_group_get', {'domain': 'dom0', 'name': 'tenant-a'}),
    (['qos_host_set', '-d', 'dom0', '-q', HOST, '--min-iops', '20000', '--group', 'tenant-a'],
     'qos_host_set', {'domain': 'dom0', 'host_nqn': HOST, 'min_iops': 20000, 'group': 'tenant-a'}),
], ids=lambda v: v if isinstance(v, str) else None)
def test_dry_run_sharing_and_groups(rpc_py, argv, method, params):
    res = rpc(rpc_py, ['--dry-run', *argv])
    assert res.returncode == 0, res.stderr
    req = json.loads(res.stdout[len('Request:\n'):])
    assert (req['method'], req['params']) == (method, params)


def test_group_refusal_over_the_socket(rpc_py, target):
    server = target({'qos_group_delete': ('error', -16, 'domain dom0: group tenant-a still has hosts (%s); move '
                                                        'them out first' % HOST)})
    res = rpc(rpc_py, ['qos_group_delete', '-d', 'dom0', '-n', 'tenant-a'], server)
    assert res.returncode == 1
    assert 'group tenant-a still has hosts' in res.stdout
    assert 'Traceback' not in res.stdout + res.stderr
    assert server.requests == [('qos_group_delete', {'domain': 'dom0', 'name': 'tenant-a'})]


def test_group_get_over_the_socket(rpc_py, target):
    groups = [{'domain': 'dom0', 'name': 'tenant-a', 'min_iops': 60000, 'max_iops': 100000, 'weight': 2}]
    server = target({'qos_group_get': groups})
    res = rpc(rpc_py, ['qos_group_get', '-d', 'dom0'], server)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout) == groups


def test_group_validation_error_exits_2_before_connecting(rpc_py, target):
    server = target({})
    res = rpc(rpc_py, ['qos_group_create', '-d', 'dom0', '-n', 'g', '--min-iops', '9', '--max-iops', '5'], server)
    assert res.returncode == 2
    assert "--min-iops 9 is above --max-iops 5: a group's reservation cannot be above its limit" in res.stderr
    assert server.requests == []


def test_dry_run_stats_table_prints_only_the_request(rpc_py):
    res = rpc(rpc_py, ['--dry-run', 'qos_stats_get', '--table'])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout[len('Request:\n'):])['method'] == 'qos_stats_get'


def test_help_lists_the_commands(rpc_py):
    res = rpc(rpc_py, ['--help'])
    assert res.returncode == 0, res.stderr
    for name in ('qos_domain_create', 'qos_host_set', 'qos_group_create', 'qos_group_update', 'qos_group_delete',
                 'qos_group_get', 'qos_bdev_expose', 'qos_stats_get'):
        assert name in res.stdout


def test_create_over_the_socket(rpc_py, target):
    server = target({'qos_domain_create': True})
    res = rpc(rpc_py, ['qos_domain_create', '-n', 'dom0', '--capacity-iops', '400000', '--period-ms', '500'],
              server)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == ''
    assert server.requests == [('qos_domain_create', {'name': 'dom0', 'capacity_iops': 400000, 'period_ms': 500})]


def test_target_error_is_printed_by_rpc_py_with_exit_1(rpc_py, target):
    server = target({'qos_host_set': ('error', -28, 'admission refused: reservations 410000 IOPS > capacity '
                                                    '400000 IOPS')})
    res = rpc(rpc_py, ['qos_host_set', '-d', 'dom0', '-q', HOST, '--min-iops', '410000'], server)
    assert res.returncode == 1
    assert 'admission refused: reservations 410000 IOPS' in res.stdout
    assert 'Traceback' not in res.stdout + res.stderr


def test_validation_error_exits_2_before_connecting(rpc_py, target):
    server = target({})
    res = rpc(rpc_py, ['qos_host_set', '-d', 'dom0', '-q', HOST, '--min-iops', '5', '--min-read-iops', '5'],
              server)
    assert res.returncode == 2
    assert '--min-iops and --min-read-iops cannot be used together' in res.stderr
    assert 'Traceback' not in res.stderr
    assert server.requests == []


def test_stats_table_over_the_socket(rpc_py, target):
    stats = [{'name': 'dom0', 'epoch': 3, 'period_ns': 1000000000, 'elapsed_ns': 0,
              'capacity_estimate': {'ops': 1000, 'bytes': 1048576}, 'global_available': {'ops': 10, 'bytes': 0},
              'hosts': [{'host_nqn': HOST, 'min': {'iops': 100}, 'max': {'iops': 200},
                         'completed_this_period': {'ops': 50, 'bytes': 0}, 'reservation_met_fraction': 0.5,
                         'held': 2, 'underuse_flag': False, 'reservation_at_risk': True}]}]
    server = target({'qos_stats_get': stats})
    res = rpc(rpc_py, ['qos_stats_get', '--table'], server)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[2].split() == [HOST, 'iops=100', 'iops=200', '50', 'ops,', '0.0', 'MiB',
                                                  '50.0%', '2', '-', '-', '-', 'at-risk']


def test_expose_falls_back_when_the_target_lacks_the_method(rpc_py, target):
    server = target({'qos_bdev_create': 'qos0', 'nvmf_subsystem_add_ns': 5, 'nvmf_ns_add_host': True})
    res = rpc(rpc_py, ['qos_bdev_expose', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST,
                       '--nqn', SUBSYS], server)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == '5\n'
    assert [m for m, _ in server.requests] == ['qos_bdev_expose', 'qos_bdev_create', 'nvmf_subsystem_add_ns',
                                               'nvmf_ns_add_host']
    assert server.requests[2][1] == {'nqn': SUBSYS, 'namespace': {'bdev_name': 'qos0', 'no_auto_visible': True}}
    assert server.requests[3][1] == {'nqn': SUBSYS, 'nsid': 5, 'host': HOST}


def test_expose_undo_over_the_socket(rpc_py, target):
    server = target({'qos_bdev_create': 'qos0', 'nvmf_subsystem_add_ns': 5,
                     'nvmf_ns_add_host': ('error', -32602, 'Invalid parameters'),
                     'nvmf_subsystem_remove_ns': True, 'qos_bdev_delete': True})
    res = rpc(rpc_py, ['qos_bdev_expose', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST,
                       '--nqn', SUBSYS, '--nsid', '5'], server)
    assert res.returncode == 1
    assert [m for m, _ in server.requests][-3:] == ['nvmf_ns_add_host', 'nvmf_subsystem_remove_ns',
                                                    'qos_bdev_delete']
    assert '"method": "nvmf_ns_add_host"' in res.stdout and 'Invalid parameters' in res.stdout
    assert 'undone: nvmf_subsystem_remove_ns' in res.stderr and 'undone: qos_bdev_delete' in res.stderr


def test_expose_uses_the_target_method_when_present(rpc_py, target):
    server = target({'qos_bdev_expose': 2})
    res = rpc(rpc_py, ['qos_bdev_expose', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST,
                       '--nqn', SUBSYS, '--nsid', '2'], server)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == '2\n'
    assert [m for m, _ in server.requests] == ['qos_bdev_expose']


def test_server_mode_survives_a_validation_error(rpc_py, target):
    server = target({'qos_domain_delete': True})
    where = '-s 127.0.0.1 -p %d --plugin qos_rpc ' % server.port
    lines = where + 'qos_domain_create -n d --capacity-iops -1\n' + where + 'qos_domain_delete -n d\n'
    res = subprocess.run([*rpc_py, '--server'], env=_clean_env(), input=lines, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split() == ['**STATUS=1', '**STATUS=0']
    assert server.requests == [('qos_domain_delete', {'name': 'd'})]
