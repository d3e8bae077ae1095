"""qos_rpc.py's `qos_stats_get --table` and `--watch` against qos_stats_get's schema
(rpc-scripts/schema/stats.json, written from the target plugin's Rust types by
spdk-plugin's tests): every field the tables read is in the schema with the JSON type
they read it as, and `--watch` (which asks for the compact form) reads only the compact
form's fields. The tables are printed from answers built from the schema whose objects
record what is asked of them (rpc-scripts/schema/stats_sample.py); a field the target
renames, with the schema regenerated, fails here.

Also: the schema describes what the target writes (the plugin's goldens of every form,
spdk-plugin/tests/stats-golden, are valid answers), and the stand-in answers of
test_watch.py are shaped like it."""

import glob
import json
import os
import sys
import time

import pytest

import qos_rpc
from conftest import RPC_SCRIPTS, FakeClient, run

sys.path.insert(0, os.path.join(RPC_SCRIPTS, 'schema'))
import stats_sample  # noqa: E402

SCHEMA = stats_sample.load()
GOLDENS = os.path.join(os.path.dirname(RPC_SCRIPTS), 'spdk-plugin', 'tests', 'stats-golden')
# A held-time histogram the watch table takes a quantile of.
VALUES = {'answer[].held_time_bounds_ns': [1000, 2000],
          'answer[].hosts[].held_time.cumulative': [1, 2, 3]}


def _problems(reads):
    return 'qos_rpc.py disagrees with rpc-scripts/schema/stats.json:\n' + '\n'.join(reads.problems())


@pytest.mark.parametrize('form,sparse,reads,answer', stats_sample.samples(SCHEMA, values=VALUES),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_the_table_reads_what_the_schema_says(form, sparse, reads, answer, capsys):
    run(['qos_stats_get', '--table'] + (['--compact'] if form == 'compact' else []),
        FakeClient({'qos_stats_get': answer}))
    assert not reads.problems(), _problems(reads)
    assert 'domain sample' in capsys.readouterr().out


@pytest.mark.parametrize('sparse', [False, True], ids=['every-field', 'optional-fields-left-out'])
def test_the_watch_table_reads_what_the_schema_says(sparse, monkeypatch, capsys):
    clock = [100.0]
    monkeypatch.setattr(time, 'monotonic', lambda: clock[0])
    monkeypatch.setattr(time, 'sleep', lambda s: clock.__setitem__(0, clock[0] + s))
    reads = stats_sample.Reads()

    def answer(params):
        # --watch asks for the compact form: it gets only the compact form's fields.
        assert params.get('compact') is True
        return stats_sample.sample(SCHEMA, 'compact', reads, sparse, VALUES)
    run(['qos_stats_get', '--watch', '1', '--iterations', '2'], FakeClient({'qos_stats_get': answer}))
    assert not reads.problems(), _problems(reads)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('sample')]
    assert len(rows) == 2, 'one row per refresh'


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(GOLDENS, '*.json'))), ids=os.path.basename)
def test_what_the_target_writes_is_what_the_schema_says(path):
    with open(path, encoding='utf-8') as f:
        domain = json.load(f)
    problems = stats_sample.problems_of([domain], SCHEMA)
    assert not problems, '\n'.join(problems)


def test_the_goldens_are_there():
    assert len(glob.glob(os.path.join(GOLDENS, '*.json'))) >= 4, GOLDENS


def test_the_stand_in_answers_of_the_watch_tests_are_shaped_like_the_schema():
    import test_watch
    for k in (1, 2):
        problems = stats_sample.problems_of(test_watch.answer(k), SCHEMA, partial=True)
        assert not problems, '\n'.join(problems)


def test_the_compact_form_leaves_out_what_the_schema_marks_full_form_only():
    full_only = {k for k, p in SCHEMA['items']['properties']['hosts']['items']['properties'].items()
                 if p.get('x-full-form-only')}
    assert full_only == {'last_periods', 'periods', 'reservation_met_fraction_backlogged', 'soft_granted'}
    with open(os.path.join(GOLDENS, 'compact.json'), encoding='utf-8') as f:
        compact = json.load(f)
    assert all(not full_only & set(h) for h in compact['hosts'])
    assert 'estimator_periods' not in compact
