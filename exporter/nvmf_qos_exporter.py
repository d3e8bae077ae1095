#  SPDX-License-Identifier: Apache-2.0
"""Prometheus exporter for nvmf-qos: reads the QoS statistics of one SPDK application
(an nvmf_tgt with the target plugin, or an initiator application with the initiator
plugin, or both) over its JSON-RPC socket at every scrape, and serves them as
Prometheus metrics.

    python3 exporter/nvmf_qos_exporter.py --rpc-socket /var/tmp/spdk.sock --port 9633

Built on the JSON-RPC client of the PyPI package `spdk` (spdk.rpc.client) and on
`prometheus_client`. Nothing is cached between scrapes: each scrape makes one
`qos_stats_get` call (in its compact form, counters and gauges only) and one
`qos_ini_stats_get` call. A plugin that is not loaded (the method is unknown) is
skipped; a target that does not answer makes `nvmf_qos_up` 0.

Metric names follow Prometheus conventions: counters end in `_total`, times are in
seconds and sizes in bytes; labels are `domain`, `host_nqn` (and `group` when the
target reports tenant groups) on the target side, `bdev` and `pacer_group` on the
initiator side. `docs/operations.md` lists every metric.
"""

import argparse
import json
import logging
import math
import socket
import sys
import threading
import time

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

try:
    from spdk.rpc.client import JSONRPCClient, JSONRPCException
except ImportError:  # pragma: no cover - reported by main()
    JSONRPCClient = None
    JSONRPCException = Exception

METHOD_NOT_FOUND = -32601
PREFIX = 'nvmf_qos'
DEFAULT_PORT = 9633
# The rules that hold a command (qos_stats_get's `held_by`; HoldReason in qos-core).
HOLD_REASONS = ('limit', 'burst', 'reservation', 'share', 'budget', 'window')
DEFAULT_TIMEOUT = 1.0
# nvmf_qos_domain_longest_tick_gap_seconds: over the periods that ended in this many
# seconds (a scrape every 10 s or more often sees every period), at most the estimator
# log the plugin keeps.
TICK_GAP_WINDOW_S = 10
ESTIMATOR_LOG_PERIODS = 64

log = logging.getLogger('nvmf_qos_exporter')


class RpcError(Exception):
    """A JSON-RPC error answer (code and message), or a transport failure (code None)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


if JSONRPCClient is not None:
    class Client(JSONRPCClient):
        """spdk.rpc's client with a receive path linear in the answer's size: the stock
        one reads 4 KiB at a time and re-parses the whole buffer after each read (and
        formats the answer for its debug log), which makes a 1 MB answer cost seconds
        in the client alone. This one reads large chunks and parses once the buffer
        ends a JSON object.

        Its constructor is its own too: the stock one connects without a timeout (a
        stopped application whose listen queue is full blocks it for ever) and adds a
        log handler to a logger shared by every client of the socket, one more at each
        reconnection."""

        def __init__(self, addr, timeout):  # pylint: disable=super-init-not-called
            self._logger = logging.getLogger('nvmf_qos_exporter.rpc')
            self.timeout = timeout
            self._request_id = 0
            self._recv_buf = ''
            self._reqs = []
            self._batch_mode = False
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(addr)
            except OSError as ex:
                self.sock.close()
                self.sock = None
                raise JSONRPCException('cannot connect to %s: %s' % (addr, ex)) from None

        def recv(self):
            deadline = time.monotonic() + self.timeout
            parts = [self._recv_buf] if self._recv_buf else []
            self._recv_buf = ''
            dec = json.JSONDecoder()
            while True:
                if parts and parts[-1].rstrip().endswith('}'):
                    buf = ''.join(parts).lstrip()
                    try:
                        obj, idx = dec.raw_decode(buf)
                        self._recv_buf = buf[idx:]
                        return obj
                    except ValueError:
                        parts = [buf]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise JSONRPCException('Timeout while waiting for response')
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(1 << 20)
                except socket.timeout:
                    raise JSONRPCException('no answer within the scrape\'s --timeout') from None
                except OSError as ex:
                    raise JSONRPCException('Error while receiving: %s' % ex) from None
                if not data:
                    self.sock.close()
                    self.sock = None
                    raise JSONRPCException('Connection closed with partial response')
                parts.append(data.decode('utf-8'))
else:  # pragma: no cover
    Client = None


def _error_of(ex):
    """The {code, message} of spdk.rpc's JSONRPCException, whose message is the text
    "request: ... Got JSON-RPC error response response: {json}"."""
    text = getattr(ex, 'message', str(ex))
    marker = 'response:'
    at = text.rfind(marker)
    if at >= 0:
        try:
            err = json.loads(text[at + len(marker):])
            return RpcError(err.get('code'), err.get('message', text))
        except ValueError:
            pass
    return RpcError(None, ' '.join(text.split()))


class Source:
    """One SPDK application's JSON-RPC socket; reconnects after a failure. Calls are
    serialised (one scrape at a time talks to the socket), each within the deadline of
    its scrape: a scrape that cannot have the socket before its deadline (another one is
    still waiting for a hung application) fails at once instead of queueing behind it."""

    def __init__(self, socket_path, timeout):
        self.socket_path = socket_path
        self.timeout = timeout
        self._client = None
        self._lock = threading.Lock()

    def deadline(self):
        """The deadline of a scrape that starts now."""
        return time.monotonic() + self.timeout

    def call(self, method, params=None, deadline=None):
        if deadline is None:
            deadline = self.deadline()
        left = deadline - time.monotonic()
        if left <= 0 or not self._lock.acquire(timeout=left):
            raise RpcError(None, 'no answer within --timeout %g s (%s not sent: an earlier call still waits '
                           'for the application)' % (self.timeout, method))
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RpcError(None, 'no answer within --timeout %g s (%s not sent)' % (self.timeout, method))
            if self._client is None:
                self._client = Client(self.socket_path, left)
            self._client.timeout = left
            self._client.sock.settimeout(left)
            return self._client.call(method, params)
        except JSONRPCException as ex:
            err = _error_of(ex)
            if err.code is None:
                self._drop()
                raise RpcError(None, '%s: %s' % (method, err)) from None
            raise err from None
        except socket.timeout:
            self._drop()
            raise RpcError(None, '%s: not sent within the scrape\'s --timeout' % method) from None
        except (OSError, ValueError) as ex:
            self._drop()
            raise RpcError(None, '%s: %s' % (method, ex)) from None
        finally:
            self._lock.release()

    def _drop(self):
        if self._client is not None:
            try:
                self._client.close()
            except OSError:
                pass
        self._client = None


def _num(v):
    return None if v is None else float(v)


def _labels(names, values):
    return list(names), [str(v) for v in values]


class QosCollector(Collector):
    """Builds every metric at scrape time from the application's answers."""

    def __init__(self, source, compact=True):
        self.source = source
        self.compact = compact

    def describe(self):
        """Nothing to declare ahead: registering the collector must not call the
        application (the registry would scrape once to learn the names)."""
        return []

    # -- helpers ---------------------------------------------------------------------

    def _try(self, deadline, method, params=None):
        """The method's result, None when the plugin is not loaded; RpcError when the
        application does not answer (within the scrape's deadline)."""
        try:
            return self.source.call(method, params, deadline)
        except RpcError as ex:
            if ex.code == METHOD_NOT_FOUND:
                return None
            raise

    def _tick_gaps(self, deadline, target):
        """Per domain, the longest time between two runs of its QoS monitor over the
        periods that ended in the last TICK_GAP_WINDOW_S seconds (at least the last one):
        `longest_tick_gap_ns` of the estimator's log, which only the full form has. The
        compact scrape asks for it with a second call that names no host (`host_nqn`
        that no host has: the domains' figures and log, no host built). None where the
        plugin does not report it."""
        domains = target if isinstance(target, list) else [target]
        want = {}
        for d in domains:
            if isinstance(d, dict) and d.get('name') is not None:
                period_s = (d.get('period_ns') or 1e9) / 1e9
                want[d['name']] = min(ESTIMATOR_LOG_PERIODS, max(1, math.ceil(TICK_GAP_WINDOW_S / period_s)))
        if not want:
            return {}
        if self.compact:
            try:
                logs = self._try(deadline, 'qos_stats_get', {'periods': max(want.values()), 'host_nqn': ''})
            except RpcError as ex:
                if ex.code is None:
                    raise
                return {}  # a plugin that refuses the form: no tick gap
            logs = logs if isinstance(logs, list) else [logs]
        else:
            logs = domains
        gaps = {}
        for d in logs or []:
            if not isinstance(d, dict) or d.get('name') not in want:
                continue
            recs = [r for r in d.get('estimator_periods') or []
                    if isinstance(r, dict) and r.get('longest_tick_gap_ns') is not None]
            if not recs:
                continue
            last = max(r.get('epoch', 0) for r in recs)
            n = want[d['name']]
            gaps[d['name']] = max(r['longest_tick_gap_ns'] for r in recs if r.get('epoch', 0) > last - n) / 1e9
        return gaps

    def collect(self):
        started = time.monotonic()
        deadline = self.source.deadline()
        up = GaugeMetricFamily(PREFIX + '_up', 'Whether the SPDK application answered the last scrape with '
                               'this plugin loaded (1) or not (0: no answer within --timeout, or an '
                               'application started without the plugin)', labels=['plugin'])
        try:
            stats_params = {'compact': True} if self.compact else None
            target = self._try(deadline, 'qos_stats_get', stats_params)
            initiator = self._try(deadline, 'qos_ini_stats_get')
            if initiator is None:  # an initiator plugin older than qos_ini_stats_get
                initiator = self._try(deadline, 'qos_ini_bdev_get')
            versions = [self._try(deadline, method) if loaded else None
                        for loaded, method in ((target is not None, 'qos_version_get'),
                                               (initiator is not None, 'qos_ini_version_get'))]
            gaps = self._tick_gaps(deadline, target) if target is not None else {}
        except RpcError as ex:
            # One line: the client's messages span several.
            log.warning('scrape failed after %.0f ms: %s', (time.monotonic() - started) * 1e3, ex)
            up.add_metric(['target'], 0)
            up.add_metric(['initiator'], 0)
            yield up
            return
        # Both plugins always: an alert on `nvmf_qos_up{plugin="target"} == 0` must fire when
        # a target is restarted without the plugin, not find the series gone.
        up.add_metric(['target'], int(target is not None))
        up.add_metric(['initiator'], int(initiator is not None))
        yield self._build_info(versions)
        if target is not None:
            yield from self._target(target, gaps)
        if initiator is not None:
            yield from self._initiator(initiator)
        yield up
        took = time.monotonic() - started
        log.info('scrape: target plugin %s, initiator plugin %s, %.1f ms',
                 'answered' if target is not None else 'absent',
                 'answered' if initiator is not None else 'absent', took * 1e3)
        yield GaugeMetricFamily(PREFIX + '_scrape_duration_seconds',
                                'Time the exporter took to read the statistics', value=took)

    @staticmethod
    def _burst(who, burst, lv, labels, gauge, counter):
        """A host's or group's burst (issue 28): its configured rate and bucket, the credit
        left in seconds at the burst rate, whether it bursts now, and the periods it burst."""
        if not isinstance(burst, dict):
            return
        the = 'the host' if who == 'host' else 'the group'
        if burst.get('iops') is not None:
            gauge('%s_burst_iops' % who, 'Configured burst above %s\'s limit, I/O per second' % the,
                  labels).add_metric(lv, burst['iops'])
        if burst.get('mibps') is not None:
            gauge('%s_burst_bytes_per_second' % who, 'Configured burst above %s\'s limit, bytes per second'
                  % the, labels).add_metric(lv, burst['mibps'] * 1048576)
        if burst.get('seconds') is not None:
            gauge('%s_burst_bucket_seconds' % who, 'How long a full burst bucket lasts at the burst rate',
                  labels).add_metric(lv, burst['seconds'])
        gauge('%s_burst_credit_seconds' % who, 'Burst credit left: seconds at the burst rate (0 ..= the '
              'bucket); earned under the limit, spent above it', labels).add_metric(
            lv, burst.get('credit_seconds') or 0)
        gauge('%s_bursting' % who, '%s is above its limit on burst credit now (1)' % the.capitalize(),
              labels).add_metric(lv, 1 if burst.get('bursting') else 0)
        counter('%s_bursting_periods' % who, 'Ended QoS periods in which %s burst above its limit' % the,
                labels).add_metric(lv, burst.get('bursting_periods') or 0)

    @classmethod
    def _groups(cls, d, dom, period_s, gauge, counter):
        """Tenant groups: configured rates, and what the group's hosts completed and were
        given beyond their own reservations in the current period (cost units)."""
        labels = ['domain', 'group']
        for g in d.get('groups') or []:
            lv = [dom, g.get('name', '')]
            gauge('group_hosts', 'Hosts in the tenant group', labels).add_metric(lv, len(g.get('hosts') or []))
            gauge('group_weight', "The group's weight among groups and lone hosts", labels).add_metric(
                lv, g.get('weight') or 1)
            for setting, word in (('min', 'reservation'), ('max', 'limit')):
                r = g.get(setting) or {}
                if r.get('iops') is not None:
                    gauge('group_%s_iops' % word, "The group's configured %s, I/O per second" % word,
                          labels).add_metric(lv, r['iops'])
                if r.get('mibps') is not None:
                    gauge('group_%s_bytes_per_second' % word, "The group's configured %s, bytes per second"
                          % word, labels).add_metric(lv, r['mibps'] * 1048576)
            for key, name, text in (('completed_this_period', 'group_completed_this_period_cost_ops',
                                     "Work the group's hosts completed in the current period (cost units)"),
                                    ('given_this_period', 'group_given_this_period_cost_ops',
                                     "Given to the group's hosts beyond their own reservations in the current "
                                     "period: the group's surplus reservation and its share of the excess")):
                a = g.get(key) or {}
                if a.get('ops') is not None:
                    gauge(name, text, labels).add_metric(lv, a['ops'])
            cls._burst('group', g.get('burst'), lv, labels, gauge, counter)

    @staticmethod
    def _build_info(versions):
        """`nvmf_qos_build_info`: 1 per loaded plugin, its version in the labels (plugins
        older than the version methods are left out). Asked at every scrape: a restart
        with another build changes it."""
        info = GaugeMetricFamily(PREFIX + '_build_info', "A loaded plugin's version, token protocol version "
                                 'and build (always 1)', labels=['plugin', 'version', 'wire_protocol', 'profile'])
        for v in versions:
            if isinstance(v, dict):
                info.add_metric([str(v.get('plugin', '')), str(v.get('version', '')),
                                 str(v.get('wire_protocol', '')), str(v.get('profile', ''))], 1)
        return info

    # -- target ----------------------------------------------------------------------

    def _target(self, domains, gaps):
        if isinstance(domains, dict):
            domains = [domains]
        g = {}
        c = {}

        def gauge(name, text, labels):
            if name not in g:
                g[name] = GaugeMetricFamily(PREFIX + '_' + name, text, labels=labels)
            return g[name]

        def counter(name, text, labels):
            if name not in c:
                c[name] = CounterMetricFamily(PREFIX + '_' + name, text, labels=labels)
            return c[name]

        # A `group` label as soon as some host is in a tenant group (hosts outside groups: '').
        with_group = any(h.get('group') for d in domains for h in d.get('hosts') or [])
        host_labels = ['domain', 'host_nqn'] + (['group'] if with_group else [])
        held = HistogramMetricFamily(PREFIX + '_host_held_seconds',
                                     'Time I/O spent held by QoS before going to the base bdev '
                                     '(QoS-added latency; commands admitted at once count as 0)',
                                     labels=host_labels)
        for d in domains:
            dom = d.get('name', '')
            period_s = (d.get('period_ns') or 1e9) / 1e9
            self._groups(d, dom, period_s, gauge, counter)
            gauge('domain_period_seconds', 'QoS period T', ['domain']).add_metric([dom], period_s)
            if gaps.get(dom) is not None:
                gauge('domain_longest_tick_gap_seconds', "Longest time between two runs of the domain's QoS "
                      'monitor over the periods that ended in the last %g s (at least the last one): near '
                      "the check interval normally, far above it when the target's thread was off its core"
                      % TICK_GAP_WINDOW_S, ['domain']).add_metric([dom], gaps[dom])
            gauge('domain_epoch', 'Number of the current QoS period', ['domain']).add_metric(
                [dom], d.get('epoch', 0))
            est = d.get('capacity_estimate') or {}
            if est.get('ops') is not None and not d.get('capacity_learning'):
                gauge('domain_capacity_estimate_iops', 'Capacity estimate sizing the current period, '
                      'operations per second in the domain\'s cost units (I/O per second unless it weighs '
                      'writes or sizes: compare with host_completed_cost_ops_total)',
                      ['domain']).add_metric([dom], est['ops'] / period_s)
            if 'capacity_learning' in d:
                gauge('domain_capacity_learning', 'No capacity was given and none is learned yet: no '
                      'estimate, no budget for the excess (1)', ['domain']).add_metric(
                    [dom], 1 if d['capacity_learning'] else 0)
            reserved = d.get('reserved') or {}
            if reserved.get('ops') is not None:
                gauge('domain_reserved_ops_per_second', 'Hard reservations admitted, hosts\' and groups\', '
                      'operations per second in the domain\'s cost units', ['domain']).add_metric(
                    [dom], reserved['ops'] / period_s)
            if est.get('bytes') is not None:
                gauge('domain_capacity_estimate_bytes_per_second', 'Capacity estimate sizing the current '
                      'period, bytes per second', ['domain']).add_metric([dom], est['bytes'] / period_s)
            pool = d.get('global_available') or {}
            if pool.get('ops') is not None:
                gauge('domain_global_pool_ops', 'Global (unreserved) tokens left in this period, operations',
                      ['domain']).add_metric([dom], pool['ops'])
            if pool.get('bytes') is not None:
                gauge('domain_global_pool_bytes', 'Global (unreserved) tokens left in this period, bytes',
                      ['domain']).add_metric([dom], pool['bytes'])
            hosts = d.get('hosts') or []
            gauge('domain_hosts', 'Hosts in the domain', ['domain']).add_metric([dom], len(hosts))
            if 'bypass' in d:
                gauge('domain_bypass', '1 while the domain holds nothing (qos_domain_update --bypass)',
                      ['domain']).add_metric([dom], 1 if d['bypass'] else 0)
            if 'pool_paced' in d:
                gauge('domain_pool_paced', '1 while first come paces its global pool for a reservation that '
                      'is behind (0: the pool holds nothing back)', ['domain']).add_metric(
                    [dom], 1 if d['pool_paced'] else 0)
            op = d.get('operating_point') or {}
            if 'in_flight' in op:
                gauge('domain_operating_point_in_flight', 'Commands in flight at the operating point '
                      '(Q*: the fewest that give efficiency eta of the most the learned depth curve shows)',
                      ['domain']).add_metric([dom], op['in_flight'])
                gauge('domain_operating_point_ops_per_second', 'Operations per second (cost units) at the '
                      'operating point (C*)', ['domain']).add_metric([dom], op['ops_per_s'])
                gauge('domain_depth_curve_max_ops_per_second', 'The most the learned depth curve shows, '
                      'operations per second (cost units)', ['domain']).add_metric([dom], op['max_ops_per_s'])
                gauge('domain_operating_point_latency_seconds', 'Latency of a command at the operating point '
                      '(L* = Q* / C*)', ['domain']).add_metric([dom], op['latency_ns'] / 1e9)
            circ = op.get('circulation')
            if circ:
                gauge('domain_circulation_commands', 'Over the hosts\' circulation: commands the hosts '
                      'circulate as far as the target saw (N)', ['domain']).add_metric([dom], circ['commands'])
                gauge('domain_circulation_hold_target', 'Over the hosts\' circulation: commands the hold '
                      'targets keep held (H* = N - N*)', ['domain']).add_metric([dom], circ['hold_target'])
                gauge('domain_circulation_held', 'Over the hosts\' circulation: commands held now, any '
                      'reason', ['domain']).add_metric([dom], circ['held'])
                learned = circ.get('learned') or {}
                if learned.get('ratio') is not None:
                    gauge('domain_circulation_held_open_ratio', 'Over the hosts\' circulation by eta: the '
                          'rate held at N* against the rate holding nothing (smoothed over the learner\'s '
                          'triplets)', ['domain']).add_metric([dom], learned['ratio'])
            bounds = [b / 1e9 for b in d.get('held_time_bounds_ns') or []]
            for h in hosts:
                lv = [dom, h.get('host_nqn', '')] + ([h.get('group') or ''] if with_group else [])
                total = h.get('completed_total') or {}
                counter('host_completed_ios', 'I/O completed by the host (monotonic)', host_labels).add_metric(
                    lv, total.get('ios', 0))
                counter('host_completed_bytes', 'Bytes transferred by completed I/O', host_labels).add_metric(
                    lv, total.get('bytes', 0))
                counter('host_completed_cost_ops', 'Completed work in the domain\'s cost units '
                        '(operations, writes and large I/O weighted by the cost model)', host_labels).add_metric(
                    lv, total.get('ops', 0))
                counter('host_throttled_ios', 'I/O that QoS held for want of tokens or limit',
                        host_labels).add_metric(lv, h.get('throttled_ios', 0))
                gauge('host_held_ios', 'I/O held by QoS now', host_labels).add_metric(lv, h.get('held', 0))
                held_by = h.get('held_by')
                if isinstance(held_by, dict):
                    by_reason = counter('host_held_by_reason_ios', 'I/O that entered the QoS hold queue, by '
                                        'the rule that held it: limit, burst (at its burst rate), '
                                        'reservation (waiting for a reservation behind), share (weighted '
                                        'sharing), budget (the capacity estimate spent), window (operating '
                                        'point)', [*host_labels, 'reason'])
                    for reason in HOLD_REASONS:
                        by_reason.add_metric([*lv, reason], held_by.get(reason, 0))
                    counter('host_bypassed_ios', 'I/O the domain\'s bypass let through that QoS would have '
                            'held', host_labels).add_metric(lv, held_by.get('bypassed', 0))
                if 'in_flight_at_base' in h:
                    gauge('host_in_flight_at_base', 'Commands of the host in flight at the base bdev, on average '
                          'over the period so far', host_labels).add_metric(lv, h['in_flight_at_base'])
                if h.get('reservation_depth_needed') is not None:
                    gauge('host_reservation_depth_needed', 'Commands the host needs in flight at the base to '
                          'complete its reservation at the operating point (reservation x L*)',
                          host_labels).add_metric(lv, h['reservation_depth_needed'])
                e = h.get('entitlement')
                if e:
                    gauge('host_contending', '1 when QoS held the host\'s commands in at least half of the '
                          'last period (it gets its entitlement), 0 when self-limited (never held back)',
                          host_labels).add_metric(lv, 1 if e.get('contending') else 0)
                    for key, name, text in (
                            ('entitled', 'host_entitled_ops_per_second', 'What the host is entitled to at the '
                             'operating point: reservation first, the rest by weight, capped at its limit and '
                             'at what it can take (operations, cost units, per second; last period)'),
                            ('achieved', 'host_achieved_ops_per_second', 'What the host completed in the last '
                             'period (operations, cost units, per second)'),
                            ('shortfall', 'host_entitlement_shortfall_ops_per_second', 'Entitled minus achieved '
                             'where the host got less (operations, cost units, per second)'),
                            ('queue_depth_needed', 'host_queue_depth_needed', 'Commands the host needs '
                             'outstanding at the target to get its entitlement at the operating point '
                             '(entitled x L*)')):
                        gauge(name, text, host_labels).add_metric(lv, e.get(key, 0))
                periods = counter('host_periods', 'Ended QoS periods by outcome: reservation met or missed, '
                                  'while backlogged (I/O was held) or not', [*host_labels, 'outcome', 'backlogged'])
                pt = h.get('periods_total') or {}
                for key, outcome, backlogged in (('met', 'met', 'false'), ('missed', 'missed', 'false'),
                                                 ('met_backlogged', 'met', 'true'),
                                                 ('missed_backlogged', 'missed', 'true')):
                    periods.add_metric([*lv, outcome, backlogged], pt.get(key, 0))
                gauge('host_reservation_met_ratio', 'Fraction of the kept past periods (up to 128) in which '
                      'the host met its reservation', host_labels).add_metric(
                    lv, h.get('reservation_met_fraction') or 0)
                gauge('host_underuse', 'The host used less than its reservation for several periods (1)',
                      host_labels).add_metric(lv, 1 if h.get('underuse_flag') else 0)
                gauge('host_reservation_at_risk', 'The host\'s remaining reservation cannot be served in the '
                      'time left of the period (1)', host_labels).add_metric(
                    lv, 1 if h.get('reservation_at_risk') else 0)
                gauge('host_reservation_unreachable', 'Closing the excess to the other hosts did not bring the '
                      'host to its reservation: its queue depth cannot carry it here (1)', host_labels).add_metric(
                    lv, 1 if h.get('reservation_unreachable') else 0)
                gauge('host_configured', 'Set by qos_host_set (1) or best-effort because only a QoS bdev '
                      'names it (0)', host_labels).add_metric(lv, 0 if h.get('configured') is False else 1)
                for setting, word in (('min', 'reservation'), ('max', 'limit')):
                    rates = h.get(setting) or {}
                    for direction in ('total', 'read', 'write'):
                        r = rates.get(direction) or {}
                        if r.get('iops') is not None:
                            gauge('host_%s_iops' % word, 'Configured %s, I/O per second' % word,
                                  [*host_labels, 'direction']).add_metric([*lv, direction], r['iops'])
                        if r.get('mibps') is not None:
                            gauge('host_%s_bytes_per_second' % word, 'Configured %s, bytes per second' % word,
                                  [*host_labels, 'direction']).add_metric([*lv, direction],
                                                                          r['mibps'] * 1048576)
                self._burst('host', h.get('burst'), lv, host_labels, gauge, counter)
                ht = h.get('held_time')
                if ht and bounds and len(ht.get('cumulative') or []) == len(bounds) + 1:
                    cum = ht['cumulative']
                    buckets = [(repr(b), cum[i]) for i, b in enumerate(bounds)]
                    buckets.append(('+Inf', cum[-1]))
                    held.add_metric(lv, buckets, ht.get('sum_ns', 0) / 1e9)
        yield from g.values()
        yield from c.values()
        yield held

    # -- initiator -------------------------------------------------------------------

    def _initiator(self, bdevs):
        labels = ['bdev', 'pacer_group']
        fams = {}

        def fam(kind, name, text, extra=()):
            if name not in fams:
                cls = CounterMetricFamily if kind == 'c' else GaugeMetricFamily
                fams[name] = cls(PREFIX + '_ini_' + name, text, labels=labels + list(extra))
            return fams[name]

        for b in bdevs or []:
            lv = [b.get('name', ''), b.get('pacer_group', '')]
            st = b.get('state') or {}
            counters = (
                ('ios', 'ios', 'I/O submitted to the initiator QoS bdev'),
                ('large_ios', 'large_ios', 'I/O above the chunk size (split and paced)'),
                ('large_whole_ios', 'large_whole_ios',
                 'I/O above the chunk size sent whole (no latency-sensitive I/O in the pacer group)'),
                ('chunks', 'chunks', 'Chunks sent for large I/O'),
                ('held_total', 'throttled_ios', 'I/O or chunks held for want of tokens'),
                ('vendor_sent', 'vendor_commands', 'Token-protocol vendor commands sent'),
                ('vendor_errors', 'vendor_errors', 'Vendor commands that failed'),
                ('aborted', 'aborted_ios', 'I/O completed with an error by the QoS bdev itself'),
                ('vendor_late', 'vendor_late_replies', 'Vendor replies that came after their request timed out'),
                ('vendor_submit_failed', 'vendor_submit_failures', 'Vendor commands the base bdev refused to '
                 'submit'),
                ('probes_sent', 'probes', 'State probes sent to the target'),
                ('engine_restarts', 'engine_restarts', 'Token engine restarts (the target reset or changed)'),
                ('acquire_deferred', 'acquires_deferred', 'Token acquisitions sent as state requests while the '
                 "base's path was down or resetting"),
            )
            for key, name, text in counters:
                if st.get(key) is not None:
                    fam('c', name, text).add_metric(lv, st[key])
            for key, name, text in (('held_ns', 'held_seconds', 'Time I/O and chunks spent held for tokens'),
                                    ('paced_ns', 'paced_seconds', 'Time chunks of large I/O waited for the '
                                     'pacer')):
                if st.get(key) is not None:
                    fam('c', name, text).add_metric(lv, st[key] / 1e9)
            if st.get('held') is not None:
                fam('g', 'held_ios', 'I/O or chunks held now').add_metric(lv, st['held'])
            if st.get('mode') is not None:
                fam('g', 'mode', 'Token engine mode (1 for the current one)', ['mode']).add_metric(
                    [*lv, st['mode']], 1)
            pacer = b.get('pacer') or {}
            if pacer.get('allowed_bytes_per_sec') is not None:
                fam('g', 'pacer_allowed_bytes_per_second', 'Rate the pacer allows large I/O (AIMD)').add_metric(
                    lv, pacer['allowed_bytes_per_sec'])
            if pacer.get('latency_target_ns') is not None:
                fam('g', 'pacer_latency_target_seconds', "The pacer's latency target for small I/O").add_metric(
                    lv, pacer['latency_target_ns'] / 1e9)
            if pacer.get('base_latency_ns') is not None:
                fam('g', 'pacer_base_latency_seconds', 'The latency the pacer measured for small I/O on an idle '
                    'path').add_metric(lv, pacer['base_latency_ns'] / 1e9)
            if pacer.get('chunk_bytes') is not None:
                fam('g', 'pacer_chunk_bytes', 'The size large I/O is split into now (sized to the path while '
                    'small I/O shares it)').add_metric(lv, pacer['chunk_bytes'])
            if pacer.get('probes_lost') is not None:
                fam('c', 'pacer_probes_lost', 'Latency probes of the pacer that did not come back').add_metric(
                    lv, pacer['probes_lost'])
        yield from fams.values()


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog='nvmf_qos_exporter',
        description='Prometheus exporter for nvmf-qos: serves the QoS statistics of one SPDK application '
                    '(target and/or initiator plugin), read over its JSON-RPC socket at every scrape.')
    p.add_argument('-s', '--rpc-socket', default='/var/tmp/spdk.sock',
                   help='JSON-RPC socket of the SPDK application (default %(default)s)')
    p.add_argument('--listen', default='127.0.0.1',
                   help='address to serve /metrics on (default %(default)s)')
    p.add_argument('-p', '--port', type=int, default=DEFAULT_PORT,
                   help='port to serve /metrics on (default %(default)s)')
    p.add_argument('-t', '--timeout', type=float, default=DEFAULT_TIMEOUT,
                   help='seconds a scrape waits for the application\'s answers, all calls together; keep it '
                        'below the scrape timeout of Prometheus\'s job, so that a hung application is stored '
                        'as nvmf_qos_up 0 (NvmfQosTargetDown) and not as a failed scrape (default %(default)s)')
    p.add_argument('--full', action='store_true',
                   help='ask for the full statistics (with per-period history) instead of the compact form; '
                        'for targets whose plugin predates the compact form')
    p.add_argument('-v', '--verbose', action='store_true',
                   help='log every scrape (which plugins answered, how long it took); failed scrapes are '
                        'logged either way')
    args = p.parse_args(argv)
    if not args.timeout > 0:
        p.error('--timeout must be above 0 seconds')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format='%(asctime)s %(levelname)s %(message)s')
    if JSONRPCClient is None:
        print("nvmf_qos_exporter: the Python package 'spdk' is missing: pip install -r exporter/requirements.txt",
              file=sys.stderr)
        return 2
    REGISTRY.register(QosCollector(Source(args.rpc_socket, args.timeout), compact=not args.full))
    server, thread = start_http_server(args.port, addr=args.listen)
    print('nvmf_qos_exporter: serving http://%s:%d/metrics for %s' % (args.listen, server.server_port,
                                                                      args.rpc_socket), flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main())
