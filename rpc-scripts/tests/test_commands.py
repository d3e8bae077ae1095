"""Every command and every flag: the exact method and params sent."""

import pytest

from conftest import make_parser, run

HOST = 'nqn.2014-08.org.nvmexpress:uuid:6f0c8a2e-1b1d-4a4e-9f57-0d3c2b1a0e11'
SUBSYS = 'nqn.2016-06.io.spdk:cnode1'
UUID = '0b7e8f1c-3e0a-4a51-9a0c-2f4a3f1f5d6e'

CASES = [
    # Domains
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '400000'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 400000}),
    # No capacity: learned from the target.
    (['qos_domain_create', '-n', 'dom0'], 'qos_domain_create', {'name': 'dom0'}),
    (['qos_domain_create', '--name', 'dom0', '--capacity-iops', '400000',
      '--capacity-iops-stddev', '8000', '--capacity-mibps', '3000', '--capacity-mibps-stddev', '60',
      '--per-host-max-iops', '200000', '--per-host-max-mibps', '1500', '--period-ms', '500',
      '--check-interval-us', '2000', '--batch-ops', '64', '--batch-bytes', '262144',
      '--estimator', '--estimator-history', '16', '--estimator-increment-milli', '5',
      '--estimator-probe-backoff', '0', '--estimator-drop-milli', '30',
      '--estimator-hold-milli', '20',
      '--underuse-periods', '4', '--mode', 'basic', '--write-weight-milli', '2000',
      '--size-unit', '4096'],
     'qos_domain_create',
     {'name': 'dom0', 'capacity_iops': 400000, 'capacity_iops_stddev': 8000, 'capacity_mibps': 3000,
      'capacity_mibps_stddev': 60, 'per_host_max_iops': 200000, 'per_host_max_mibps': 1500,
      'period_ms': 500, 'check_interval_us': 2000, 'batch_ops': 64, 'batch_bytes': 262144,
      'estimator': True, 'estimator_history': 16, 'estimator_increment_milli': 5,
      'estimator_probe_backoff': 0, 'estimator_drop_milli': 30, 'estimator_hold_milli': 20,
      'underuse_periods': 4, 'mode': 'basic', 'write_weight_milli': 2000, 'size_unit': 4096}),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000', '--no-estimator',
      '--capacity-iops-stddev', '0', '--size-unit', '0'],
     'qos_domain_create',
     {'name': 'dom0', 'capacity_iops': 1000, 'estimator': False, 'capacity_iops_stddev': 0,
      'size_unit': 0}),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000', '--release', 'start'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 1000, 'release': 'start'}),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000', '--release-burst-us', '500'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 1000, 'release_burst_us': 500}),
    (['qos_domain_update', '-n', 'dom0', '--release', 'paced', '--release-burst-us', '2000'],
     'qos_domain_update', {'name': 'dom0', 'release': 'paced', 'release_burst_us': 2000}),
    (['qos_domain_update', '-n', 'dom0'], 'qos_domain_update', {'name': 'dom0'}),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000', '--sharing', 'first_come'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 1000, 'sharing': 'first_come'}),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000', '--sharing', 'weighted'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 1000, 'sharing': 'weighted'}),
    (['qos_domain_update', '-n', 'dom0', '--sharing', 'weighted'],
     'qos_domain_update', {'name': 'dom0', 'sharing': 'weighted'}),
    (['qos_domain_update', '-n', 'dom0', '--sharing', 'first_come'],
     'qos_domain_update', {'name': 'dom0', 'sharing': 'first_come'}),
    (['qos_domain_create', '-n', 'dom0', '--capacity-iops', '1000', '--efficiency-milli', '800'],
     'qos_domain_create', {'name': 'dom0', 'capacity_iops': 1000, 'efficiency_milli': 800}),
    (['qos_domain_update', '-n', 'dom0', '--efficiency-milli', '1000'],
     'qos_domain_update', {'name': 'dom0', 'efficiency_milli': 1000}),
    # The operating point by depth or by latency instead of efficiency.
    (['qos_domain_create', '-n', 'dom0', '--operating-in-flight-milli', '40000'],
     'qos_domain_create', {'name': 'dom0', 'operating_in_flight_milli': 40000}),
    (['qos_domain_update', '-n', 'dom0', '--operating-latency-us', '150'],
     'qos_domain_update', {'name': 'dom0', 'operating_latency_us': 150}),
    (['qos_domain_create', '-n', 'dom0', '--operating-latency-us', '150'],
     'qos_domain_create', {'name': 'dom0', 'operating_latency_us': 150}),
    (['qos_domain_update', '-n', 'dom0', '--operating-in-flight-milli', '8000'],
     'qos_domain_update', {'name': 'dom0', 'operating_in_flight_milli': 8000}),
    (['qos_domain_update', '-n', 'dom0', '--capacity-iops', '350000', '--period-ms', '2000',
      '--no-estimator', '--mode', 'haechi', '--per-host-max-iops', '100000'],
     'qos_domain_update',
     {'name': 'dom0', 'capacity_iops': 350000, 'period_ms': 2000, 'estimator': False,
      'mode': 'haechi', 'per_host_max_iops': 100000}),
    (['qos_domain_update', '--name', 'dom0', '--capacity-iops', '400000',
      '--capacity-iops-stddev', '8000', '--capacity-mibps', '3000', '--capacity-mibps-stddev', '60',
      '--per-host-max-iops', '200000', '--per-host-max-mibps', '1500', '--period-ms', '500',
      '--check-interval-us', '2000', '--batch-ops', '64', '--batch-bytes', '262144',
      '--estimator', '--estimator-history', '16', '--estimator-increment-milli', '5',
      '--estimator-probe-backoff', '8', '--estimator-drop-milli', '0', '--underuse-periods', '4',
      '--estimator-hold-milli', '0', '--mode', 'basic'],
     'qos_domain_update',
     {'name': 'dom0', 'capacity_iops': 400000, 'capacity_iops_stddev': 8000, 'capacity_mibps': 3000,
      'capacity_mibps_stddev': 60, 'per_host_max_iops': 200000, 'per_host_max_mibps': 1500,
      'period_ms': 500, 'check_interval_us': 2000, 'batch_ops': 64, 'batch_bytes': 262144,
      'estimator': True, 'estimator_history': 16, 'estimator_increment_milli': 5,
      'estimator_probe_backoff': 8, 'estimator_drop_milli': 0, 'underuse_periods': 4,
      'estimator_hold_milli': 0, 'mode': 'basic'}),
    (['qos_domain_delete', '-n', 'dom0'], 'qos_domain_delete', {'name': 'dom0'}),
    (['qos_domain_get'], 'qos_domain_get', {}),
    (['qos_domain_get', '--name', 'dom0'], 'qos_domain_get', {'name': 'dom0'}),
    # Hosts
    (['qos_host_set', '-d', 'dom0', '-q', HOST], 'qos_host_set', {'domain': 'dom0', 'host_nqn': HOST}),
    (['qos_host_set', '--domain', 'dom0', '--host-nqn', HOST, '--min-iops', '10000',
      '--min-mibps', '40', '--max-iops', '50000', '--max-mibps', '200', '--max-read-iops', '40000',
      '--max-read-mibps', '150', '--max-write-iops', '30000', '--max-write-mibps', '100',
      '--weight', '5', '--priority', 'high', '--soft-min-iops', '20000', '--soft-min-mibps', '80'],
     'qos_host_set',
     {'domain': 'dom0', 'host_nqn': HOST, 'min_iops': 10000, 'min_mibps': 40, 'max_iops': 50000,
      'max_mibps': 200, 'max_read_iops': 40000, 'max_read_mibps': 150, 'max_write_iops': 30000,
      'max_write_mibps': 100, 'weight': 5, 'priority': 'high', 'soft_min_iops': 20000,
      'soft_min_mibps': 80}),
    (['qos_host_set', '-d', 'dom0', '-q', HOST, '--min-read-iops', '6000', '--min-read-mibps', '20',
      '--min-write-iops', '2000', '--min-write-mibps', '10', '-w', '1000', '-p', 'urgent'],
     'qos_host_set',
     {'domain': 'dom0', 'host_nqn': HOST, 'min_read_iops': 6000, 'min_read_mibps': 20,
      'min_write_iops': 2000, 'min_write_mibps': 10, 'weight': 1000, 'priority': 'urgent'}),
    (['qos_host_set', '-d', 'dom0', '-q', HOST, '--max-iops', '100', '-p', 'low'],
     'qos_host_set', {'domain': 'dom0', 'host_nqn': HOST, 'max_iops': 100, 'priority': 'low'}),
    (['qos_host_set', '-d', 'dom0', '-q', HOST, '--min-iops', '100', '--max-iops', '100',
      '--soft-min-iops', '100', '-p', 'medium', '-w', '1'],
     'qos_host_set',
     {'domain': 'dom0', 'host_nqn': HOST, 'min_iops': 100, 'max_iops': 100, 'soft_min_iops': 100,
      'priority': 'medium', 'weight': 1}),
    (['qos_host_set', '-d', 'dom0', '-q', HOST, '--min-iops', '20000', '-w', '3', '--group', 'tenant-a'],
     'qos_host_set', {'domain': 'dom0', 'host_nqn': HOST, 'min_iops': 20000, 'weight': 3, 'group': 'tenant-a'}),
    (['qos_host_set', '-d', 'dom0', '-q', HOST, '--group', 'Ten.ant_1:a'],
     'qos_host_set', {'domain': 'dom0', 'host_nqn': HOST, 'group': 'Ten.ant_1:a'}),
    # qos_host_update: only what is given; 0 clears a rate, '' leaves the group.
    (['qos_host_update', '-d', 'dom0', '-q', HOST, '--max-iops', '90000'],
     'qos_host_update', {'domain': 'dom0', 'host_nqn': HOST, 'max_iops': 90000}),
    (['qos_host_update', '--domain', 'dom0', '--host-nqn', HOST, '--min-iops', '0', '--min-mibps', '10',
      '--max-iops', '0', '--max-mibps', '200', '--max-read-iops', '1', '--max-read-mibps', '150',
      '--max-write-iops', '300', '--max-write-mibps', '100', '--weight', '5', '--priority', 'high',
      '--soft-min-iops', '0', '--soft-min-mibps', '80', '--group', ''],
     'qos_host_update',
     {'domain': 'dom0', 'host_nqn': HOST, 'min_iops': 0, 'min_mibps': 10, 'max_iops': 0,
      'max_mibps': 200, 'max_read_iops': 1, 'max_read_mibps': 150, 'max_write_iops': 300,
      'max_write_mibps': 100, 'weight': 5, 'priority': 'high', 'soft_min_iops': 0,
      'soft_min_mibps': 80, 'group': ''}),
    (['qos_host_update', '-d', 'dom0', '-q', HOST, '--min-read-iops', '6000', '--min-read-mibps', '0',
      '--min-write-iops', '2000', '--min-write-mibps', '10', '-w', '2', '-p', 'low', '--group', 'tenant-b'],
     'qos_host_update',
     {'domain': 'dom0', 'host_nqn': HOST, 'min_read_iops': 6000, 'min_read_mibps': 0,
      'min_write_iops': 2000, 'min_write_mibps': 10, 'weight': 2, 'priority': 'low', 'group': 'tenant-b'}),
    (['qos_host_remove', '-d', 'dom0', '-q', HOST], 'qos_host_remove', {'domain': 'dom0', 'host_nqn': HOST}),
    (['qos_version_get'], 'qos_version_get', {}),
    (['qos_ini_version_get'], 'qos_ini_version_get', {}),
    (['qos_host_get', '-d', 'dom0'], 'qos_host_get', {'domain': 'dom0'}),
    (['qos_host_get', '-d', 'dom0', '--host-nqn', HOST], 'qos_host_get', {'domain': 'dom0', 'host_nqn': HOST}),
    # Tenant groups
    (['qos_group_create', '-d', 'dom0', '-n', 'tenant-a'], 'qos_group_create', {'domain': 'dom0', 'name': 'tenant-a'}),
    (['qos_group_create', '--domain', 'dom0', '--name', 'tenant-a', '--min-iops', '60000', '--min-mibps', '200',
      '--max-iops', '100000', '--max-mibps', '800', '--weight', '2'],
     'qos_group_create',
     {'domain': 'dom0', 'name': 'tenant-a', 'min_iops': 60000, 'min_mibps': 200, 'max_iops': 100000,
      'max_mibps': 800, 'weight': 2}),
    (['qos_group_create', '-d', 'dom0', '-n', 'g1', '--max-iops', '100', '--min-iops', '100', '-w', '1000'],
     'qos_group_create', {'domain': 'dom0', 'name': 'g1', 'min_iops': 100, 'max_iops': 100, 'weight': 1000}),
    (['qos_group_update', '-d', 'dom0', '-n', 'tenant-a'], 'qos_group_update', {'domain': 'dom0', 'name': 'tenant-a'}),
    (['qos_group_update', '--domain', 'dom0', '--name', 'tenant-a', '--min-iops', '70000', '--min-mibps', '100',
      '--max-iops', '120000', '--max-mibps', '900', '--weight', '4'],
     'qos_group_update',
     {'domain': 'dom0', 'name': 'tenant-a', 'min_iops': 70000, 'min_mibps': 100, 'max_iops': 120000,
      'max_mibps': 900, 'weight': 4}),
    # 0 clears a rate, and a cleared limit is no bound for the reservation
    (['qos_group_update', '-d', 'dom0', '-n', 'tenant-a', '--min-iops', '500', '--max-iops', '0',
      '--min-mibps', '0', '-w', '1'],
     'qos_group_update',
     {'domain': 'dom0', 'name': 'tenant-a', 'min_iops': 500, 'max_iops': 0, 'min_mibps': 0, 'weight': 1}),
    (['qos_group_delete', '-d', 'dom0', '-n', 'tenant-a'], 'qos_group_delete', {'domain': 'dom0', 'name': 'tenant-a'}),
    (['qos_group_delete', '--domain', 'dom0', '--name', 'tenant-a'],
     'qos_group_delete', {'domain': 'dom0', 'name': 'tenant-a'}),
    (['qos_group_get', '-d', 'dom0'], 'qos_group_get', {'domain': 'dom0'}),
    (['qos_group_get', '--domain', 'dom0', '--name', 'tenant-a'],
     'qos_group_get', {'domain': 'dom0', 'name': 'tenant-a'}),
    # QoS bdevs
    (['qos_bdev_create', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST],
     'qos_bdev_create', {'name': 'qos0', 'base_bdev_name': 'Nvme0n1', 'domain': 'dom0', 'host_nqn': HOST}),
    (['qos_bdev_create', '--name', 'qos0', '--base-bdev-name', 'Nvme0n1', '--domain', 'dom0',
      '--host-nqn', HOST, '--uuid', UUID],
     'qos_bdev_create',
     {'name': 'qos0', 'base_bdev_name': 'Nvme0n1', 'domain': 'dom0', 'host_nqn': HOST, 'uuid': UUID}),
    (['qos_bdev_delete', '-n', 'qos0'], 'qos_bdev_delete', {'name': 'qos0'}),
    (['qos_bdev_get'], 'qos_bdev_get', {}),
    (['qos_bdev_get', '-n', 'qos0'], 'qos_bdev_get', {'name': 'qos0'}),
    (['qos_bdev_expose', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST, '--nqn', SUBSYS],
     'qos_bdev_expose',
     {'name': 'qos0', 'base_bdev_name': 'Nvme0n1', 'domain': 'dom0', 'host_nqn': HOST, 'nqn': SUBSYS}),
    (['qos_bdev_expose', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST, '-u', UUID,
      '--nqn', SUBSYS, '--nsid', '7'],
     'qos_bdev_expose',
     {'name': 'qos0', 'base_bdev_name': 'Nvme0n1', 'domain': 'dom0', 'host_nqn': HOST, 'uuid': UUID,
      'nqn': SUBSYS, 'nsid': 7}),
    # Initiator plugin
    (['qos_ini_bdev_create', '-n', 'qr', '-b', 'Nvme0n1'], 'qos_ini_bdev_create',
     {'name': 'qr', 'base_bdev_name': 'Nvme0n1'}),
    (['qos_ini_bdev_create', '--name', 'qr', '--base-bdev-name', 'Nvme0n1', '--uuid', UUID,
      '--pacer-group', 'rw', '--acquire-ops', '64', '--acquire-bytes', '16777216',
      '--prefetch-milli', '500', '--request-timeout-us', '50000', '--retry-after-us', '2000',
      '--refresh-interval-us', '20000', '--probe-attempts', '5', '--chunk-bytes', '131072',
      '--link-mibps', '2000', '--link-iops', '500000', '--latency-target-us', '300',
      '--latency-target-auto-milli', '2000',
      '--probe-interval-us', '250', '--probe-window', '500', '--aimd-interval-us', '2000',
      '--increase-milli', '10', '--latency-idle-us', '50000', '--dirs-late-gap-us', '500',
      '--dirs-recovery-us', '5000', '--dirs-reset-us', '50000', '--dirs-window-us', '5000',
      '--no-token-protocol', '--pacing', '--split-always', '--no-dirs', '--no-chunk-auto'],
     'qos_ini_bdev_create',
     {'name': 'qr', 'base_bdev_name': 'Nvme0n1', 'uuid': UUID, 'pacer_group': 'rw',
      'acquire_ops': 64, 'acquire_bytes': 16777216, 'prefetch_milli': 500,
      'request_timeout_us': 50000, 'retry_after_us': 2000, 'refresh_interval_us': 20000,
      'probe_attempts': 5, 'chunk_bytes': 131072, 'link_mibps': 2000, 'link_iops': 500000,
      'latency_target_us': 300, 'latency_target_auto_milli': 2000, 'probe_interval_us': 250,
      'probe_window': 500,
      'aimd_interval_us': 2000, 'increase_milli': 10, 'latency_idle_us': 50000,
      'dirs_late_gap_us': 500, 'dirs_recovery_us': 5000, 'dirs_reset_us': 50000,
      'dirs_window_us': 5000, 'token_protocol': False, 'pacing': True, 'split_always': True,
      'dirs': False, 'chunk_auto': False}),
    (['qos_ini_bdev_delete', '-n', 'qr'], 'qos_ini_bdev_delete', {'name': 'qr'}),
    (['qos_ini_bdev_get'], 'qos_ini_bdev_get', {}),
    (['qos_ini_bdev_get', '--name', 'qr'], 'qos_ini_bdev_get', {'name': 'qr'}),
    (['qos_ini_bdev_set_options', '-n', 'qr', '--latency-target-us', '500', '--no-pacing',
      '--latency-target-auto-milli', '0'],
     'qos_ini_bdev_set_options',
     {'name': 'qr', 'latency_target_us': 500, 'pacing': False, 'latency_target_auto_milli': 0}),
    (['qos_ini_bdev_set_options', '--name', 'qr', '--acquire-ops', '64', '--acquire-bytes', '0',
      '--prefetch-milli', '0', '--request-timeout-us', '10', '--retry-after-us', '1',
      '--refresh-interval-us', '1000', '--probe-attempts', '1', '--chunk-bytes', '4096',
      '--link-mibps', '1', '--link-iops', '1', '--probe-interval-us', '1', '--probe-window', '1',
      '--aimd-interval-us', '1', '--increase-milli', '1000', '--latency-idle-us', '1',
      '--dirs-late-gap-us', '1', '--dirs-recovery-us', '1', '--dirs-reset-us', '1',
      '--dirs-window-us', '1', '--token-protocol', '--no-split-always', '--dirs', '--chunk-auto'],
     'qos_ini_bdev_set_options',
     {'name': 'qr', 'acquire_ops': 64, 'acquire_bytes': 0, 'prefetch_milli': 0,
      'request_timeout_us': 10, 'retry_after_us': 1, 'refresh_interval_us': 1000,
      'probe_attempts': 1, 'chunk_bytes': 4096, 'link_mibps': 1, 'link_iops': 1,
      'probe_interval_us': 1, 'probe_window': 1, 'aimd_interval_us': 1, 'increase_milli': 1000,
      'latency_idle_us': 1, 'dirs_late_gap_us': 1, 'dirs_recovery_us': 1, 'dirs_reset_us': 1,
      'dirs_window_us': 1, 'token_protocol': True, 'split_always': False, 'dirs': True,
      'chunk_auto': True}),
    # Statistics
    (['qos_ini_stats_get'], 'qos_ini_stats_get', {}),
    (['qos_ini_stats_get', '-n', 'qh1'], 'qos_ini_stats_get', {'name': 'qh1'}),
    (['qos_stats_get'], 'qos_stats_get', {}),
    (['qos_stats_get', '-d', 'dom0'], 'qos_stats_get', {'domain': 'dom0'}),
    (['qos_stats_get', '--domain', 'dom0', '--table'], 'qos_stats_get', {'domain': 'dom0'}),
    (['qos_stats_get', '-q', 'nqn.h1', '--compact'], 'qos_stats_get', {'host_nqn': 'nqn.h1', 'compact': True}),
    (['qos_stats_get', '-d', 'dom0', '--periods', '64'], 'qos_stats_get', {'domain': 'dom0', 'periods': 64}),
    (['qos_stats_get', '--host-nqn', 'nqn.h1', '--watch', '1', '--iterations', '1'], 'qos_stats_get',
     {'host_nqn': 'nqn.h1', 'compact': True}),
]


@pytest.mark.parametrize('argv,method,params', CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_sends_exactly_the_given_params(argv, method, params):
    client = run(argv)
    assert client.calls == [(method, params)]


def test_every_command_is_registered_with_help():
    parser = make_parser()
    sub = next(a for a in parser._actions if a.dest == 'called_rpc_name')
    assert sorted(sub.choices) == sorted([
        'qos_domain_create', 'qos_domain_update', 'qos_domain_delete', 'qos_domain_get',
        'qos_host_set', 'qos_host_update', 'qos_host_remove', 'qos_host_get',
        'qos_group_create', 'qos_group_update', 'qos_group_delete', 'qos_group_get',
        'qos_bdev_create', 'qos_bdev_delete', 'qos_bdev_get', 'qos_bdev_expose', 'qos_stats_get',
        'qos_ini_bdev_create', 'qos_ini_bdev_delete', 'qos_ini_bdev_get', 'qos_ini_bdev_set_options',
        'qos_ini_stats_get', 'qos_version_get', 'qos_ini_version_get'])
    for name, p in sub.choices.items():
        assert p.description, name
        for action in p._actions:
            assert action.help, (name, action.dest)


def test_every_command_is_tested():
    assert {argv[0] for argv, _, _ in CASES} == set(
        next(a for a in make_parser()._actions if a.dest == 'called_rpc_name').choices)


def test_every_flag_is_tested():
    """Each option of each command appears in at least one case above."""
    sub = next(a for a in make_parser()._actions if a.dest == 'called_rpc_name')
    used = {(argv[0], word) for argv, _, _ in CASES for word in argv[1:] if word.startswith('-')}
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings == ['-h', '--help'] or action.help == '==SUPPRESS==':
                continue
            assert any((name, o) in used for o in action.option_strings), (name, action.option_strings)
