"""What the commands print: SPDK's conventions, and the stats table."""

import json

from conftest import FakeClient, run

HOST1 = 'nqn.2014-08.org.nvmexpress:uuid:host-one'
HOST2 = 'nqn.2014-08.org.nvmexpress:uuid:host-two'

STATS = [{
    'name': 'dom0', 'epoch': 42, 'period_ns': 1000000000, 'elapsed_ns': 350000000,
    'capacity_estimate': {'ops': 400000, 'bytes': 3145728000},
    'global_available': {'ops': 120000, 'bytes': 1048576000},
    'hosts': [
        {'host_nqn': HOST1, 'min': {'iops': 10000}, 'max': {'iops': 50000, 'read_mibps': 100},
         'completed_this_period': {'ops': 3500, 'bytes': 14336000}, 'last_periods': [{'ops': 10000, 'bytes': 1}],
         'reservation_met_fraction': 1.0, 'reservation_tokens': {'ops': 6500, 'bytes': 0},
         'credit_tokens': {'ops': 0, 'bytes': 0}, 'limit_left': {'ops': 46500, 'bytes': 0}, 'held': 0,
         'underuse_flag': False, 'reservation_at_risk': False,
         'entitlement': {'contending': True, 'held_fraction': 0.9, 'at_target': 31.4, 'at_target_peak': 40, 'cap': 50000,
                         'entitled': 40000, 'achieved': 39800, 'shortfall': 200,
                         'queue_depth_needed': 9.2},
         'burst': {'iops': 150000, 'mibps': None, 'seconds': 30, 'credit_seconds': 12.345, 'bursting': True,
                   'bursting_periods': 18}},
        {'host_nqn': HOST2, 'min': {'read': {'iops': 2000}, 'write': {'iops': 1000}}, 'max': {},
         'completed_this_period': {'ops': 100, 'bytes': 409600}, 'last_periods': [],
         'reservation_met_fraction': 0.875, 'held': 12, 'underuse_flag': True, 'reservation_at_risk': True,
         'reservation_unreachable': True,
         'held_by': {'limit': 7, 'burst': 0, 'reservation': 30, 'share': 0, 'budget': 0, 'window': 0,
                     'bypassed': 2}},
    ],
}]


def test_methods_returning_true_print_nothing(capsys):
    for argv in (['qos_domain_create', '-n', 'd', '--capacity-iops', '1'], ['qos_domain_update', '-n', 'd'],
                 ['qos_domain_delete', '-n', 'd'], ['qos_host_set', '-d', 'd', '-q', HOST1],
                 ['qos_host_remove', '-d', 'd', '-q', HOST1], ['qos_bdev_delete', '-n', 'b'],
                 ['qos_group_create', '-d', 'd', '-n', 'g'], ['qos_group_update', '-d', 'd', '-n', 'g', '-w', '2'],
                 ['qos_group_delete', '-d', 'd', '-n', 'g']):
        run(argv)
    assert capsys.readouterr().out == ''


def test_create_prints_the_bdev_name_bare(capsys):
    run(['qos_bdev_create', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'd', '-q', HOST1],
        FakeClient({'qos_bdev_create': 'qos0'}))
    assert capsys.readouterr().out == 'qos0\n'


def test_get_methods_print_indented_json(capsys):
    domains = [{'name': 'dom0', 'capacity_iops': 400000, 'estimator': True}]
    run(['qos_domain_get'], FakeClient({'qos_domain_get': domains}))
    out = capsys.readouterr().out
    assert out == json.dumps(domains, indent=2) + '\n'
    bdevs = [{'name': 'qos0', 'base_bdev_name': 'Nvme0n1', 'domain': 'dom0', 'host_nqn': HOST1}]
    run(['qos_bdev_get'], FakeClient({'qos_bdev_get': bdevs}))
    assert json.loads(capsys.readouterr().out) == bdevs
    run(['qos_host_get', '-d', 'dom0'], FakeClient({'qos_host_get': [{'host_nqn': HOST1}]}))
    assert json.loads(capsys.readouterr().out) == [{'host_nqn': HOST1}]


def test_group_get_prints_indented_json(capsys):
    groups = [{'domain': 'dom0', 'name': 'tenant-a', 'min_iops': 60000, 'max_iops': 100000, 'weight': 2}]
    run(['qos_group_get', '-d', 'dom0'], FakeClient({'qos_group_get': groups}))
    assert capsys.readouterr().out == json.dumps(groups, indent=2) + '\n'


def test_stats_default_is_json(capsys):
    run(['qos_stats_get'], FakeClient({'qos_stats_get': STATS}))
    assert json.loads(capsys.readouterr().out) == STATS


def test_stats_table(capsys):
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': STATS}))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ('domain dom0: epoch 42, period 1000 ms (350 ms elapsed), capacity estimate '
                        '400000 ops, 3000.0 MiB per period, global available 120000 ops, 1000.0 MiB')
    assert lines[1].split() == ['HOST', 'MIN', 'MAX', 'COMPLETED', 'THIS', 'PERIOD', 'MET', 'HELD', 'HELD', 'BY',
                                'BURST', 'ENTITLED', 'FLAGS']
    assert lines[2].split() == [HOST1, 'iops=10000', 'iops=50000,read_mibps=100', '3500', 'ops,', '13.7', 'MiB',
                                '100.0%', '0', '-', '12.3s', 'bursting', '40000/s', 'contending,', 'QD', '9.2',
                                '-']
    # No burst and no entitlement (before the target's depth curve has a sample); held
    # by the rule that held them, largest first, and what the bypass let through.
    assert lines[3].split() == [HOST2, 'read_iops=2000,write_iops=1000', '-', '100', 'ops,', '0.4', 'MiB',
                                '87.5%', '12', 'reservation:30', 'limit:7', 'bypassed:2', '-', '-',
                                'underuse,at-risk,unreachable']
    # columns line up
    assert lines[1].index('MAX') == lines[2].index('iops=50000') == lines[3].index('- ')
    assert len(lines) == 4


def test_stats_table_says_when_the_capacity_is_learned_or_overcommitted(capsys):
    learning = [dict(STATS[0], capacity_learning=True, hosts=[])]
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': learning}))
    assert 'capacity estimate learning (no capacity given) per period' in capsys.readouterr().out
    over = [dict(STATS[0], capacity_learning=False, reserved={'ops': 500000, 'bytes': 0}, hosts=[])]
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': over}))
    out = capsys.readouterr().out
    assert 'capacity estimate 400000 ops, 3000.0 MiB (reservations 500000 ops' in out
    assert 'exceed it) per period' in out
    # The estimator holds the estimate at the reservations: they take all of it.
    held = [dict(STATS[0], capacity_learning=False, reserved={'ops': 400000, 'bytes': 0}, hosts=[])]
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': held}))
    assert 'capacity estimate 400000 ops, 3000.0 MiB (reservations take all of it) per period' in \
        capsys.readouterr().out


def test_stats_json_with_groups_is_printed_as_it_is(capsys):
    stats = [dict(STATS[0], sharing='weighted',
                  hosts=[dict(h, group='tenant-a', excess_granted_this_period={'ops': 10, 'bytes': 0})
                         for h in STATS[0]['hosts']],
                  groups=[{'name': 'tenant-a', 'hosts': [HOST1, HOST2], 'min': {'iops': 60000},
                           'max': {'iops': 100000}, 'weight': 2,
                           'reservation_per_period': {'ops': 60000, 'bytes': 0},
                           'limit_per_period': {'ops': 100000, 'bytes': None},
                           'completed_this_period': {'ops': 3600, 'bytes': 14745600},
                           'given_this_period': {'ops': 20, 'bytes': 0}}])]
    run(['qos_stats_get', '-d', 'dom0'], FakeClient({'qos_stats_get': stats}))
    assert json.loads(capsys.readouterr().out) == stats


def test_stats_table_tolerates_missing_fields_and_several_domains(capsys):
    stats = [{'name': 'a', 'hosts': []}, {'name': 'b', 'hosts': [{'host_nqn': HOST1}]}]
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': stats}))
    out = capsys.readouterr().out
    assert 'domain a: epoch -, period - (- elapsed), capacity estimate - per period, global available -' in out
    assert out.splitlines()[-1].split() == [HOST1, '-', '-', '-', '-', '-', '-', '-', '-', '-']
    assert '\n\ndomain b' in out


def test_stats_table_says_when_the_domain_is_bypassed_or_paced(capsys):
    for fields, says in (({'bypass': True, 'pool_paced': True}, ', BYPASS (holds nothing)'),
                         ({'bypass': False, 'pool_paced': True}, ', pool paced for a reservation behind'),
                         ({'bypass': False, 'pool_paced': False}, '')):
        run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': [dict(STATS[0], hosts=[], **fields)]}))
        first = capsys.readouterr().out.splitlines()[0]
        assert first.endswith('global available 120000 ops, 1000.0 MiB' + says), first


def test_stats_table_shows_the_circulation_over_it(capsys):
    op = {'by': {'in_flight': 110000}, 'efficiency_milli': 970, 'in_flight': 110.0, 'ops_per_s': 480000,
          'max_ops_per_s': 517000, 'latency_ns': 229166, 'depth_curve': [],
          'circulation': {'commands': 160, 'hold_target': 50, 'held': 49}}
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': [dict(STATS[0], hosts=[], operating_point=op)]}))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ('  circulation: 160 commands, N* 110 at C* 480000/s (L* 229 us), hold target 50, '
                        'held now 49')
    # N* learned for eta: the held/open rate and the triplets it was learned from.
    op['by'] = {'circulation': 970}
    op['circulation']['learned'] = {'n_star': 110, 'ratio': 0.975, 'last_ratio': 0.981, 'triplets': 40}
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': [dict(STATS[0], hosts=[], operating_point=op)]}))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ('  circulation: 160 commands, N* 110 at C* 480000/s (L* 229 us), learned for eta 0.97: '
                        'held/open rate 0.975 over 40 triplets, hold target 50, held now 49')
    # Not over circulation (no `circulation`): no such line.
    del op['circulation']
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': [dict(STATS[0], hosts=[], operating_point=op)]}))
    assert 'circulation' not in capsys.readouterr().out


def test_stats_table_with_a_dry_run_client_prints_nothing(capsys):
    run(['qos_stats_get', '--table'], FakeClient({'qos_stats_get': None}))
    assert capsys.readouterr().out == ''
