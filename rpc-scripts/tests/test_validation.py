"""Obvious mistakes are argparse errors: a message, exit status 2, nothing sent."""

import pytest

from conftest import FakeClient, run

HOST = 'nqn.2014-08.org.nvmexpress:uuid:6f0c8a2e-1b1d-4a4e-9f57-0d3c2b1a0e11'
DC = ['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000']
DU = ['qos_domain_update', '-n', 'dom0']
HS = ['qos_host_set', '-d', 'dom0', '-q', HOST]
BC = ['qos_bdev_create', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST]
EX = [*BC[1:], '--nqn', 'nqn.2016-06.io.spdk:cnode1']
GC = ['qos_group_create', '-d', 'dom0', '-n', 'tenant-a']
GU = ['qos_group_update', '-d', 'dom0', '-n', 'tenant-a']
HU = ['qos_host_update', '-d', 'dom0', '-q', 'nqn.2014-08.org.example:h1']

BAD = [
    # negative and zero numbers
    ([*HS, '--min-iops', '-5'], "argument --min-iops: must be at least 1 (got -5)"),
    ([*HS, '--max-read-mibps', '0'], "argument --max-read-mibps: must be at least 1 (got 0); leave the option"),
    ([*HS, '--soft-min-iops', '-1'], "argument --soft-min-iops: must be at least 1"),
    ([*DC, '--capacity-iops-stddev', '-1'], "argument --capacity-iops-stddev: must not be negative (got -1)"),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '0'], "argument --capacity-iops: must be at least 1"),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '-400000'], "argument --capacity-iops: must be at least 1"),
    ([*DU, '--underuse-periods', '-3'], "argument --underuse-periods: must not be negative"),
    ([*DU, '--batch-ops', '0'], "argument --batch-ops: must be at least 1"),
    (['qos_bdev_expose', *EX, '--nsid', '0'], "argument --nsid: must be 1 ..= 4294967294 (got 0)"),
    # not numbers
    ([*HS, '--max-iops', '10k'], "argument --max-iops: '10k' is not an integer"),
    ([*DC, '--period-ms', '1.5'], "argument --period-ms: '1.5' is not an integer"),
    # ranges
    ([*DC, '--period-ms', '5'], "argument --period-ms: must be 10 ..= 60000 (got 5)"),
    ([*DC, '--period-ms', '60001'], "argument --period-ms: must be 10 ..= 60000"),
    ([*DC, '--check-interval-us', '9'], "argument --check-interval-us: must be 10 ..= 15000000 (got 9)"),
    ([*DC, '--estimator-history', '1001'], "argument --estimator-history: must be 1 ..= 1000"),
    ([*DC, '--write-weight-milli', '0'], "argument --write-weight-milli: must be 1 ..= 100000"),
    ([*DC, '--size-unit', '100'], "argument --size-unit: must be 0 (off) or at least 512 bytes (got 100)"),
    ([*HS, '--weight', '0'], "argument -w/--weight: must be 1 ..= 1000 (got 0)"),
    ([*HS, '-w', '1001'], "argument -w/--weight: must be 1 ..= 1000 (got 1001)"),
    # initiator plugin
    (['qos_ini_bdev_create', '-n', 'q', '-b', 'N', '--chunk-bytes', '100'],
     "argument --chunk-bytes: must be 4096 ..= 16777216 (got 100)"),
    (['qos_ini_bdev_create', '-n', 'q', '-b', 'N', '--request-timeout-us', '0'],
     "argument --request-timeout-us: must be 10 ..= 60000000 (got 0)"),
    (['qos_ini_bdev_set_options', '-n', 'q', '--link-mibps', '0'], "argument --link-mibps: must be 1 ..= 100000000"),
    (['qos_ini_bdev_set_options', '-n', 'q', '--increase-milli', '1001'], "argument --increase-milli: must be 1 ..= 1000"),
    (['qos_ini_bdev_create', '-n', '', '-b', 'N'], "argument -n/--name: must not be empty"),
    # unknown strings
    ([*HS, '--priority', 'critical'], "argument -p/--priority: invalid choice: 'critical'"),
    ([*DC, '--mode', 'fast'], "argument --mode: invalid choice: 'fast'"),
    ([*BC, '--uuid', 'not-a-uuid'], "argument -u/--uuid: 'not-a-uuid' is not a UUID"),
    (['qos_host_set', '-d', 'dom0', '-q', 'host with spaces'], "argument -q/--host-nqn: an NQN is 1 ..= 223"),
    (['qos_host_get', '-d', 'dom0', '-q', 'n' * 224], "argument -q/--host-nqn: an NQN is 1 ..= 223"),
    (['qos_domain_delete', '-n', ''], "argument -n/--name: must not be empty"),
    # a QoS reservation together and apart, in either order
    ([*HS, '--min-iops', '100', '--min-read-iops', '50'],
     "--min-iops and --min-read-iops cannot be used together"),
    ([*HS, '--min-read-iops', '50', '--min-iops', '100'],
     "--min-iops and --min-read-iops cannot be used together"),
    ([*HS, '--min-write-mibps', '5', '--min-mibps', '10'],
     "--min-mibps and --min-write-mibps cannot be used together"),
    ([*HS, '--min-iops', '100', '--min-write-mibps', '5'],
     "--min-iops and --min-write-mibps cannot be used together"),
    # reservation above limit, soft guarantee out of order
    ([*HS, '--min-iops', '500', '--max-iops', '100'],
     "--min-iops 500 is above --max-iops 100: a QoS reservation cannot be above its limit"),
    ([*HS, '--max-read-mibps', '10', '--min-read-mibps', '20'], "--min-read-mibps 20 is above --max-read-mibps 10"),
    ([*HS, '--min-iops', '500', '--soft-min-iops', '100'],
     "--min-iops 500 is above --soft-min-iops 100: the soft guarantee is at least the hard one"),
    ([*HS, '--soft-min-mibps', '50', '--max-mibps', '40'],
     "--soft-min-mibps 50 is above --max-mibps 40: the soft guarantee cannot be above the limit"),
    # domain pairs
    ([*DC, '--capacity-iops-stddev', '2000'], "--capacity-iops-stddev 2000 is above --capacity-iops 1000"),
    ([*DC, '--capacity-mibps-stddev', '20', '--capacity-mibps', '10'],
     "--capacity-mibps-stddev 20 is above --capacity-mibps 10"),
    ([*DC, '--check-interval-us', '30000', '--period-ms', '100'],
     "--check-interval-us 30000 is above a quarter of --period-ms 100 (25000 us)"),
    # the cost model cannot change
    ([*DU, '--size-unit', '4096'], "--size-unit: the cost model of a domain cannot change"),
    ([*DU, '--write-weight-milli', '2000'], "--write-weight-milli: the cost model of a domain cannot change"),
    # domain sharing
    ([*DC, '--sharing', 'fair'], "argument --sharing: invalid choice: 'fair'"),
    ([*DU, '--sharing', 'first-come'], "argument --sharing: invalid choice: 'first-come'"),
    # tenant groups: rates, weight, names
    ([*GC, '--min-iops', '0'], "argument --min-iops: must be at least 1 (got 0); leave the option"),
    ([*GC, '--max-mibps', '-1'], "argument --max-mibps: must be at least 1 (got -1)"),
    ([*GU, '--max-iops', '-1'], "argument --max-iops: must not be negative (got -1); 0 clears the rate"),
    ([*GU, '--min-mibps', 'ten'], "argument --min-mibps: 'ten' is not an integer"),
    ([*GC, '--weight', '0'], "argument -w/--weight: must be 1 ..= 1000 (got 0)"),
    ([*GC, '-w', '1001'], "argument -w/--weight: must be 1 ..= 1000 (got 1001)"),
    ([*GU, '-w', '0'], "argument -w/--weight: must be 1 ..= 1000 (got 0)"),
    (['qos_group_create', '-d', 'dom0', '-n', 'tenant a'],
     "argument -n/--name: a group name is 1 ..= 64 characters: letters, digits and - _ . : (got 'tenant a')"),
    (['qos_group_create', '-d', 'dom0', '-n', 'g' * 65], "argument -n/--name: a group name is 1 ..= 64"),
    (['qos_group_update', '-d', 'dom0', '-n', ''], "argument -n/--name: a group name is 1 ..= 64"),
    (['qos_group_delete', '-d', 'dom0', '-n', 'tenant/a'], "argument -n/--name: a group name is 1 ..= 64"),
    (['qos_group_get', '-d', 'dom0', '-n', 'gr\u00fcn'], "argument -n/--name: a group name is 1 ..= 64"),
    ([*HS, '--group', 'a b'], "argument --group: a group name is 1 ..= 64"),
    ([*HS, '--group', ''], "argument --group: a group name is 1 ..= 64"),
    # a group's reservation above its limit, in either order; on update only a nonzero limit bounds it
    ([*GC, '--min-iops', '120000', '--max-iops', '100000'],
     "--min-iops 120000 is above --max-iops 100000: a group's reservation cannot be above its limit; "
     "lower --min-iops or raise --max-iops"),
    ([*GC, '--max-mibps', '100', '--min-mibps', '200'],
     "--min-mibps 200 is above --max-mibps 100: a group's reservation cannot be above its limit; "
     "lower --min-mibps or raise --max-mibps"),
    ([*GU, '--min-iops', '5', '--max-iops', '4'], "--min-iops 5 is above --max-iops 4: a group's reservation"),
    ([*HU, '--min-iops', '5', '--max-iops', '4'], "--min-iops 5 is above --max-iops 4: a QoS reservation"),
    (['qos_domain_create', '-n', 'd', '--operating-in-flight-milli', '4', '--operating-latency-us', '5'],
     "--operating-in-flight-milli and --operating-latency-us cannot be used together"),
    (['qos_domain_create', '-n', 'd', '--operating-latency-us', '0'], "argument --operating-latency-us: must be"),
    ([*HU, '--min-iops', '5', '--min-read-iops', '4'], "--min-iops and --min-read-iops cannot be used together"),
    ([*HU, '--max-iops', '-1'], "argument --max-iops: must not be negative (got -1); 0 clears the rate"),
    ([*HU, '--group', 'a b'], "argument --group: a group name is 1 ..= 64"),
    # a burst below its limit, in either order; a bucket of 0 s or above a day (issue 28)
    ([*HS, '--max-iops', '10000', '--burst-iops', '5000'],
     "--burst-iops 5000 is below --max-iops 10000: a burst is above the limit; raise --burst-iops or lower --max-iops"),
    ([*GC, '--burst-mibps', '100', '--max-mibps', '200'],
     "--burst-mibps 100 is below --max-mibps 200: a burst is above the limit"),
    ([*HS, '--burst-seconds', '0'], "argument --burst-seconds: must be 1 ..= 86400 (got 0)"),
    ([*GC, '--burst-seconds', '86401'], "argument --burst-seconds: must be 1 ..= 86400 (got 86401)"),
    ([*HU, '--burst-seconds', '0'], "argument --burst-seconds: must be 1 ..= 86400 (got 0)"),
    ([*HS, '--burst-iops', '0'], "argument --burst-iops: must be at least 1 (got 0)"),
    # what the target refuses as well (rpc-scripts/schema, test_schema.py)
    (['qos_ini_bdev_set_options', '-n', 'q', '--latency-target-auto-milli', '500'],
     "argument --latency-target-auto-milli: must be 0 or 1000 ..= 100000 (got 500)"),
    ([*DU, '--underuse-periods', str(2**32)], "argument --underuse-periods: must be at most 4294967295 (got 4294967296)"),
    ([*DC, '--capacity-iops', str(2**64)], "argument --capacity-iops: must be at most 18446744073709551615"),
    ([*HS, '--max-iops', str(2**64)], "argument --max-iops: must be at most 18446744073709551615"),
    ([*DC, '--release-burst-us', '200001', '--period-ms', '200'],
     "--release-burst-us 200001 is above --period-ms 200 (200000 us)"),
    ([*DU, '--release-burst-us', '60000001'], "argument --release-burst-us: must be 0 ..= 60000000 (got 60000001)"),
    (['qos_stats_get', '--periods', '-1'], "argument --periods: must not be negative (got -1)"),
    (['qos_domain_create', '-n', 'dom 0', '--capacity-iops', '1000'],
     "argument -n/--name: a name is 1 ..= 255 characters of printable ASCII without spaces (got 'dom 0')"),
    (['qos_ini_bdev_create', '-n', 'q', '-b', 'N' * 256], "argument -b/--base-bdev-name: a name is 1 ..= 255"),
    # required parameters
    (['qos_group_create', '-d', 'dom0'], "the following arguments are required: -n/--name"),
    (['qos_group_update', '-n', 'g'], "the following arguments are required: -d/--domain"),
    (['qos_group_delete', '-d', 'dom0'], "the following arguments are required: -n/--name"),
    (['qos_group_get'], "the following arguments are required: -d/--domain"),
    (['qos_domain_create'], "the following arguments are required: -n/--name"),
    (['qos_host_set', '-d', 'dom0'], "the following arguments are required: -q/--host-nqn"),
    (['qos_bdev_expose', *BC[1:]], "the following arguments are required: --nqn"),
    (['qos_host_get'], "the following arguments are required: -d/--domain"),
]


@pytest.mark.parametrize('argv,message', BAD)
def test_refused_with_message_and_exit_2(argv, message, capsys):
    client = FakeClient()
    with pytest.raises(SystemExit) as exit_info:
        run(argv, client)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert 'Traceback' not in err
    assert err.startswith('usage: rpc.py ' + argv[0])
    assert client.calls == []


def test_pairs_within_bounds_are_accepted():
    client = run([*HS, '--min-read-iops', '50', '--min-write-iops', '50', '--max-read-iops', '50',
                  '--max-iops', '1000', '--soft-min-iops', '1000'])
    assert client.calls[0][1]['soft_min_iops'] == 1000
    client = run([*DC, '--check-interval-us', '25000', '--period-ms', '100', '--capacity-iops-stddev', '1000'])
    assert client.calls[0][1]['check_interval_us'] == 25000


def test_update_checks_pairs_only_among_given_options():
    # The period is not given, so the target checks the interval against the current one.
    client = run([*DU, '--check-interval-us', '500000'])
    assert client.calls == [('qos_domain_update', {'name': 'dom0', 'check_interval_us': 500000})]


def test_group_pairs_within_bounds_are_accepted():
    client = run([*GC, '--min-iops', '100000', '--max-iops', '100000', '--min-mibps', '1', '--max-mibps', '2'])
    assert client.calls[0][1]['min_iops'] == 100000
    # on update, 0 clears the limit, so it does not bound the reservation; 0 clears a reservation too
    client = run([*GU, '--max-iops', '0', '--min-iops', '70000', '--min-mibps', '0'])
    assert client.calls == [('qos_group_update', {'domain': 'dom0', 'name': 'tenant-a', 'max_iops': 0,
                                                  'min_iops': 70000, 'min_mibps': 0})]
    # a host update: 0 clears a limit or a reservation, so neither bounds the other
    client = run([*HU, '--max-iops', '0', '--min-iops', '70000', '--soft-min-iops', '0'])
    assert client.calls[0][1] == {'domain': 'dom0', 'host_nqn': HU[-1], 'max_iops': 0, 'min_iops': 70000,
                                  'soft_min_iops': 0}
    # the longest name, and every kind of character
    client = run(['qos_group_create', '-d', 'dom0', '-n', 'aZ09-_.:' * 8])
    assert client.calls[0][1]['name'] == 'aZ09-_.:' * 8


def test_burst_options_are_sent_and_clear_with_0_on_update():
    client = run([*HS, '--max-iops', '10000', '--burst-iops', '30000', '--burst-seconds', '20'])
    assert client.calls[0][1] == {'domain': 'dom0', 'host_nqn': HOST, 'max_iops': 10000, 'burst_iops': 30000,
                                  'burst_seconds': 20}
    client = run([*GC, '--max-mibps', '100', '--burst-mibps', '100', '--burst-seconds', '86400'])
    assert client.calls[0][1]['burst_mibps'] == 100
    # on update, 0 clears the limit or the burst, so neither bounds the other (clearing
    # both burst rates clears the bucket at the target)
    client = run([*GU, '--max-iops', '20000', '--burst-iops', '0'])
    assert client.calls[0][1] == {'domain': 'dom0', 'name': 'tenant-a', 'max_iops': 20000, 'burst_iops': 0}
