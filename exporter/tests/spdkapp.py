"""SPDK applications for the exporter's real-target tests (test_real_target.py,
test_alerts_real.py): whether SPDK and the plugins are there (the skip reason when not),
child processes bounded in time, and an SPDK application (nvmf_tgt, bdevperf) started
with or without a plugin preloaded and ready once its JSON-RPC socket answers.

SPDK is present when every path of spdk-present.list exists under SPDK_DIR (the
definition the Makefile uses); the plugins are found in CARGO_TARGET_DIR/release (or
NVMF_QOS_TGT_LIB / NVMF_QOS_INI_LIB)."""

import os
import signal
import subprocess
import time

from conftest import EXPORTER
from promserver import PROMETHEUS

REPO = os.path.dirname(EXPORTER)
SPDK_DIR = os.environ.get('SPDK_DIR', '/opt/spdk')
RELEASE = os.path.join(os.environ.get('CARGO_TARGET_DIR', os.path.join(REPO, 'target')), 'release')


def spdk_missing():
    with open(os.path.join(REPO, 'spdk-present.list')) as f:
        paths = [line.strip() for line in f if line.strip() and not line.startswith('#')]
    return [p for p in paths if not os.path.exists(os.path.join(SPDK_DIR, p))]


def _built(env, name):
    path = os.environ.get(env) or os.path.join(RELEASE, name)
    return path if os.path.isfile(path) else None


def plugin_lib():
    """The target plugin (libnvmf_qos_tgt.so), or None when not built."""
    return _built('NVMF_QOS_TGT_LIB', 'libnvmf_qos_tgt.so')


def initiator_lib():
    """The initiator plugin (libnvmf_qos_ini.so), or None when not built."""
    return _built('NVMF_QOS_INI_LIB', 'libnvmf_qos_ini.so')


def skip_reason(initiator=False):
    """Why a test against a real nvmf_tgt (and, with `initiator`, bdevperf with the
    initiator plugin) cannot run here, or None."""
    missing = spdk_missing()
    if missing:
        return 'SKIPPED: SPDK not present at SPDK_DIR=%s (missing %s; see spdk-present.list)' % (
            SPDK_DIR, ', '.join(missing))
    if PROMETHEUS is None:
        return 'SKIPPED: no prometheus binary (apt-get install prometheus)'
    if plugin_lib() is None:
        return ('SKIPPED: SPDK present but libnvmf_qos_tgt.so not built: '
                '`make test-exporter` builds it (cargo build --release -p spdk-plugin)')
    if initiator and initiator_lib() is None:
        return ('SKIPPED: SPDK present but libnvmf_qos_ini.so not built: '
                '`make test-exporter` builds it (cargo build --release -p initiator-plugin)')
    if initiator and not os.path.exists(os.path.join(SPDK_DIR, 'build/examples/bdevperf')):
        return 'SKIPPED: no bdevperf at %s/build/examples (SPDK built without examples)' % SPDK_DIR
    return None


class Proc:
    """A child process bounded in time, killed with its children when the test ends."""

    def __init__(self, argv, log_path, env=None):
        self.log_path = str(log_path)
        self.log = open(log_path, 'w')
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=env, start_new_session=True)

    def app_pid(self):
        """The application's own process id: the child of `timeout` (`env` execs into
        it), or None."""
        try:
            with open('/proc/%d/task/%d/children' % (self.p.pid, self.p.pid)) as f:
                kids = f.read().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

    def signal_app(self, sig):
        """Sends `sig` to the application alone (SIGSTOP: it hangs, `timeout` still
        bounds it)."""
        pid = self.app_pid()
        assert pid is not None, 'the application is not running'
        os.kill(pid, sig)

    def log_text(self):
        with open(self.log_path, errors='replace') as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, grace=20):
        """`sig`, then SIGKILL after `grace` seconds."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGCONT)
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        if not self.log.closed:
            self.log.close()


def start_app(binary, args, sock, log_path, preload=None, max_secs=180, probe='spdk_get_version'):
    """An SPDK application (`binary` under SPDK_DIR/build) on RPC socket `sock` under
    `timeout -s KILL max_secs`, with `preload` (a plugin) in LD_PRELOAD when given:
    returns (Proc, spdk.rpc JSONRPCClient) once `probe` answers (at most 30 s)."""
    from spdk.rpc.client import JSONRPCClient
    if os.path.exists(sock):
        os.unlink(sock)
    env = ['LD_LIBRARY_PATH=' + os.path.join(SPDK_DIR, 'build/lib')]
    if preload:
        env.append('LD_PRELOAD=' + preload)
    app = Proc(['timeout', '-s', 'KILL', str(max_secs), 'env', *env, os.path.join(SPDK_DIR, 'build', binary),
                *args, '-u', '--disable-cpumask-locks', '-r', sock], log_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            client = JSONRPCClient(sock, timeout=10.0)
            client.call(probe)
            return app, client
        except Exception:
            if app.p.poll() is not None or time.monotonic() > deadline:
                app.stop()
                raise RuntimeError('%s did not start:\n%s' % (binary, app.log_text())) from None
            time.sleep(0.3)


def remove_shm(shm_id):
    """What an SPDK application killed with shared-memory id `shm_id` leaves: its
    hugepage files (the pages stay reserved while they exist) and its trace buffer."""
    for d, match in (('/dev/hugepages', lambda n: n.startswith('spdk%dmap_' % shm_id)),
                     ('/dev/shm', lambda n: n.endswith('_trace.%d' % shm_id))):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if match(n):
                try:
                    os.unlink(os.path.join(d, n))
                except OSError:
                    pass


def remove_socket(sock):
    for path in (sock, sock + '.lock'):
        if os.path.exists(path):
            os.unlink(path)
