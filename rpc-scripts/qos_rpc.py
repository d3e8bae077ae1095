#  SPDX-License-Identifier: Apache-2.0
"""rpc.py plugin for nvmf-qos: one command per JSON-RPC method of docs/rpc.md.

    PYTHONPATH=rpc-scripts rpc.py --plugin qos_rpc qos_domain_create -n dom0 --capacity-iops 400000

rpc.py imports this module by name and calls `spdk_rpc_plugin_initialize(subparsers)`.
Handlers only use `args.client.call(method, params)`, which every rpc.py client has
(the socket client, the Go client and the --dry-run clients of SPDK 25.09 and of the
PyPI package `spdk` 26.9), so the module needs nothing beyond the standard library.

Only the parameters given on the command line are sent, so the target's defaults apply.
Obvious mistakes (negative or out-of-range numbers, unknown priority, mode or sharing, a
QoS reservation given both together and apart, a reservation above its limit, a bad
group name) are argparse errors: usage, a message, exit status 2, nothing sent.

The options, their defaults and ranges are the target's: tests/test_schema.py compares
them with schema/*.json, which the plugins' tests read off their parameter structs
(README.md, "Schema").
"""

import argparse
import json
import os
import string
import sys
import uuid

METHOD_NOT_FOUND = -32601  # JSON-RPC 2.0 "Method not found", as SPDK's rpc.c answers it
MAX_NQN_LEN = 223  # NVMe base specification, and qos-core's MAX_NQN_LEN
MAX_NAME_LEN = 255  # spdk-sys's MAX_NAME_LEN: domains, bdevs, pacer groups
MAX_GROUP_NAME_LEN = 64  # qos-core's MAX_GROUP_NAME_LEN
_GROUP_NAME_CHARS = frozenset(string.ascii_letters + string.digits + '-_.:')


# Output, in the format of spdk.rpc's print_dict / print_json (which moved between
# SPDK 25.09 and 26.9, so they are not imported).

def _print_dict(d):
    print(json.dumps(d, indent=2))


def _print_json(s):
    print(json.dumps(s, indent=2).strip('"'))


def _print_result(result):
    """Prints a method's result the way SPDK's own commands do: nothing for `true`
    (and for None, which is what the --dry-run and batch clients return), a bare
    string or number for names and namespace ids, indented JSON for objects."""
    if result is None or result is True:
        return
    if isinstance(result, (dict, list)):
        _print_dict(result)
    else:
        _print_json(result)


# Value types. Each raises argparse.ArgumentTypeError, which argparse reports as
# "argument --flag: <message>" with the usage line and exit status 2.

def _integer(text):
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not an integer" % text) from None


_U32 = 2**32 - 1  # the largest values the target's integer fields hold
_U64 = 2**64 - 1


def _int_range(lo, hi=_U64, or_zero=False):
    """An integer in lo ..= hi (or 0, with or_zero). A bound that is only the target's
    integer type (_U32, _U64) is not named unless it is crossed."""
    def parse(text):
        value = _integer(text)
        if (or_zero and value == 0) or lo <= value <= hi:
            return value
        if or_zero:
            raise argparse.ArgumentTypeError("must be 0 or %d ..= %d (got %d)" % (lo, hi, value))
        if hi in (_U32, _U64):
            if value > hi:
                raise argparse.ArgumentTypeError("must be at most %d (got %d)" % (hi, value))
            if lo == 0:
                raise argparse.ArgumentTypeError("must not be negative (got %d)" % value)
            raise argparse.ArgumentTypeError("must be at least %d (got %d)" % (lo, value))
        raise argparse.ArgumentTypeError("must be %d ..= %d (got %d)" % (lo, hi, value))
    parse.__name__ = 'integer'
    return parse


_count = _int_range(0)
_positive = _int_range(1)


def _rate(text):
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(
            "must be at least 1 (got %d); leave the option out to leave the rate unset" % value)
    return _positive(text)


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not a number of seconds" % text) from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError("must be 0.1 ..= 3600 seconds (got %s)" % text)
    return value


def _rate_or_clear(text):
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative (got %d); 0 clears the rate" % value)
    return _count(text)


def _size_unit(text):
    value = _integer(text)
    if value != 0 and value < 512:
        raise argparse.ArgumentTypeError("must be 0 (off) or at least 512 bytes (got %d)" % value)
    return _count(text)


def _nqn(text):
    if not 1 <= len(text) <= MAX_NQN_LEN or not all('!' <= c <= '~' for c in text):
        raise argparse.ArgumentTypeError(
            "an NQN is 1 ..= %d characters of printable ASCII without spaces (got %r)"
            % (MAX_NQN_LEN, text))
    return text


def _name(text):
    """An object name as the target checks it (spdk-sys's check_name)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    if len(text) > MAX_NAME_LEN or not all('!' <= c <= '~' for c in text):
        raise argparse.ArgumentTypeError(
            "a name is 1 ..= %d characters of printable ASCII without spaces (got %r)" % (MAX_NAME_LEN, text))
    return text


def _group_name(text):
    if not 1 <= len(text) <= MAX_GROUP_NAME_LEN or not set(text) <= _GROUP_NAME_CHARS:
        raise argparse.ArgumentTypeError(
            "a group name is 1 ..= %d characters: letters, digits and - _ . : (got %r)"
            % (MAX_GROUP_NAME_LEN, text))
    return text


def _group_name_or_none(text):
    """A group name, or '' for none (qos_host_update: the host leaves its group)."""
    return text if text == '' else _group_name(text)


def _uuid(text):
    try:
        uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not a UUID" % text) from None
    return text


# Checks between two options, made by argparse while it parses: the option that comes
# second finds the first one in the namespace (argparse fills in the defaults, None,
# before it reads any option), so the order on the command line does not matter.

class _Rule:
    def __init__(self, a, b, ok, message):
        self.a, self.b, self.ok, self.message = a, b, ok, message


def _flag(dest):
    return '--' + dest.replace('_', '-')


def _exclusive(a, b):
    return _Rule(a, b, lambda x, y: False,
                 lambda x, y: "%s and %s cannot be used together: a QoS reservation is given for "
                              "reads and writes together (--min-iops, --min-mibps) or apart "
                              "(--min-read-*, --min-write-*), not both" % (_flag(a), _flag(b)))


def _at_most(a, b, what):
    return _Rule(a, b, lambda x, y: x <= y,
                 lambda x, y: "%s %d is above %s %d: %s" % (_flag(a), x, _flag(b), y, what))


class _Checked(argparse.Action):
    """Stores the value, then applies the rules that involve this option."""

    def __init__(self, option_strings, dest, rules=(), **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.rules = [r for r in rules if dest in (r.a, r.b)]

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        for rule in self.rules:
            a = getattr(namespace, rule.a, None)
            b = getattr(namespace, rule.b, None)
            if a is not None and b is not None and not rule.ok(a, b):
                parser.error(rule.message(a, b))


class _Refused(argparse.Action):
    """An option the method does not take, refused with a reason."""

    def __init__(self, option_strings, dest, reason='', **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("%s: %s" % (option_string, self.reason))


def _params(args, names):
    """The parameters the user gave, by name; options left out are not sent."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


KEEPS = 'left out: keeps its current value'


def _help(text, default=None, update=False, extra=''):
    """An option's help: `text`, then what a left-out option does: on an *_update
    command it keeps its current value; elsewhere the target's default, "(default X)"
    for a value, "(default: words)" for a behaviour. rpc-scripts/tests/test_schema.py
    checks both against the target's parameter structs (rpc-scripts/schema)."""
    if update:
        return '%s (%s%s)' % (text, KEEPS, extra)
    if default is None:
        return text
    return '%s (default%s%s%s)' % (text, '' if default.startswith(':') else ' ', default, extra)


# Domains

MAX_PERIOD_MS = 60000  # qos-core's MAX_PERIOD
_DOMAIN_RULES = [
    _at_most('capacity_iops_stddev', 'capacity_iops', "the standard deviation cannot exceed the capacity"),
    _at_most('capacity_mibps_stddev', 'capacity_mibps', "the standard deviation cannot exceed the capacity"),
    _Rule('check_interval_us', 'period_ms', lambda us, ms: us * 4 <= ms * 1000,
          lambda us, ms: "--check-interval-us %d is above a quarter of --period-ms %d (%d us)"
                         % (us, ms, ms * 250)),
    _Rule('operating_in_flight_milli', 'operating_latency_us', lambda q, lat: False,
          lambda q, lat: "--operating-in-flight-milli and --operating-latency-us cannot be used together: "
                         "give the operating point one way (or by --efficiency-milli)"),
    _Rule('release_burst_us', 'period_ms', lambda us, ms: us <= ms * 1000,
          lambda us, ms: "--release-burst-us %d is above --period-ms %d (%d us)" % (us, ms, ms * 1000)),
]

# (param, type, help, default); all optional.
_DOMAIN_OPTIONS = [
    ('capacity_iops', _positive,
     "the target's saturated IOPS (C_G) as a starting hint for the capacity estimator; without it "
     "the first period with load runs without a budget and the estimate is learned from there",
     ': learned from the target'),
    ('capacity_iops_stddev', _count,
     "standard deviation of the IOPS profile; the estimator stays above capacity - 3 * stddev", '0'),
    ('capacity_mibps', _positive, "profiled bandwidth in MiB/s; needed for MiB/s reservations", ': none'),
    ('capacity_mibps_stddev', _count, "standard deviation of the bandwidth profile", '0'),
    ('per_host_max_iops', _positive, "most IOPS one host can do alone (C_L)", ': the capacity'),
    ('per_host_max_mibps', _positive, "most MiB/s one host can do alone", ': the capacity'),
    ('period_ms', _int_range(10, MAX_PERIOD_MS), "QoS period T in ms, 10 ..= 60000", '1000'),
    ('check_interval_us', _int_range(10, MAX_PERIOD_MS * 250), "monitor interval in us, 10 ..= period / 4", '1000'),
    ('batch_ops', _positive, "global tokens per acquisition, operations; with --batch-bytes", ': auto'),
    ('batch_bytes', _positive, "global tokens per acquisition, bytes; with --batch-ops", ': auto'),
    ('estimator_history', _int_range(1, 1000), "estimator window M in periods, 1 ..= 1000", '4'),
    ('estimator_increment_milli', _count, "estimator increment eta, thousandths of the profile", '10'),
    ('estimator_probe_backoff', _int_range(0, 1000),
     "most saturated periods the estimator waits between probes that failed, 0 ..= 1000; "
     "0 probes whenever a period is saturated, as Haechi does", '2'),
    ('estimator_drop_milli', _int_range(0, 1000),
     "a period with reservations starved that served this many thousandths less than the "
     "estimate restarts the estimate there (a sudden capacity drop), 0 ..= 1000; "
     "0 averages it like any period", '50'),
    ('estimator_hold_milli', _int_range(0, 500),
     "weighted sharing: a period in which the hosts claimed every slice offered and used all "
     "but this many thousandths of the estimate counts as saturated, and a probe that falls "
     "that short goes back, instead of averaging them in: more throughput, less of their "
     "weighted share for hosts bound by their queue depth, 0 ..= 500", '0: off'),
    ('underuse_periods', _int_range(0, _U32), "periods of under-use before a host is flagged", '3'),
    ('release_burst_us', _int_range(0, MAX_PERIOD_MS * 1000),
     "with --release paced: how far hosts may run ahead of the release schedule, in us, at most the period",
     ': one check interval'),
    ('efficiency_milli', _int_range(1, 1000),
     "efficiency eta of the operating point, thousandths: the fewest commands in flight that give "
     "this much of the most the target's learned depth curve shows (qos_stats_get's operating_point), "
     "1 ..= 1000", '970'),
    ('operating_in_flight_milli', _positive,
     "the operating point by its depth instead of efficiency: Q*, commands in flight at the base in "
     "thousandths (the deepest point of the learned curve not above it); not with --operating-latency-us",
     ': by efficiency'),
    ('operating_latency_us', _positive,
     "the operating point by its latency instead of efficiency: L*, a command's time at the base in "
     "microseconds (the deepest point of the learned curve whose latency is not above it)",
     ': by efficiency'),
]
_COST_OPTIONS = [
    ('write_weight_milli', _int_range(1, 100000), "cost of a write in thousandths of a read, 1 ..= 100000", '1000'),
    ('size_unit', _size_unit,
     "when set, a command costs one op per started size_unit bytes; 0 or >= 512", '0'),
]
# Help of the domain parameters that _add_schema_options declares from the schema:
# (text, what a left-out option does when the target prints no default). Optional: a
# parameter without an entry gets an option all the same, whose help points to docs/rpc.md.
_DOMAIN_HELP = {
    'bypass': ('hold nothing: every command goes to the base at once, counted and accounted '
               'as usual (qos_stats_get: held_by.bypassed); for an incident, or to measure '
               'what the QoS costs; changing only this starts no new period', ': off'),
    'operating_over_circulation': (
        'with --sharing operating_point: the operating point is N*, commands circulating outside '
        'QoS, learned online as the fewest that keep the target at --efficiency-milli of what it '
        'does holding nothing (qos_stats_get: operating_point.circulation.learned); not with '
        '--operating-latency-us', ': off (the operating point is at the base)'),
}


def _load_schema(name):
    """The methods of schema/<name> beside this file (the target's parameters, read off
    its structs; make install puts it there too), or {} without it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schema', name)
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)['methods']
    except (OSError, ValueError, KeyError):
        return {}


_TARGET_SCHEMA = _load_schema('target.json')


def _schema_default(p):
    """The default a left-out parameter takes, as _help writes it, or None."""
    value = p.get('default')
    if value is None:
        return None
    if isinstance(value, bool):
        return 'on' if value else 'off'
    return '"%s"' % value if p['type'] == 'string' else str(value)


def _add_schema_options(p, method, helps, rules=(), schema=None):
    """An option for each parameter of `method` in the target's schema that `p` has no
    option for: its flag, type, range or choices and default are the schema's, its help
    `helps`'s entry. So a new target parameter needs no edit here."""
    schema = _TARGET_SCHEMA if schema is None else schema
    update = method.endswith('_update')
    declared = {a.dest for a in p._actions}
    for param in (schema.get(method) or {}).get('params', []):
        dest = param['name']
        if dest in declared:
            continue
        text, words = helps.get(dest, ('see %s in docs/rpc.md' % method.replace('_update', '_create'), None))
        default = _schema_default(param) or words
        if param.get('fixed'):
            action = p.add_argument(_flag(dest), action=_Refused, help=argparse.SUPPRESS,
                                    reason='the target accepts only the current value')
        elif param['type'] == 'boolean':
            action = p.add_argument(_flag(dest), action=argparse.BooleanOptionalAction, default=None,
                                    help=_help(text, default, update))
        elif param['type'] == 'enum':
            action = p.add_argument(_flag(dest), choices=param['choices'], help=_help(text, default, update))
        elif param['type'] == 'integer':
            kind = _int_range(param['min'], param['max'], param.get('or_zero', False))
            action = p.add_argument(_flag(dest), type=kind, action=_Checked, rules=rules, metavar='N',
                                    required=param['required'], help=_help(text, default, update))
        else:
            action = p.add_argument(_flag(dest), required=param['required'], help=_help(text, default, update))
        # tests/test_schema.py sends each of these (tests/test_commands.py need not list them).
        action.from_schema = True


def _sent(p):
    """Makes the command send every option of `p` that is a parameter (the ones given)."""
    p.set_defaults(qos_params=[a.dest for a in p._actions
                               if not isinstance(a, (argparse._HelpAction, _Refused))])


def _add_domain_options(p, create):
    update = not create
    p.add_argument('-n', '--name', required=True, type=_name,
                   help='domain name' + (', unique' if create else ''))
    for dest, kind, text, default in _DOMAIN_OPTIONS:
        p.add_argument(_flag(dest), type=kind, action=_Checked,
                       rules=_DOMAIN_RULES, metavar='N', help=_help(text, default, update))
    p.add_argument('--estimator', action=argparse.BooleanOptionalAction, default=None,
                   help=_help('adaptive capacity estimation, Haechi Algorithm 1', 'on', update))
    p.add_argument('--mode', choices=['haechi', 'basic'],
                   help=_help('haechi: unused reservation becomes global tokens; basic: none', 'haechi', update))
    p.add_argument('--release', choices=['paced', 'start'],
                   help=_help('paced: reservations and limits are released over the period; first come\'s global '
                              'pool then holds nothing while no reservation is behind, and is paced (never '
                              'closed) while a backlogged host is; start: all at the period start, and the pool '
                              'is the estimate less the reservations, as Haechi', 'paced', update))
    p.add_argument('--sharing', choices=['weighted', 'first_come', 'operating_point'],
                   help=_help('weighted: the capacity nobody reserved is split by weight among backlogged hosts '
                              'and groups, whatever their queue depth; first_come: Haechi\'s open global pool, '
                              'deeper queues get more; operating_point (experimental): first come, and excess '
                              'admitted only while the commands in flight at the base are below Q* of the learned '
                              'depth curve, in weighted order; tenant groups need weighted or operating_point', 'first_come', update))
    for dest, kind, text, default in _COST_OPTIONS:
        if create:
            p.add_argument(_flag(dest), type=kind, metavar='N', help=_help(text, default))
        else:
            p.add_argument(_flag(dest), action=_Refused, help=argparse.SUPPRESS,
                           reason="the cost model of a domain cannot change; delete and create the domain")
    _add_schema_options(p, 'qos_domain_create' if create else 'qos_domain_update', _DOMAIN_HELP, _DOMAIN_RULES)
    _sent(p)


def qos_domain_create(args):
    _print_result(args.client.call('qos_domain_create', _params(args, args.qos_params)))


def qos_domain_update(args):
    _print_result(args.client.call('qos_domain_update', _params(args, args.qos_params)))


def qos_domain_delete(args):
    _print_result(args.client.call('qos_domain_delete', _params(args, ['name'])))


def qos_domain_get(args):
    _print_result(args.client.call('qos_domain_get', _params(args, ['name'])))


# Hosts

_TOGETHER = ['min_iops', 'min_mibps']
_APART = ['min_read_iops', 'min_read_mibps', 'min_write_iops', 'min_write_mibps']
_MAX = ['max_iops', 'max_mibps', 'max_read_iops', 'max_read_mibps', 'max_write_iops', 'max_write_mibps']
_SOFT = ['soft_min_iops', 'soft_min_mibps']
_BURST = ['burst_iops', 'burst_mibps']
MAX_BURST_SECONDS = 86400  # qos-core's burst::MAX_BURST_SECONDS


def _burst_rules(update):
    """A burst is at least the limit it bursts above (on update 0 clears either)."""
    def rule(m):
        a, b = 'max_' + m, 'burst_' + m
        return _Rule(a, b, lambda x, y: (update and (x == 0 or y == 0)) or x <= y,
                     lambda x, y: "%s %d is below %s %d: a burst is above the limit; raise %s or lower %s"
                                  % (_flag(b), y, _flag(a), x, _flag(b), _flag(a)))
    return [rule('iops'), rule('mibps')]


def _add_burst_options(p, rules, update, whose):
    """--burst-iops, --burst-mibps and --burst-seconds (issue 28), for hosts and groups."""
    rate = _rate_or_clear if update else _rate
    for dest in _BURST:
        unit = 'MiB/s' if dest.endswith('mibps') else 'IOPS'
        text = ("burst in %s above %s limit, on credit earned under it; needs --max-%s and --burst-seconds"
                % (unit, whose, dest[6:]))
        p.add_argument(_flag(dest), type=rate, action=_Checked, rules=rules, metavar='N',
                       help=_help(text, update=update, extra='; 0 clears it'))
    p.add_argument('--burst-seconds', type=_int_range(1, MAX_BURST_SECONDS), metavar='S',
                   help=_help('how long a full burst bucket lasts at the burst rate, 1 ..= %d s '
                              '(at least one QoS period); credit starts full' % MAX_BURST_SECONDS,
                              update=update, extra='; clearing both burst rates clears it'))

def _host_rules(update):
    """A reservation is given together or apart, is at most the limit, and the soft
    guarantee lies between them; on update a rate of 0 clears it, so a 0 on either side
    of a bound is no conflict."""
    def at_most(a, b, what):
        r = _at_most(a, b, what)
        if update:
            return _Rule(a, b, lambda x, y: x == 0 or y == 0 or x <= y, r.message)
        return r
    return ([_exclusive(a, b) for a in _TOGETHER for b in _APART]
            + [at_most('min_' + m[4:], m, "a QoS reservation cannot be above its limit") for m in _MAX]
            + [at_most('min_' + s[9:], s, "the soft guarantee is at least the hard one") for s in _SOFT]
            + [at_most(s, 'max_' + s[9:], "the soft guarantee cannot be above the limit") for s in _SOFT]
            + _burst_rules(update))


_HOST_PARAMS = ['domain', 'host_nqn', *_TOGETHER, *_APART, *_MAX, 'weight', 'priority', *_SOFT, 'group',
                *_BURST, 'burst_seconds']


def _rate_help(dest):
    kind, rest = dest.split('_', 1)
    unit = 'MiB/s' if rest.endswith('mibps') else 'IOPS'
    direction = ('reads' if '_read_' in dest else 'writes' if '_write_' in dest
                 else 'reads and writes together')
    if kind == 'soft':
        return "soft guarantee in %s, at least the hard one, from unreserved capacity by priority" % unit
    if kind == 'min':
        return "QoS reservation (guaranteed minimum) in %s, %s" % (unit, direction)
    return "limit in %s, %s" % (unit, direction)


def _add_host_options(p, update):
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-q', '--host-nqn', required=True, type=_nqn, help='the host NQN')
    rules = _host_rules(update)
    rate = _rate_or_clear if update else _rate

    def rate_help(dest):
        return _help(_rate_help(dest), update=update, extra='; 0 clears it') if update else _rate_help(dest)
    for dest in _TOGETHER + _APART + _MAX:
        p.add_argument(_flag(dest), type=rate, action=_Checked, rules=rules, metavar='N', help=rate_help(dest))
    p.add_argument('-w', '--weight', type=_int_range(1, 1000), metavar='N',
                   help=_help('share of unreserved capacity, 1 ..= 1000', '1', update))
    p.add_argument('-p', '--priority', choices=['low', 'medium', 'high', 'urgent'],
                   help=_help('order of soft grants', 'medium', update))
    for dest in _SOFT:
        p.add_argument(_flag(dest), type=rate, action=_Checked, rules=rules, metavar='N', help=rate_help(dest))
    _add_burst_options(p, rules, update, 'its')
    if update:
        p.add_argument('--group', type=_group_name_or_none, metavar='NAME',
                       help=_help("the host's tenant group (qos_group_create)", update=True,
                                  extra="; '' makes it a lone host"))
    else:
        p.add_argument('--group', type=_group_name, metavar='NAME',
                       help="the host's tenant group (qos_group_create); left out: a lone host")


def qos_host_set(args):
    _print_result(args.client.call('qos_host_set', _params(args, _HOST_PARAMS)))


def qos_host_update(args):
    _print_result(args.client.call('qos_host_update', _params(args, _HOST_PARAMS)))


def qos_host_remove(args):
    _print_result(args.client.call('qos_host_remove', _params(args, ['domain', 'host_nqn'])))


def qos_host_get(args):
    _print_result(args.client.call('qos_host_get', _params(args, ['domain', 'host_nqn'])))


# Tenant groups (domain -> group -> host). Rates are for the group's hosts together,
# reads and writes together.

_GROUP_RATES = ['min_iops', 'min_mibps', 'max_iops', 'max_mibps']
_GROUP_PARAMS = ['domain', 'name', *_GROUP_RATES, 'weight', *_BURST, 'burst_seconds']


def _group_rules(update):
    """A group's reservation is at most its limit; on update a limit of 0 clears it."""
    def rule(m):
        a, b = 'min_' + m, 'max_' + m
        return _Rule(a, b, lambda x, y: (update and y == 0) or x <= y,
                     lambda x, y: "%s %d is above %s %d: a group's reservation cannot be above its limit; "
                                  "lower %s or raise %s" % (_flag(a), x, _flag(b), y, _flag(a), _flag(b)))
    return [rule('iops'), rule('mibps')] + _burst_rules(update)


def _group_rate_help(dest, update):
    kind, rest = dest.split('_', 1)
    unit = 'MiB/s' if rest == 'mibps' else 'IOPS'
    if kind == 'min':
        text = "the group's QoS reservation in %s, guaranteed to its hosts together" % unit
    else:
        text = "the group's limit in %s, for its hosts together" % unit
    return _help(text, update=update, extra='; 0 clears it')


def _add_group_options(p, update):
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-n', '--name', required=True, type=_group_name,
                   help='group name, 1 ..= 64 letters, digits and - _ . :' + ('' if update else ', unique'))
    rules = _group_rules(update)
    for dest in _GROUP_RATES:
        p.add_argument(_flag(dest), type=_rate_or_clear if update else _rate, action=_Checked, rules=rules,
                       metavar='N', help=_group_rate_help(dest, update))
    p.add_argument('-w', '--weight', type=_int_range(1, 1000), metavar='N',
                   help=_help('share of unreserved capacity among groups and lone hosts, 1 ..= 1000', '1', update))
    _add_burst_options(p, rules, update, "the group's")


def qos_group_create(args):
    _print_result(args.client.call('qos_group_create', _params(args, _GROUP_PARAMS)))


def qos_group_update(args):
    _print_result(args.client.call('qos_group_update', _params(args, _GROUP_PARAMS)))


def qos_group_delete(args):
    _print_result(args.client.call('qos_group_delete', _params(args, ['domain', 'name'])))


def qos_group_get(args):
    _print_result(args.client.call('qos_group_get', _params(args, ['domain', 'name'])))


# QoS bdevs

_BDEV_CREATE_PARAMS = ['name', 'base_bdev_name', 'domain', 'host_nqn', 'uuid']


def _add_bdev_create_options(p):
    p.add_argument('-n', '--name', required=True, type=_name, help='name of the new QoS bdev')
    p.add_argument('-b', '--base-bdev-name', required=True, type=_name,
                   help='the bdev it is stacked on (may already carry other QoS bdevs)')
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-q', '--host-nqn', required=True, type=_nqn, help='the host whose I/O this bdev carries')
    p.add_argument('-u', '--uuid', type=_uuid, help='UUID of the new bdev (optional)')


def qos_bdev_create(args):
    _print_result(args.client.call('qos_bdev_create', _params(args, _BDEV_CREATE_PARAMS)))


def qos_bdev_delete(args):
    _print_result(args.client.call('qos_bdev_delete', _params(args, ['name'])))


def qos_bdev_get(args):
    _print_result(args.client.call('qos_bdev_get', _params(args, ['name'])))


# Initiator plugin (libnvmf_qos_ini.so in bdevperf, fio's SPDK bdev ioengine...):
# docs/rpc.md, "Initiator plugin". (param, type, help); all optional.

_MIB = 1 << 20
_US = _int_range(1, 3600000000)
# (param, type, help, default)
_INI_OPTIONS = [
    ('acquire_ops', _int_range(1, _U32), "global tokens asked for per ACQUIRE, operations", '256'),
    ('acquire_bytes', _int_range(0, _U32 * 4096),
     "global tokens per ACQUIRE, bytes; used only for hosts with a MiB/s reservation", '16777216'),
    ('prefetch_milli', _int_range(0, 1000),
     "ask for more when global tokens fall below this many thousandths of a batch", '250'),
    ('request_timeout_us', _int_range(10, 60000000),
     "a vendor command unanswered this long has timed out, 10 ..= 60000000", '10000'),
    ('retry_after_us', _int_range(1, 60000000), "wait after an ACQUIRE that granted nothing", '1000'),
    ('refresh_interval_us', _int_range(1000, 3600000000), "re-read the period state at least this often", '100000'),
    ('probe_attempts', _int_range(1, 1000),
     "unanswered state requests before the first answer that mean pass-through", '3'),
    ('open_pool_batches', _int_range(0, 1 << 20),
     "a host without limits sends without global tokens while the target's pool is open to it and held "
     "at least this many batches (acquire_ops); 0 (default): every command waits for a token", '0'),
    ('chunk_bytes', _int_range(4096, 16 * _MIB),
     "pacer group: the largest chunk (with --chunk-auto) or the chunk (--no-chunk-auto); I/O larger than "
     "the chunk is split, 4096 ..= 16777216 (16 MiB)",
     '131072'),
    ('link_mibps', _int_range(1, 100000000), "pacer group: link bandwidth, MiB/s", '2800'),
    ('link_iops', _int_range(1, 1000000000), "pacer group: link operation rate", '1000000'),
    ('latency_target_us', _US, "pacer group: p99 target of the probe; with the automatic target, its ceiling",
     '200'),
    ('latency_target_auto_milli', _int_range(1000, 100000, or_zero=True),
     "pacer group: the target is this many thousandths of the probe's lowest latency, "
     "1000 ..= 100000, or 0 for the fixed latency_target_us", '0'),
    ('probe_interval_us', _US, "pacer group: probe period while small I/O is active", '500'),
    ('probe_window', _int_range(1, 100000), "pacer group: probe samples kept for the p99", '1000'),
    ('aimd_interval_us', _US, "pacer group: AIMD decision interval", '1000'),
    ('increase_milli', _int_range(1, 1000), "pacer group: additive increase per interval, thousandths of the link",
     '20'),
    ('latency_idle_us', _US, "pacer group: small I/O counts as gone after this long without any", '100000'),
    ('dirs_late_gap_us', _US, "pacer group: DIRS late signals closer than this count once", '1000'),
    ('dirs_recovery_us', _US, "pacer group: DIRS recovery timer", '10000'),
    ('dirs_reset_us', _US, "pacer group: DIRS reset timer", '100000'),
    ('dirs_window_us', _US, "pacer group: DIRS observation window", '10000'),
]
_INI_FLAGS = [
    ('token_protocol', "speak the token protocol with the target", 'on'),
    ('pacing', "split large I/O into chunks and pace them", 'on'),
    ('split_always', "pacer group: split and pace large I/O even while no small I/O is seen, for a link "
                     "shared with traffic this process does not see", 'off: large I/O alone goes whole'),
    ('dirs', "pacer group: DIRS initial rate for new streams", 'on'),
    ('chunk_auto', "pacer group: the chunk follows the path while small I/O shares it: the latency "
                   "target's slack over the probe's base latency times link_mibps, at least "
                   "link_mibps / link_iops, at most chunk_bytes", 'on'),
]
_INI_PARAMS = [o[0] for o in _INI_OPTIONS] + [f[0] for f in _INI_FLAGS]


def _add_ini_options(p, update):
    for dest, kind, text, default in _INI_OPTIONS:
        p.add_argument(_flag(dest), type=kind, metavar='N', help=_help(text, default, update))
    for dest, text, default in _INI_FLAGS:
        p.add_argument(_flag(dest), action=argparse.BooleanOptionalAction, default=None,
                       help=_help(text, default, update))


def qos_ini_bdev_create(args):
    _print_result(args.client.call(
        'qos_ini_bdev_create',
        _params(args, ['name', 'base_bdev_name', 'uuid', 'pacer_group', *_INI_PARAMS])))


def qos_ini_bdev_delete(args):
    _print_result(args.client.call('qos_ini_bdev_delete', _params(args, ['name'])))


def qos_ini_bdev_get(args):
    _print_result(args.client.call('qos_ini_bdev_get', _params(args, ['name'])))


def qos_ini_stats_get(args):
    _print_result(args.client.call('qos_ini_stats_get', _params(args, ['name'])))


def qos_version_get(args):
    _print_result(args.client.call('qos_version_get'))


def qos_ini_version_get(args):
    _print_result(args.client.call('qos_ini_version_get'))


def qos_ini_bdev_set_options(args):
    _print_result(args.client.call('qos_ini_bdev_set_options', _params(args, ['name', *_INI_PARAMS])))


def _rpc_error(ex):
    """The JSON-RPC error object of an exception raised by an rpc.py client, or None.

    SPDK's clients (JSONRPCClient, JSONRPCGoClient) raise JSONRPCException, whose only
    attribute is `message`: "request:\\n<params>\\nGot JSON-RPC error response\\n
    response:\\n<error object as indented JSON>". JSON strings escape newlines, so the
    last "response:\\n" starts the error object."""
    message = getattr(ex, 'message', None)
    if not isinstance(message, str):
        return None
    _, found, tail = message.rpartition('response:\n')
    if not found:
        return None
    try:
        error, _ = json.JSONDecoder().raw_decode(tail.strip())
    except ValueError:
        return None
    return error if isinstance(error, dict) else None


def _error_text(ex):
    error = _rpc_error(ex)
    if error is not None and 'message' in error:
        return "%s (%s)" % (error['message'], error.get('code'))
    return getattr(ex, 'message', None) or str(ex) or type(ex).__name__


def _undo(client, failed, steps):
    """Runs the undo steps after `failed` went wrong; says on stderr what was undone and
    what is left, then the caller re-raises the original error."""
    print("qos_bdev_expose: %s failed; undoing what was done" % failed, file=sys.stderr)
    for method, params, by_hand in steps:
        try:
            client.call(method, dict(params))
            print("  undone: %s %s" % (method, json.dumps(params, sort_keys=True)), file=sys.stderr)
        except Exception as ex:
            print("  could not undo: %s %s: %s\n  left behind; remove it with: %s"
                  % (method, json.dumps(params, sort_keys=True), _error_text(ex), by_hand),
                  file=sys.stderr)


def _expose_by_steps(args):
    """qos_bdev_expose done with the three methods, for a target without it."""
    client = args.client
    created = client.call('qos_bdev_create', _params(args, _BDEV_CREATE_PARAMS))
    bdev = created if isinstance(created, str) else args.name
    delete_bdev = ('qos_bdev_delete', {'name': bdev},
                   "rpc.py --plugin qos_rpc qos_bdev_delete -n %s" % bdev)

    namespace = {'bdev_name': bdev, 'no_auto_visible': True}
    if args.nsid is not None:
        namespace['nsid'] = args.nsid
    try:
        nsid = client.call('nvmf_subsystem_add_ns', {'nqn': args.nqn, 'namespace': namespace})
    except Exception:
        _undo(client, 'nvmf_subsystem_add_ns', [delete_bdev])
        raise

    try:
        client.call('nvmf_ns_add_host', {'nqn': args.nqn, 'nsid': nsid, 'host': args.host_nqn})
    except Exception:
        remove_ns = ('nvmf_subsystem_remove_ns', {'nqn': args.nqn, 'nsid': nsid},
                     "rpc.py nvmf_subsystem_remove_ns %s %s" % (args.nqn, nsid))
        _undo(client, 'nvmf_ns_add_host', [remove_ns, delete_bdev])
        raise
    return nsid


def qos_bdev_expose(args):
    try:
        nsid = args.client.call('qos_bdev_expose', _params(args, [*_BDEV_CREATE_PARAMS, 'nqn', 'nsid']))
    except Exception as ex:
        error = _rpc_error(ex)
        if error is None or error.get('code') != METHOD_NOT_FOUND:
            raise
        nsid = _expose_by_steps(args)
    _print_result(nsid)


# Statistics

def _fmt_amount(value):
    """An {ops, bytes} amount as "12 ops, 3.0 MiB"; other values as they are."""
    if isinstance(value, dict):
        parts = []
        if value.get('ops') is not None:
            parts.append('%d ops' % value['ops'])
        if value.get('bytes') is not None:
            parts.append('%.1f MiB' % (value['bytes'] / (1 << 20)))
        return ', '.join(parts) or '-'
    return '-' if value is None else str(value)


def _fmt_rates(value):
    """A min or max setting as "iops=100,read_mibps=5", whether it is flat
    ({"iops": 100, "read_mibps": 5}) or grouped ({"total": {...}, "read": {...}})."""
    if not isinstance(value, dict):
        return '-' if value is None else str(value)
    parts = []
    for key, item in value.items():
        if isinstance(item, dict):
            for sub, number in item.items():
                if number is not None:
                    parts.append('%s=%s' % (sub if key == 'total' else key + '_' + sub, number))
        elif item is not None:
            parts.append('%s=%s' % (key, item))
    return ','.join(parts) or '-'


def _fmt_met(value):
    return '-' if value is None else '%.1f%%' % (100.0 * value)


def _fmt_flags(host):
    flags = [name for key, name in (('underuse_flag', 'underuse'), ('reservation_at_risk', 'at-risk'),
                                    ('reservation_unreachable', 'unreachable'))
             if host.get(key)]
    return ','.join(flags) or '-'


def _fmt_burst(host):
    """Burst credit left in seconds at the burst rate, and whether the host bursts now."""
    burst = host.get('burst')
    if not isinstance(burst, dict):
        return '-'
    text = '%.1fs' % burst.get('credit_seconds', 0.0)
    return text + ' bursting' if burst.get('bursting') else text


def _ms(ns):
    return '-' if ns is None else '%g ms' % (ns / 1e6)


def _fmt_entitlement(host):
    """What the host is entitled to at the operating point, whether QoS held it
    (contending) or not (self-limited), and the queue depth its entitlement takes."""
    e = host.get('entitlement')
    if not e:
        return '-'
    return '%d/s %s, QD %.1f' % (e.get('entitled', 0),
                                 'contending' if e.get('contending') else 'self-limited',
                                 e.get('queue_depth_needed', 0.0))


def _capacity_estimate(d):
    """The capacity estimate as the table shows it: `learning` before the target has had a
    period with load (no capacity given), and a warning when the reservations exceed it or
    take all of it (the estimator holds the estimate at the reservations: the target
    serves less than was reserved, or a fixed capacity is reserved in full)."""
    if d.get('capacity_learning'):
        return 'learning (no capacity given)'
    text = _fmt_amount(d.get('capacity_estimate'))
    est, res = (d.get('capacity_estimate') or {}).get('ops'), (d.get('reserved') or {}).get('ops')
    if est is not None and res and res > est:
        text += ' (reservations %s exceed it)' % _fmt_amount(d.get('reserved'))
    elif est is not None and res and res == est:
        text += ' (reservations take all of it)'
    return text

# The rules that hold a command, in qos_stats_get's `held_by` (HoldReason in qos-core).
HOLD_REASONS = ('limit', 'burst', 'reservation', 'share', 'budget', 'window')


def _fmt_held_by(host, prev=None, seconds=None):
    """Commands that entered the hold queue by the rule that held them, and those the
    bypass let through: totals, or per second against `prev` over `seconds`; only the
    non-zero ones, largest first; '-' when none."""
    now = host.get('held_by')
    if not isinstance(now, dict):
        return '-'
    before = (prev or {}).get('held_by') or {}
    counts = []
    for reason in HOLD_REASONS + ('bypassed',):
        n = now.get(reason, 0) - (before.get(reason, 0) if prev is not None else 0)
        if seconds:
            n = n / seconds
        if n > 0:
            counts.append((n, reason))
    if not counts:
        return '-'
    counts.sort(key=lambda c: (-c[0], c[1]))
    return ' '.join('%s:%.0f' % (r, n) for n, r in counts)


def _domain_mode(d):
    """`, BYPASS (holds nothing)` or `, pool paced for a reservation`, or nothing."""
    if d.get('bypass'):
        return ', BYPASS (holds nothing)'
    if d.get('pool_paced'):
        return ', pool paced for a reservation behind'
    return ''


def _circulation_line(d):
    """Over the hosts' circulation (issue 39): `circulation: N commands, N* x at C* y/s
    (L* z), hold target H*, held now h`; None in the other modes."""
    op = d.get('operating_point') or {}
    c = op.get('circulation')
    if not c:
        return None
    point = ''
    if op.get('in_flight') is not None:
        point = ', N* %g at C* %s/s (L* %.0f us)' % (op['in_flight'], op.get('ops_per_s', '-'),
                                                       (op.get('latency_ns') or 0) / 1e3)
    learned = c.get('learned')
    if learned:
        ratio = learned.get('ratio')
        point += ', learned for eta %g: held/open rate %s over %s triplets' % (
            (op.get('efficiency_milli') or 0) / 1e3,
            '-' if ratio is None else '%.3f' % ratio, learned.get('triplets', 0))
    return 'circulation: %s commands%s, hold target %s, held now %s' % (
        c.get('commands', '-'), point, c.get('hold_target', '-'), c.get('held', '-'))


def _print_stats_table(domains):
    if isinstance(domains, dict):
        domains = [domains]
    header = ('HOST', 'MIN', 'MAX', 'COMPLETED THIS PERIOD', 'MET', 'HELD', 'HELD BY', 'BURST', 'ENTITLED',
              'FLAGS')
    for i, d in enumerate(domains or []):
        if i:
            print()
        print("domain %s: epoch %s, period %s (%s elapsed), capacity estimate %s per period, global available %s%s"
              % (d.get('name', '-'), d.get('epoch', '-'), _ms(d.get('period_ns')), _ms(d.get('elapsed_ns')),
                 _capacity_estimate(d), _fmt_amount(d.get('global_available')), _domain_mode(d)))
        circulation = _circulation_line(d)
        if circulation:
            print('  ' + circulation)
        rows = [header] + [(h.get('host_nqn', '-'), _fmt_rates(h.get('min')), _fmt_rates(h.get('max')),
                            _fmt_amount(h.get('completed_this_period')),
                            _fmt_met(h.get('reservation_met_fraction')),
                            '-' if h.get('held') is None else str(h['held']), _fmt_held_by(h), _fmt_burst(h),
                            _fmt_entitlement(h), _fmt_flags(h))
                           for h in d.get('hosts') or []]
        widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
        for r in rows:
            print('  '.join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _held_quantile(bounds_ns, cum_now, cum_before, q):
    """Upper bound (ns) of the bucket holding quantile q of the observations between
    two cumulative held-time histograms; None when there were none; '>last' above."""
    if not bounds_ns or not cum_now or len(cum_now) != len(bounds_ns) + 1:
        return None
    before = cum_before if cum_before and len(cum_before) == len(cum_now) else [0] * len(cum_now)
    delta = [a - b for a, b in zip(cum_now, before)]
    total = delta[-1]
    if total <= 0:
        return None
    for i, c in enumerate(delta[:-1]):
        if c >= q * total:
            return bounds_ns[i]
    return float('inf')


def _fmt_held(ns):
    if ns is None:
        return '-'
    if ns == float('inf'):
        return '>2.5s'
    if ns == 0:
        return '0'
    if ns < 1_000_000:
        return '<=%gus' % (ns / 1e3)
    return '<=%gms' % (ns / 1e6)


def _watch_rows(domains, before, seconds):
    """Rows of the watch table; `before` maps (domain, host) to the previous sample."""
    rows = []
    for d in domains or []:
        bounds = d.get('held_time_bounds_ns')
        for h in d.get('hosts') or []:
            key = (d.get('name'), h.get('host_nqn'))
            total = h.get('completed_total') or {}
            prev = before.get(key)
            if prev is not None and seconds > 0:
                ptotal = prev.get('completed_total') or {}
                iops = '%.0f' % ((total.get('ios', 0) - ptotal.get('ios', 0)) / seconds)
                mibps = '%.1f' % ((total.get('bytes', 0) - ptotal.get('bytes', 0)) / seconds / (1 << 20))
                thr = '%.0f' % ((h.get('throttled_ios', 0) - prev.get('throttled_ios', 0)) / seconds)
                held_p99 = _fmt_held(_held_quantile(bounds, (h.get('held_time') or {}).get('cumulative'),
                                                    (prev.get('held_time') or {}).get('cumulative'), 0.99))
                held_by = _fmt_held_by(h, prev, seconds)
            else:
                iops = mibps = thr = held_p99 = held_by = '-'
            pt = h.get('periods_total') or {}
            ended = sum(pt.get(k, 0) for k in ('met', 'missed', 'met_backlogged', 'missed_backlogged'))
            met = '-' if not ended else '%d/%d' % (pt.get('met', 0) + pt.get('met_backlogged', 0), ended)
            rows.append((d.get('name', '-'), h.get('host_nqn', '-'), _fmt_rates(h.get('min')),
                         _fmt_rates(h.get('max')), iops, mibps, met, str(h.get('held', '-')), thr, held_p99,
                         held_by, *_watch_entitlement(h), _fmt_flags(h)))
    return rows


def _watch_entitlement(host):
    """The watch table's ENTITLED (e_i per second at the operating point, and whether QoS
    held the host: contending, or self-limited) and SHORT/s (e_i - achieved) cells."""
    e = host.get('entitlement')
    if not e:
        return '-', '-'
    kind = 'contending' if e.get('contending') else 'self-limited'
    return '%d/s:%s' % (e.get('entitled', 0), kind), str(e.get('shortfall', 0))


_WATCH_HEADER = ('DOMAIN', 'HOST', 'MIN', 'MAX', 'IOPS', 'MiB/s', 'MET', 'HELD', 'THROTTLED/s',
                 'HELD p99', 'HELD BY/s', 'ENTITLED', 'SHORT/s', 'FLAGS')


def _print_rows(header, rows):
    rows = [header, *rows]
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        print('  '.join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _watch(args, params):
    """Refreshes a table of rates per host every args.watch seconds (Ctrl-C stops)."""
    import time
    params = dict(params, compact=True)
    before, t_before, n = {}, None, 0
    clear = sys.stdout.isatty()
    try:
        while True:
            stats = args.client.call('qos_stats_get', params)
            now = time.monotonic()
            if stats is None:  # --dry-run clients
                return
            if isinstance(stats, dict):
                stats = [stats]
            if not isinstance(stats, list):
                stats = []
            rows = _watch_rows(stats, before, (now - t_before) if t_before is not None else 0)
            if clear:
                print('\x1b[H\x1b[2J', end='')
            print('%s  every %gs  (rates over the last interval; MET: periods met / ended; HELD p99: '
                  'bucket bound of the time QoS held I/O; ENTITLED, SHORT/s: entitlement at the operating '
                  'point and shortfall over the last period; Ctrl-C stops)' % (time.strftime('%H:%M:%S'), args.watch))
            _print_rows(_WATCH_HEADER, rows)
            sys.stdout.flush()
            before = {(d.get('name'), h.get('host_nqn')): h for d in stats for h in d.get('hosts') or []}
            t_before = now
            n += 1
            if args.iterations is not None and n >= args.iterations:
                return
            print()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        pass


def qos_stats_get(args):
    params = _params(args, ['domain', 'periods', 'host_nqn'])
    if args.compact:
        params['compact'] = True
    if args.counters:
        params['counters'] = True
    if args.watch is not None:
        return _watch(args, params)
    stats = args.client.call('qos_stats_get', params)
    if args.table and isinstance(stats, (list, dict)):
        _print_stats_table(stats)
    else:
        _print_result(stats)


def spdk_rpc_plugin_initialize(subparsers):
    def command(name, func, text):
        p = subparsers.add_parser(name, help=text, description=text)
        p.set_defaults(func=func)
        return p

    p = command('qos_domain_create', qos_domain_create, 'Create a QoS domain: one target capacity shared by hosts')
    _add_domain_options(p, create=True)

    p = command('qos_domain_update', qos_domain_update,
                'Change a QoS domain; options left out keep their value, a new period starts')
    _add_domain_options(p, create=False)

    p = command('qos_domain_delete', qos_domain_delete, 'Delete a QoS domain that no QoS bdev uses')
    p.add_argument('-n', '--name', required=True, type=_name, help='domain name')

    p = command('qos_domain_get', qos_domain_get, 'Show QoS domains and their settings')
    p.add_argument('-n', '--name', type=_name, help='only this domain (optional)')

    p = command('qos_host_set', qos_host_set,
                "Create or replace a host's QoS settings in a domain; takes effect at once. Every "
                "setting is replaced: options left out are removed (qos_host_update changes some)")
    _add_host_options(p, update=False)

    p = command('qos_host_update', qos_host_update,
                "Change some of a configured host's QoS settings; options left out keep their value, "
                "a rate of 0 clears it")
    _add_host_options(p, update=True)

    p = command('qos_host_remove', qos_host_remove,
                "Remove a host's QoS settings; its QoS bdevs carry on best-effort")
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-q', '--host-nqn', required=True, type=_nqn, help='the host NQN')

    p = command('qos_host_get', qos_host_get, "Show hosts' QoS settings in a domain")
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-q', '--host-nqn', type=_nqn, help='only this host (optional)')

    p = command('qos_group_create', qos_group_create,
                'Create a tenant group: a reservation, limit and weight for its hosts together')
    _add_group_options(p, update=False)

    p = command('qos_group_update', qos_group_update,
                "Change a tenant group; options left out keep their value, a rate of 0 clears it")
    _add_group_options(p, update=True)

    p = command('qos_group_delete', qos_group_delete, 'Delete a tenant group that no host belongs to')
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-n', '--name', required=True, type=_group_name, help='group name')

    p = command('qos_group_get', qos_group_get, 'Show the tenant groups of a domain and their settings')
    p.add_argument('-d', '--domain', required=True, type=_name, help='QoS domain')
    p.add_argument('-n', '--name', type=_group_name, help='only this group (optional)')

    p = command('qos_bdev_create', qos_bdev_create, "Create a QoS bdev that carries one host's I/O to a base bdev")
    _add_bdev_create_options(p)

    p = command('qos_bdev_delete', qos_bdev_delete, 'Delete a QoS bdev; held I/O completes with an abort status')
    p.add_argument('-n', '--name', required=True, type=_name, help='QoS bdev name')

    p = command('qos_bdev_get', qos_bdev_get, 'Show QoS bdevs')
    p.add_argument('-n', '--name', type=_name, help='only this QoS bdev (optional)')

    p = command('qos_bdev_expose', qos_bdev_expose,
                'Create a QoS bdev and add it as a namespace of a subsystem visible only to its host; '
                'prints the namespace id')
    _add_bdev_create_options(p)
    p.add_argument('--nqn', required=True, type=_nqn, help='NQN of the NVMe-oF subsystem')
    p.add_argument('--nsid', type=_int_range(1, 0xFFFFFFFE), help='namespace id (optional; default: first free)')

    p = command('qos_ini_bdev_create', qos_ini_bdev_create,
                'Initiator: create a QoS bdev over a bdev_nvme namespace (token holding, chunking, pacing)')
    p.add_argument('-n', '--name', required=True, type=_name, help='name of the new initiator QoS bdev')
    p.add_argument('-b', '--base-bdev-name', required=True, type=_name,
                   help='the bdev_nvme namespace bdev it is stacked on (claimed)')
    p.add_argument('-u', '--uuid', type=_uuid, help='UUID of the new bdev (optional)')
    p.add_argument('-g', '--pacer-group', type=_name,
                   help=_help('pacer group: QoS bdevs sharing one link', '"default"'))
    _add_ini_options(p, update=False)

    p = command('qos_ini_bdev_delete', qos_ini_bdev_delete,
                'Initiator: delete a QoS bdev; held I/O is sent to the base first')
    p.add_argument('-n', '--name', required=True, type=_name, help='initiator QoS bdev name')

    p = command('qos_ini_bdev_get', qos_ini_bdev_get, 'Initiator: show QoS bdevs, their options and state')
    p.add_argument('-n', '--name', type=_name, help='only this QoS bdev (optional)')

    p = command('qos_ini_stats_get', qos_ini_stats_get,
                'Initiator: show the counters of QoS bdevs (held and paced time, chunks, vendor commands)')
    p.add_argument('-n', '--name', type=_name, help='only this QoS bdev (optional)')

    command('qos_version_get', qos_version_get,
            "Show the target plugin's version, its token protocol's version and build")
    command('qos_ini_version_get', qos_ini_version_get,
            "Initiator: show the initiator plugin's version, its token protocol's version and build")

    p = command('qos_ini_bdev_set_options', qos_ini_bdev_set_options,
                "Initiator: change a QoS bdev's options at run time (pacer options apply to its whole group)")
    p.add_argument('-n', '--name', required=True, type=_name, help='initiator QoS bdev name')
    _add_ini_options(p, update=True)

    p = command('qos_stats_get', qos_stats_get, 'Show QoS statistics per domain and host')
    p.add_argument('-d', '--domain', type=_name, help='only this domain (optional)')
    p.add_argument('--table', action='store_true',
                   help='print a table per domain (host, min, max, completed this period, met %%, held, burst credit, flags) '
                        'instead of JSON')
    p.add_argument('--periods', type=_count, metavar='N',
                   help=_help('past periods listed per host (the target keeps 128)', '16'))
    p.add_argument('-q', '--host-nqn', type=_nqn, help='only this host (optional)')
    p.add_argument('--compact', action='store_true',
                   help=_help('counters and gauges only, without the per-period history (cheap with many hosts)',
                              'off'))
    p.add_argument('--counters', action='store_true',
                   help=_help("per host only its counters and IOPS/MiB/s settings (the cluster agent's form; "
                              'over --compact)', 'off'))
    p.add_argument('--watch', type=_seconds, nargs='?', const=2.0, metavar='SECONDS',
                   help='refresh a table of rates per host (IOPS, MiB/s, periods met, held I/O, throttled I/O '
                        'per second, p99 of the time QoS held I/O) every SECONDS (default 2) until Ctrl-C')
    p.add_argument('--iterations', type=_positive, metavar='N', help='with --watch: stop after N refreshes')
