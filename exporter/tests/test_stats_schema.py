"""The exporter against qos_stats_get's schema (rpc-scripts/schema/stats.json, written
from the target plugin's Rust types by spdk-plugin's tests): every field the exporter
reads is in the schema, with the JSON type it reads it as, and it reads only the compact
form's fields from its compact scrape. The exporter scrapes answers built from the
schema whose objects record what is asked of them (rpc-scripts/schema/stats_sample.py);
a field the target renames, with the schema regenerated, fails here. The stand-in
answers of the other tests (conftest.py) are checked to be shaped like the schema too."""

import os
import sys

import nvmf_qos_exporter as ex
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BOUNDS_NS, cumulative, domain, host

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                'rpc-scripts', 'schema'))
import stats_sample  # noqa: E402

SCHEMA = stats_sample.load()
# A held-time histogram the exporter accepts: one count per bucket bound and one above.
VALUES = {'answer[].held_time_bounds_ns': [1000, 2000],
          'answer[].hosts[].held_time.cumulative': [1, 2, 3]}


class SchemaSource:
    """The exporter's Source, answering qos_stats_get with samples of the schema (the
    form asked for) and nothing else (no initiator plugin)."""

    def __init__(self, sparse):
        self.sparse = sparse
        self.reads = {'full': stats_sample.Reads(), 'compact': stats_sample.Reads()}

    def deadline(self):
        return float('inf')

    def call(self, method, params=None, deadline=None):
        if method != 'qos_stats_get':
            raise ex.RpcError(ex.METHOD_NOT_FOUND, 'Method not found')
        form = 'compact' if (params or {}).get('compact') else 'full'
        return stats_sample.sample(SCHEMA, form, self.reads[form], self.sparse, VALUES)


@pytest.mark.parametrize('sparse', [False, True], ids=['every-field', 'optional-fields-left-out'])
@pytest.mark.parametrize('compact', [True, False], ids=['compact-scrape', 'full-scrape'])
def test_the_exporter_reads_what_the_schema_says(compact, sparse):
    source = SchemaSource(sparse)
    registry = CollectorRegistry()
    registry.register(ex.QosCollector(source, compact=compact))
    # Exposition turns every value into a number: a field the exporter publishes whose
    # schema type is not one fails here.
    text = generate_latest(registry).decode()
    problems = [p for reads in source.reads.values() for p in reads.problems()]
    assert not problems, 'the exporter disagrees with rpc-scripts/schema/stats.json:\n' + '\n'.join(problems)
    names = {f.name for f in text_string_to_metric_families(text)}
    # The scrape went through the hosts (and their held-time histogram), not around them.
    assert {'nvmf_qos_host_completed_ios', 'nvmf_qos_host_held_seconds', 'nvmf_qos_up'} <= names, names


def test_the_stand_in_answers_of_the_tests_are_shaped_like_the_schema():
    hosts = [host('nqn.h1', 100, cumulative(90, 10, 3), 12345, group='g', res_iops=1000, max_iops=5000),
             host('nqn.h2', 5, cumulative(5, 0, 0), 0)]
    answer = [domain('d0', hosts)]
    assert len(answer[0]['held_time_bounds_ns']) == len(BOUNDS_NS)
    problems = stats_sample.problems_of(answer, SCHEMA, partial=True)
    assert not problems, '\n'.join(problems)
