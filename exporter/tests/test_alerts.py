"""The alerting rules (dashboards/alerts.yml): valid for promtool, every alert fires in a
promtool fixture (alerts_test.yml, alerts_test_2s.yml), the fixtures fail every one-line
mutation of the rules (each `for:` to 0 and doubled, each threshold halved and doubled,
each label filter dropped), and every alert has its runbook section in
docs/operations.md. Skipped, with the reason, where promtool (Debian's `prometheus`
package, installed by .ci/run) is not on PATH."""

import copy
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / 'dashboards' / 'alerts.yml'
TESTS = pathlib.Path(__file__).resolve().parent
FIXTURES = [TESTS / 'alerts_test.yml', TESTS / 'alerts_test_2s.yml']
RUNBOOK = ROOT / 'docs' / 'operations.md'

PROMTOOL = shutil.which('promtool')
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found (apt install prometheus)")


def alerts():
    rules = yaml.safe_load(RULES.read_text())
    return [r for g in rules['groups'] for r in g['rules'] if 'alert' in r]


@needs_promtool
def test_rules_are_valid():
    out = subprocess.run([PROMTOOL, 'check', 'rules', str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_every_alert_fires_in_its_fixture():
    out = subprocess.run([PROMTOOL, 'test', 'rules'] + [f.name for f in FIXTURES], cwd=TESTS,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = set()
    for f in FIXTURES:
        for t in yaml.safe_load(f.read_text())['tests']:
            for a in t.get('alert_rule_test', []):
                if a.get('exp_alerts'):
                    tested.add(a['alertname'])
    assert {a['alert'] for a in alerts()} == tested


# -- mutations ------------------------------------------------------------------------

_UNITS = {'ms': 0.001, 's': 1, 'm': 60, 'h': 3600}
# A comparison with a number: `> 0.01`, `== 1` (not `>= on (...) metric`).
THRESHOLD = re.compile(r'(==|!=|>=|<=|>|<)(\s*)(\d+(?:\.\d+)?)(?![\w.])')
# A label matcher inside a selector's braces.
SELECTOR = re.compile(r'\{([^{}]*)\}')


def _seconds(d):
    m = re.fullmatch(r'(\d+)(ms|s|m|h)', d)
    assert m, d
    return int(m.group(1)) * _UNITS[m.group(2)]


def _duration(seconds):
    return '%dm' % (seconds // 60) if seconds % 60 == 0 else '%ds' % seconds


def _number(x):
    return ('%.6f' % x).rstrip('0').rstrip('.')


def mutants(rules):
    """Every one-line mutation of the rules: (description, mutated rules). Mutations that
    leave the rule as it was (a `for: 0m` set to 0, a threshold 0 halved) are left out:
    no test can tell them apart."""
    out = []
    for gi, g in enumerate(rules['groups']):
        for ri, r in enumerate(g['rules']):
            name = r.get('alert') or r.get('record')

            def variant(what, **change):
                m = copy.deepcopy(rules)
                m['groups'][gi]['rules'][ri].update(change)
                if m['groups'][gi]['rules'][ri] != r:
                    out.append(('%s: %s' % (name, what), m))

            if 'for' in r:
                s = _seconds(r['for'])
                variant('for: 0m', **{'for': '0m'})
                variant('for: %s' % _duration(2 * s), **{'for': _duration(2 * s)})
            expr = r['expr']
            for t in THRESHOLD.finditer(expr):
                for factor in (0.5, 2):
                    new = _number(float(t.group(3)) * factor)
                    e = expr[:t.start(3)] + new + expr[t.end(3):]
                    variant('threshold %s%s x%s' % (t.group(1), t.group(3), factor), expr=e)
            for sel in SELECTOR.finditer(expr):
                matchers = [x.strip() for x in sel.group(1).split(',') if x.strip()]
                for i, dropped in enumerate(matchers):
                    rest = matchers[:i] + matchers[i + 1:]
                    inner = '{%s}' % ', '.join(rest) if rest else ''
                    e = expr[:sel.start()] + inner + expr[sel.end():]
                    variant('filter %s dropped (at %d)' % (dropped, sel.start()), expr=e)
    return out


def test_mutants_cover_every_for_threshold_and_filter():
    """The mutation generator itself: what it finds in a rule it is given."""
    rules = {'groups': [{'name': 'g', 'rules': [
        {'alert': 'A', 'expr': 'rate(m{a="1", b="2"}[5m]) > 0.01 and n >= on (x) k', 'for': '5m'},
        {'alert': 'B', 'expr': 'up == 0', 'for': '0m'},
    ]}]}
    got = sorted(d for d, _ in mutants(rules))
    assert got == sorted([
        'A: for: 0m', 'A: for: 10m', 'A: threshold >0.01 x0.5', 'A: threshold >0.01 x2',
        'A: filter a="1" dropped (at 6)', 'A: filter b="2" dropped (at 6)',
    ])
    exprs = {d: m['groups'][0]['rules'][0]['expr'] for d, m in mutants(rules)}
    assert exprs['A: threshold >0.01 x0.5'] == 'rate(m{a="1", b="2"}[5m]) > 0.005 and n >= on (x) k'
    assert exprs['A: filter a="1" dropped (at 6)'] == 'rate(m{b="2"}[5m]) > 0.01 and n >= on (x) k'


@needs_promtool
def test_the_fixtures_fail_every_mutant_of_the_rules(tmp_path):
    """Each mutant of dashboards/alerts.yml is loaded in place of the rules; promtool must
    fail at least one fixture with it. A surviving mutant is a `for:`, threshold or filter
    that no fixture pins down."""
    rules = yaml.safe_load(RULES.read_text())
    found = mutants(rules)
    per_alert = {}
    for d, _ in found:
        per_alert.setdefault(d.split(':')[0], 0)
        per_alert[d.split(':')[0]] += 1
    # Every alert with a `for:` above 0 or a threshold or a filter yields mutants.
    assert len(found) >= 40, [d for d, _ in found]
    (tmp_path / 'dashboards').mkdir()
    tests = tmp_path / 'exporter' / 'tests'
    tests.mkdir(parents=True)
    for f in FIXTURES:
        (tests / f.name).write_text(f.read_text())
    # The unmutated copy passes: what fails below is the mutation.
    (tmp_path / 'dashboards' / 'alerts.yml').write_text(yaml.safe_dump(rules, sort_keys=False))
    ok = subprocess.run([PROMTOOL, 'test', 'rules'] + [f.name for f in FIXTURES], cwd=tests,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    survivors = []
    for d, m in found:
        (tmp_path / 'dashboards' / 'alerts.yml').write_text(yaml.safe_dump(m, sort_keys=False))
        out = subprocess.run([PROMTOOL, 'test', 'rules'] + [f.name for f in FIXTURES], cwd=tests,
                             capture_output=True, text=True)
        if out.returncode == 0:
            survivors.append(d)
    assert not survivors, 'mutants of the rules that every fixture passes: %s' % survivors


def test_every_alert_has_a_runbook_section():
    text = RUNBOOK.read_text()
    headings = {re.sub(r'[^a-z0-9]', '', h.lower()) for h in re.findall(r'^#+ (.*)$', text, re.M)}
    for a in alerts():
        anchor = a['annotations']['runbook'].split('#', 1)[1]
        assert anchor == a['alert'].lower(), a['alert']
        assert anchor in headings, "docs/operations.md has no section `%s`" % a['alert']
        assert a['labels']['severity'] in ('critical', 'warning', 'info'), a['alert']
