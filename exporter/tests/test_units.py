"""The systemd units as installed (issue 43: the target's unit could not start): a
scratch `make install DESTDIR=...` (PREFIX=/opt/nvmf-qos, the docs' package form), then
each installed unit's ExecStart run as systemd would run it, under `env -i`, with the
unit's own Environment= lines and its installed example /etc/default file as its
EnvironmentFile (with this machine's values added at its end: scratch sockets and
ports, SPDK_DIR): nvmf_tgt with the plugin answers its RPCs (`qos_version_get`), the
exporter serves the target's metrics, the agent answers /healthz with a real etcd.

systemd itself is not run (these machines have none as PID 1): ExecStart is expanded
here by systemd's rules (`${VAR}` one word, `$VAR` split at whitespace, `%H` the host
name, `%%` a per cent sign; EnvironmentFile lines `KEY=VALUE`, quotes removed,
comments skipped), and the installed paths are looked up under DESTDIR.

Runs where SPDK is present (every path of spdk-present.list under SPDK_DIR) and the
target plugin and the agent are built (`make test-exporter` builds them), with etcd
(Debian's etcd-server); elsewhere it says SKIPPED and why. Take the machine's SPDK lock
around it (`flock /tmp/nvmf-qos-target.lock make test-exporter`, or
NVMF_QOS_SPDK_LOCK)."""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from spdkapp import REPO, SPDK_DIR, Proc, plugin_lib, remove_socket, spdk_missing

from conftest import free_port

PREFIX = '/opt/nvmf-qos'
SYSCONFDIR = '/etc'
UNITDIR = '/etc/systemd/system'
ETCD = shutil.which('etcd')


def _agent():
    path = os.path.join(os.environ.get('CARGO_TARGET_DIR', os.path.join(REPO, 'target')), 'release',
                        'nvmf-qos-agent')
    return path if os.path.isfile(path) else None


def skip_reason():
    missing = spdk_missing()
    if missing:
        return 'SKIPPED: the installed units need SPDK at SPDK_DIR=%s (missing %s; see spdk-present.list)' % (
            SPDK_DIR, ', '.join(missing))
    if plugin_lib() is None:
        return 'SKIPPED: SPDK present but libnvmf_qos_tgt.so not built (`make test-exporter` builds it)'
    if _agent() is None:
        return 'SKIPPED: nvmf-qos-agent not built (`make test-exporter` builds it)'
    if ETCD is None:
        return 'SKIPPED: no etcd binary for the agent unit (apt-get install etcd-server)'
    return None


# -- systemd's rules, as much of them as the units use ---------------------------------


def unit_settings(text):
    """(Environment= assignments in order, EnvironmentFile= paths, ExecStart=) of a unit."""
    env, files, start = [], [], None
    for line in text.splitlines():
        key, _, value = line.partition('=')
        if key == 'Environment':
            env.extend(shlex.split(value))
        elif key == 'EnvironmentFile':
            files.append(value)
        elif key == 'ExecStart':
            start = value
    return env, files, start


def specifiers(value):
    return value.replace('%H', socket.gethostname()).replace('%%', '%')


def environment_file(text):
    """KEY=VALUE lines, comments and blank lines skipped, quotes removed."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(('#', ';')):
            continue
        key, _, value = line.partition('=')
        words = shlex.split(value) if value.strip() else ['']
        out[key.strip()] = ' '.join(words)
    return out


def exec_argv(start, env):
    """ExecStart's words: `${VAR}` is replaced within its word, a word that is `$VAR`
    alone becomes that variable's whitespace-separated words (none when empty)."""
    argv = []
    for word in shlex.split(start):
        bare = re.fullmatch(r'\$([A-Za-z_][A-Za-z0-9_]*)', word)
        if bare:
            argv.extend(env.get(bare.group(1), '').split())
            continue
        argv.append(re.sub(r'\$\{([A-Za-z_][A-Za-z0-9_]*)\}', lambda m: env.get(m.group(1), ''), word))
    return argv


def staged(word, destdir):
    """An installed path as it lies in the scratch install (also as the value of an
    `env` assignment, `LD_PRELOAD=PATH`)."""
    key, eq, value = word.rpartition('=') if re.match(r'[A-Z_]+=/', word) else ('', '', word)
    if value.startswith((PREFIX + '/', SYSCONFDIR + '/')):
        value = destdir + value
    return key + eq + value


class Unit:
    """One installed unit: its environment (the unit's lines, then its EnvironmentFile
    with `site` lines appended) and its command line, run under `env -i`."""

    def __init__(self, destdir, name, site):
        self.name = name
        text = open(destdir + UNITDIR + '/' + name + '.service').read()
        env_lines, files, start = unit_settings(text)
        assert start, '%s has no ExecStart' % name
        env = {}
        for a in env_lines:
            k, _, v = a.partition('=')
            env[k] = specifiers(v)
        assert files == ['-%s/default/%s' % (SYSCONFDIR, name)], (name, files)
        example = destdir + files[0][1:]
        assert os.path.isfile(example), 'make install did not install ' + files[0][1:]
        text = open(example).read()
        # The example sets nothing: every line is a comment or blank.
        assert environment_file(text) == {}, (name, environment_file(text))
        with open(example, 'a') as f:
            f.write('\n# this machine\n' + ''.join('%s=%s\n' % kv for kv in site.items()))
        env.update(environment_file(open(example).read()))
        self.env = env
        self.argv = [staged(a, destdir) for a in exec_argv(start, env)]

    def start(self, log_path, max_secs=120):
        argv = ['timeout', '-s', 'KILL', str(max_secs), 'env', '-i'] + \
            ['%s=%s' % kv for kv in sorted(self.env.items())] + self.argv
        return Proc(argv, log_path)


def wait(what, proc, f, secs=30):
    deadline = time.monotonic() + secs
    while True:
        try:
            v = f()
            if v:
                return v
        except Exception:  # not up yet
            pass
        if proc.p.poll() is not None or time.monotonic() > deadline:
            raise AssertionError('%s: not up within %d s (exit %s):\n%s' % (what, secs, proc.p.poll(),
                                                                            proc.log_text()))
        time.sleep(0.3)


def rpc(sock, method, params=None):
    from spdk.rpc.client import JSONRPCClient
    return JSONRPCClient(sock, timeout=10.0).call(method, params)


@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or '')
def test_each_installed_unit_starts_from_its_example_settings(tmp_path, spdk_lock, hugepages):
    destdir = str(tmp_path / 'stage')
    make = subprocess.run(['make', '--no-print-directory', '-C', REPO, 'install', 'DESTDIR=' + destdir,
                           'PREFIX=' + PREFIX, 'SYSCONFDIR=' + SYSCONFDIR, 'UNITDIR=' + UNITDIR,
                           'SPDK_DIR=' + SPDK_DIR], capture_output=True, text=True, timeout=1800)
    assert make.returncode == 0, make.stdout[-3000:] + make.stderr[-3000:]
    config = destdir + SYSCONFDIR + '/nvmf-qos/target.json'
    assert json.load(open(config)) == {'subsystems': []}, 'the empty saved config'
    # The venv names where it is installed, not the scratch directory (pip's shebang).
    venv = destdir + PREFIX + '/lib/nvmf-qos/venv'
    staged_names = subprocess.run(['grep', '-rlI', destdir, venv + '/bin', venv + '/pyvenv.cfg'],
                                  capture_output=True, text=True).stdout.split()
    assert not staged_names, staged_names
    with open(venv + '/bin/pip') as f:
        assert f.readline().startswith('#!%s/lib/nvmf-qos/venv/bin/python' % PREFIX)

    sock = str(tmp_path / 'spdk.sock')
    # The installed empty config, read from where it lies here.
    target = Unit(destdir, 'nvmf-qos-target', {
        'SPDK_DIR': SPDK_DIR,
        'NVMF_TGT_ARGS': '"-m 0x1 -r %s -u --disable-cpumask-locks"' % sock,
        'NVMF_QOS_CONFIG': config,
    })
    assert 'LD_LIBRARY_PATH' not in target.env, 'only the unit line sets it'
    exporter_port, agent_port, etcd_port, peer_port = free_port(), free_port(), free_port(), free_port()
    exporter = Unit(destdir, 'nvmf-qos-exporter', {
        'NVMF_QOS_RPC_SOCKET': sock, 'NVMF_QOS_EXPORTER_LISTEN': '127.0.0.1',
        'NVMF_QOS_EXPORTER_PORT': str(exporter_port), 'NVMF_QOS_EXPORTER_ARGS': '--verbose'})
    etcd_url = 'http://127.0.0.1:%d' % etcd_port
    agent = Unit(destdir, 'nvmf-qos-agent', {
        'NVMF_QOS_ETCD': etcd_url, 'NVMF_QOS_CLUSTER': 'units', 'NVMF_QOS_RPC_SOCKET': sock,
        'NVMF_QOS_AGENT_LISTEN': '127.0.0.1:%d' % agent_port,
        'NVMF_QOS_AGENT_ARGS': '"--interval-ms 200"'})
    assert agent.env['NVMF_QOS_TARGET'] == socket.gethostname()
    assert '--timeout' in exporter.argv and exporter.argv[exporter.argv.index('--timeout') + 1] == '1'
    assert exporter.argv[-1] == '--verbose' and agent.argv[-2:] == ['--interval-ms', '200']

    procs = []
    try:
        t = target.start(tmp_path / 'target.log')
        procs.append(t)
        version = wait('nvmf-qos-target', t, lambda: rpc(sock, 'qos_version_get'))
        assert version['plugin'] == 'target', version
        rpc(sock, 'qos_domain_create', {'name': 'd', 'capacity_iops': 100000})

        e = exporter.start(tmp_path / 'exporter.log')
        procs.append(e)
        url = 'http://127.0.0.1:%d/metrics' % exporter_port
        body = wait('nvmf-qos-exporter', e, lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        assert 'nvmf_qos_up{plugin="target"} 1.0' in body, body
        assert 'nvmf_qos_domain_period_seconds{domain="d"} 1.0' in body, body

        etcd = Proc([ETCD, '--name', 'units', '--data-dir', str(tmp_path / 'etcd'),
                     '--listen-client-urls', etcd_url, '--advertise-client-urls', etcd_url,
                     '--listen-peer-urls', 'http://127.0.0.1:%d' % peer_port,
                     '--initial-advertise-peer-urls', 'http://127.0.0.1:%d' % peer_port,
                     '--initial-cluster', 'units=http://127.0.0.1:%d' % peer_port], tmp_path / 'etcd.log')
        procs.append(etcd)
        wait('etcd', etcd, lambda: urllib.request.urlopen(etcd_url + '/health', timeout=1).read())
        a = agent.start(tmp_path / 'agent.log')
        procs.append(a)
        health = 'http://127.0.0.1:%d/healthz' % agent_port
        text = wait('nvmf-qos-agent', a, lambda: urllib.request.urlopen(health, timeout=5).read().decode())
        assert text.startswith('ok: etcd reached'), text
        print('\ntarget: %s; exporter: %d bytes of metrics; agent: %s' % (version, len(body), text.strip()))
    finally:
        for p in reversed(procs):
            p.stop(signal_for(p))
        remove_socket(sock)


def signal_for(proc):
    import signal
    return signal.SIGINT if proc.log_path.endswith('target.log') else signal.SIGTERM
