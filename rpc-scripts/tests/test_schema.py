"""qos_rpc.py against the target's parameter structs: rpc-scripts/schema/*.json is what
the Rust tests (spdk-plugin and initiator-plugin, params.rs) read off the structs and
their checks, and fail on when it is out of date. Here every command must take the same
parameters with the same names, required or not, types and choices, state the same
default in its help (or, on an *_update command, that a left-out option keeps its
value), and accept exactly the values the target accepts, probed at the same calls.

A failure names the command and the parameter. If the target changed on purpose,
regenerate the schema (UPDATE_SCHEMA=1, see rpc-scripts/README.md, "Schema") and change
qos_rpc.py until this passes; if rpc.py changed, make it agree with the schema."""

import argparse
import contextlib
import io
import json
import os
import re

import pytest

import qos_rpc
from conftest import RPC_SCRIPTS, FakeClient, make_parser

SCHEMA_FILES = ['target.json', 'initiator.json']
KEEPS = 'keeps its current value'


def _load():
    methods, chars = {}, None
    for name in SCHEMA_FILES:
        with open(os.path.join(RPC_SCRIPTS, 'schema', name), encoding='utf-8') as f:
            doc = json.load(f)
        methods.update(doc['methods'])
        chars = doc['name_chars_tried']
    return methods, chars


SCHEMA, NAME_CHARS = _load()

# Options of rpc.py's own, never sent.
CLIENT_ONLY = {'qos_stats_get': {'table', 'watch', 'iterations'}}
# Commands that are not one target method: (the method whose parameters they take,
# their own extra options).
ORCHESTRATED = {'qos_bdev_expose': ('qos_bdev_create', {'nqn', 'nsid'})}


def _commands():
    parser = make_parser()
    return next(a for a in parser._actions if a.dest == 'called_rpc_name').choices


COMMANDS = _commands()
CASES = sorted(SCHEMA) + sorted(ORCHESTRATED)


def _schema(command):
    """(the schema of the command's method, its extra options)."""
    if command in ORCHESTRATED:
        method, extra = ORCHESTRATED[command]
        return SCHEMA[method], extra
    return SCHEMA[command], set()


def _options(command):
    """The options of a command that are parameters, by parameter name."""
    skip = CLIENT_ONLY.get(command, set()) | _schema(command)[1]
    return {a.dest: a for a in COMMANDS[command]._actions
            if not isinstance(a, argparse._HelpAction) and a.dest not in skip}


def _params(command):
    return {p['name']: p for p in _schema(command)[0]['params']}


def _is_bool(action):
    return isinstance(action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction))


def _argv(command, params):
    """A command line that gives `params`."""
    options = _options(command)
    argv = [command]
    if command in ORCHESTRATED:
        argv += ['--nqn', 'nqn.2016-06.io.spdk:cnode1']
    for name, value in params.items():
        action = options[name]
        flag = next(o for o in action.option_strings if o.startswith('--'))
        if _is_bool(action):
            if value:
                argv.append(flag)
            elif isinstance(action, argparse.BooleanOptionalAction):
                argv.append('--no-' + flag[2:])
            else:
                raise AssertionError('%s %s: cannot be given as false' % (command, flag))
        else:
            argv += [flag, str(value)]
    return argv


def _run(argv):
    """(accepted, the params sent, stderr)."""
    client, err = FakeClient(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = make_parser().parse_args(argv)
        except SystemExit:
            return False, None, err.getvalue()
        args.client = client
        args.func(args)
    return True, client.calls[0][1] if client.calls else None, err.getvalue()


def _with(command, name, value):
    """The target's probing call for `name`: the context, the parameters it is probed
    with (`with`: a burst needs a limit and a bucket), and `value`."""
    companions = _params(command).get(name, {}).get('with', {})
    return dict(_schema(command)[0]['context'], **companions, **{name: value})


def _accepts(command, name, value):
    return _run(_argv(command, _with(command, name, value)))[0]


def test_every_method_has_a_command():
    assert set(COMMANDS) == set(SCHEMA) | set(ORCHESTRATED), (
        "rpc.py's commands and the target's methods (rpc-scripts/schema) differ")


def _flag(command, name):
    return '%s --%s' % (command, name.replace('_', '-'))


def _each(command):
    """(parameter, its schema, rpc.py's option) for the parameters rpc.py has."""
    options = _options(command)
    return [(name, p, options[name]) for name, p in _params(command).items() if name in options]


def _check(problems):
    assert not problems, '\n'.join(problems)


@pytest.mark.parametrize('command', CASES)
def test_options_are_the_parameters(command):
    params, options = _params(command), _options(command)
    problems = ['%s: rpc.py has no option for the target\'s parameter' % _flag(command, n)
                for n in sorted(set(params) - set(options))]
    problems += ['%s: the target has no such parameter' % _flag(command, n) for n in sorted(set(options) - set(params))]
    for name, p, action in _each(command):
        if isinstance(action, qos_rpc._Refused) != bool(p.get('fixed')):
            problems.append('%s: the target %s' % (
                _flag(command, name), 'accepts only the current value, so rpc.py must refuse it (_Refused)'
                if p.get('fixed') else 'can change it, but rpc.py refuses it'))
    _check(problems)


@pytest.mark.parametrize('command', CASES)
def test_required(command):
    _check(['%s: required is %s in rpc.py, %s at the target' % (_flag(command, name), action.required, p['required'])
            for name, p, action in _each(command) if action.required != p['required']])


@pytest.mark.parametrize('command', CASES)
def test_types_and_choices(command):
    problems = []
    for name, p, action in _each(command):
        where = _flag(command, name)
        if p.get('fixed'):
            continue
        if p['type'] == 'boolean':
            if not _is_bool(action):
                problems.append(where + ': a boolean at the target, not in rpc.py')
        elif p['type'] == 'enum':
            if action.choices is None or sorted(action.choices) != sorted(p['choices']):
                problems.append('%s: choices %s in rpc.py, %s at the target' % (where, action.choices, p['choices']))
        elif _is_bool(action) or action.choices is not None:
            problems.append(where + ': takes a %s at the target' % p['type'])
        elif p['type'] == 'integer' and not isinstance(action.type and action.type(str(p['min'])), int):
            problems.append(where + ': an integer at the target, not in rpc.py')
    _check(problems)


_DEFAULT = re.compile(r'\(default(:)? ("[^"]*"|[^ ),:;]+)')


def _render(p, value):
    """A default as the help writes it: on/off, a number, a choice, a "string"."""
    if isinstance(value, bool):
        return 'on' if value else 'off'
    if p['type'] == 'string':
        return '"%s"' % value
    return str(value)


@pytest.mark.parametrize('command', CASES)
def test_help_states_the_default_or_that_it_keeps(command):
    problems = []
    for name, p, action in _each(command):
        where, text = _flag(command, name), action.help or ''
        found = _DEFAULT.search(text)
        if p['required'] or p.get('fixed'):
            if found:
                problems.append('%s: required, but its help gives a default: %r' % (where, text))
        elif p.get('omitted') == 'keep':
            if KEEPS not in text or found:
                problems.append('%s: the target keeps the current value of a left-out option; the help must say '
                                '%r and give no default: %r' % (where, KEEPS, text))
        elif p['default'] is None:
            if found and found.group(1) is None:
                problems.append('%s: the target has no default value (unset), the help says %r'
                                % (where, found.group(0)))
        elif not found or found.group(1) is not None:
            problems.append('%s: the target\'s default is %s, the help does not say "(default %s)": %r'
                            % (where, _render(p, p['default']), _render(p, p['default']), text))
        elif found.group(2) != _render(p, p['default']):
            problems.append('%s: the help says (default %s), the target\'s is %s'
                            % (where, found.group(2), _render(p, p['default'])))
        bounds = (p.get('min_len'), p.get('max_len')) if p['type'] == 'string' else (p.get('min'), p.get('max'))
        for lo, hi in re.findall(r'(\d+) \.\.= (\d+)\b', text) if bounds != (None, None) else []:
            if (int(lo), int(hi)) != bounds:
                problems.append('%s: the help says %s ..= %s, the target takes %s' % (where, lo, hi, _range(p)))
    _check(problems)


@pytest.mark.parametrize('command', CASES)
def test_the_probing_call_is_sent_as_it_is(command):
    context = _schema(command)[0]['context']
    accepted, sent, err = _run(_argv(command, context))
    assert accepted, "%s: refuses the target's probing call %s: %s" % (command, context, err)
    if command not in ORCHESTRATED:
        assert sent == context


def _sample(command, name, p):
    """Values the target accepts for a parameter."""
    if p['type'] == 'boolean':
        return [True, False] if isinstance(_options(command)[name], argparse.BooleanOptionalAction) else [True]
    if p['type'] == 'enum':
        return p['choices']
    if p['type'] == 'integer':
        return [p['min'], p['max']]
    context = _schema(command)[0]['context']
    for value in (context.get(name), 'qa', 'nqn.2014-08.org.example:h2', '0f7c1ad8-4b4d-4a5e-9c7a-1f2e3d4c5b6a'):
        if value is not None and _accepts(command, name, value):
            return [value]
    return []


@pytest.mark.parametrize('command', CASES)
def test_each_option_is_sent_under_its_name(command):
    problems = []
    for name, p, _ in _each(command):
        if p.get('fixed'):
            continue
        values = _sample(command, name, p)
        if not values:
            problems.append('%s: refuses every name tried' % _flag(command, name))
        for value in values:
            accepted, sent, err = _run(_argv(command, _with(command, name, value)))
            if not accepted:
                problems.append('%s %s: refused by rpc.py, accepted by the target: %s'
                                % (_flag(command, name), value, err.strip().splitlines()[-1]))
            elif command not in ORCHESTRATED and (sent or {}).get(name) != value:
                problems.append('%s %s: sent %s' % (_flag(command, name), value, sent))
    _check(problems)


def _range(p):
    if 'min_len' in p:
        return '%d ..= %s characters' % (p['min_len'], p.get('max_len', 'any'))
    if 'min' not in p:
        return 'no range'
    return ('0 or ' if p.get('or_zero') else '') + '%d ..= %d' % (p['min'], p['max'])


@pytest.mark.parametrize('command', CASES)
def test_integers_take_the_targets_range(command):
    problems = []
    for name, p, _ in _each(command):
        if p['type'] != 'integer' or p.get('fixed'):
            continue
        lo, hi, zero = p['min'], p['max'], p.get('or_zero', False)
        accepted = {lo, hi} | ({0} if zero else set())
        refused = {-1, hi + 1} | ({lo - 1} if lo > 0 and not (zero and lo == 1) else set())
        if zero and lo > 1:
            refused.add(1)
        for value in sorted(accepted | refused):
            if _accepts(command, name, value) != (value in accepted):
                problems.append('%s %d: %s by rpc.py, %s by the target (%s)' % (
                    _flag(command, name), value, *(('refused', 'accepted') if value in accepted
                                                   else ('accepted', 'refused')), _range(p)))
    _check(problems)


@pytest.mark.parametrize('command', CASES)
def test_names_take_the_targets_form(command):
    problems = []
    for name, p, _ in _each(command):
        if p['type'] != 'string' or 'min_len' not in p:
            continue
        expect = {'': p['min_len'] == 0}
        if 'max_len' in p:
            expect['q' * p['max_len']] = True
            expect['q' * (p['max_len'] + 1)] = False
        for c in NAME_CHARS:
            expect['q%sq' % c] = c not in p['refused_chars']
        for value, ok in expect.items():
            if _accepts(command, name, value) != ok:
                problems.append('%s %r (%d characters): %s by the target, not by rpc.py' % (
                    _flag(command, name), value if len(value) < 20 else value[:8] + '...', len(value),
                    'accepted' if ok else 'refused'))
    _check(problems)


# A new domain parameter needs no edit in qos_rpc.py: the options qos_rpc.py does not
# declare by hand are declared from schema/target.json (bypass is one).

with open(os.path.join(RPC_SCRIPTS, 'schema', 'target.json'), encoding='utf-8') as _f:
    SCHEMA_TARGET = json.load(_f)['methods']

def test_the_plugin_reads_the_committed_schema():
    assert qos_rpc._TARGET_SCHEMA == SCHEMA_TARGET, "qos_rpc.py did not find schema/target.json beside itself"



def _parser_with(schema, monkeypatch):
    """rpc.py's parser had the target's schema been `schema`."""
    monkeypatch.setattr(qos_rpc, '_TARGET_SCHEMA', schema)
    return make_parser()


def _with_new_parameters(method):
    schema = json.loads(json.dumps(SCHEMA_TARGET))
    keep = {'omitted': 'keep'} if method.endswith('_update') else {}
    schema[method]['params'] += [
        dict({'name': 'new_knob', 'type': 'integer', 'min': 1, 'max': 10, 'required': False}, default=5, **keep),
        dict({'name': 'new_switch', 'type': 'boolean', 'required': False}, default=None, **keep),
        dict({'name': 'new_way', 'type': 'enum', 'choices': ['a', 'b'], 'required': False}, default='a', **keep),
    ]
    return schema


@pytest.mark.parametrize('method', ['qos_domain_create', 'qos_domain_update'])
def test_a_new_domain_parameter_gets_its_option_from_the_schema(method, monkeypatch):
    parser = _parser_with(_with_new_parameters(method), monkeypatch)

    def run(*extra):
        client, err = FakeClient(), io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                args = parser.parse_args([method, '-n', 'd', *extra])
            except SystemExit:
                return None, err.getvalue()
        args.client = client
        args.func(args)
        return client.calls[0][1], ''

    assert run('--new-knob', '3', '--new-switch', '--new-way', 'b')[0] == {
        'name': 'd', 'new_knob': 3, 'new_switch': True, 'new_way': 'b'}
    assert run('--no-new-switch')[0] == {'name': 'd', 'new_switch': False}
    assert run()[0] == {'name': 'd'}, "left out: not sent"
    sent, err = run('--new-knob', '11')
    assert sent is None and 'must be 1 ..= 10 (got 11)' in err
    assert run('--new-way', 'c')[0] is None
    command = next(a for a in parser._actions if a.dest == 'called_rpc_name').choices[method]
    helps = {a.dest: a.help for a in command._actions}
    if method.endswith('_update'):
        assert KEEPS in helps['new_knob']
    else:
        assert '(default 5)' in helps['new_knob'] and '(default a)' in helps['new_way']
        assert 'docs/rpc.md' in helps['new_switch']


def test_bypass_is_declared_from_the_schema(monkeypatch):
    monkeypatch.setattr(qos_rpc, '_DOMAIN_HELP', {})
    schema = json.loads(json.dumps(SCHEMA_TARGET))
    for method in ('qos_domain_create', 'qos_domain_update'):
        schema[method]['params'] = [p for p in schema[method]['params'] if p['name'] != 'bypass']
    parser = _parser_with(schema, monkeypatch)
    command = next(a for a in parser._actions if a.dest == 'called_rpc_name').choices['qos_domain_create']
    assert 'bypass' not in {a.dest for a in command._actions}, "a hand-written --bypass is left in qos_rpc.py"
