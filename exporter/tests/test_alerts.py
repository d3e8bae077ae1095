"""The alerting rules (dashboards/alerts.yml): valid for promtool, every alert fires in a
promtool fixture (alerts_test.yml), and every alert has its runbook section in
docs/operations.md. Skipped, with the reason, where promtool (Debian's `prometheus`
package, installed by .ci/run) is not on PATH."""

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / 'dashboards' / 'alerts.yml'
FIXTURES = pathlib.Path(__file__).resolve().parent / 'alerts_test.yml'
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
    out = subprocess.run([PROMTOOL, 'test', 'rules', FIXTURES.name], cwd=FIXTURES.parent,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = set()
    for t in yaml.safe_load(FIXTURES.read_text())['tests']:
        for a in t.get('alert_rule_test', []):
            if a.get('exp_alerts'):
                tested.add(a['alertname'])
    assert {a['alert'] for a in alerts()} == tested


def test_every_alert_has_a_runbook_section():
    text = RUNBOOK.read_text()
    headings = {re.sub(r'[^a-z0-9]', '', h.lower()) for h in re.findall(r'^#+ (.*)$', text, re.M)}
    for a in alerts():
        anchor = a['annotations']['runbook'].split('#', 1)[1]
        assert anchor == a['alert'].lower(), a['alert']
        assert anchor in headings, "docs/operations.md has no section `%s`" % a['alert']
        assert a['labels']['severity'] in ('critical', 'warning', 'info'), a['alert']
