"""qos_bdev_expose: the target method, and the fallback when the target lacks it."""

import pytest

import qos_rpc
from conftest import FakeClient, FakeJSONRPCException, RpcError, run

HOST = 'nqn.2014-08.org.nvmexpress:uuid:6f0c8a2e-1b1d-4a4e-9f57-0d3c2b1a0e11'
SUBSYS = 'nqn.2016-06.io.spdk:cnode1'
EXPOSE = ['qos_bdev_expose', '-n', 'qos0', '-b', 'Nvme0n1', '-d', 'dom0', '-q', HOST, '--nqn', SUBSYS]
CREATE = {'name': 'qos0', 'base_bdev_name': 'Nvme0n1', 'domain': 'dom0', 'host_nqn': HOST}
NOT_FOUND = RpcError(-32601, 'Method not found')


def fallback_client(**answers):
    base = {'qos_bdev_expose': NOT_FOUND, 'qos_bdev_create': 'qos0', 'nvmf_subsystem_add_ns': 3,
            'nvmf_ns_add_host': True, 'nvmf_subsystem_remove_ns': True, 'qos_bdev_delete': True}
    base.update(answers)
    return FakeClient(base)


def test_target_method_is_used_when_present(capsys):
    client = run(EXPOSE, FakeClient({'qos_bdev_expose': 4}))
    assert client.methods == ['qos_bdev_expose']
    assert capsys.readouterr().out == '4\n'


def test_fallback_on_method_not_found(capsys):
    client = run(EXPOSE, fallback_client())
    assert client.calls == [
        ('qos_bdev_expose', dict(CREATE, nqn=SUBSYS)),
        ('qos_bdev_create', CREATE),
        ('nvmf_subsystem_add_ns', {'nqn': SUBSYS, 'namespace': {'bdev_name': 'qos0', 'no_auto_visible': True}}),
        ('nvmf_ns_add_host', {'nqn': SUBSYS, 'nsid': 3, 'host': HOST}),
    ]
    out, err = capsys.readouterr()
    assert out == '3\n'
    assert err == ''


def test_fallback_passes_nsid_and_uuid_and_uses_the_returned_bdev_name(capsys):
    uuid = '0b7e8f1c-3e0a-4a51-9a0c-2f4a3f1f5d6e'
    client = run([*EXPOSE, '--nsid', '9', '-u', uuid], fallback_client(qos_bdev_create='qos0', nvmf_subsystem_add_ns=9))
    assert client.calls[1] == ('qos_bdev_create', dict(CREATE, uuid=uuid))
    assert client.calls[2] == ('nvmf_subsystem_add_ns',
                               {'nqn': SUBSYS, 'namespace': {'bdev_name': 'qos0', 'no_auto_visible': True,
                                                             'nsid': 9}})
    assert client.calls[3] == ('nvmf_ns_add_host', {'nqn': SUBSYS, 'nsid': 9, 'host': HOST})
    assert capsys.readouterr().out == '9\n'


@pytest.mark.parametrize('error', [RpcError(-17, 'File exists'), RpcError(-2, 'No such device'),
                                   RpcError(-32602, 'Invalid parameters'), RpcError(-1, 'Invalid state')])
def test_other_errors_of_the_target_method_are_reported_without_fallback(error):
    client = FakeClient({'qos_bdev_expose': error})
    with pytest.raises(FakeJSONRPCException) as raised:
        run(EXPOSE, client)
    assert client.methods == ['qos_bdev_expose']
    assert error.error['message'] in raised.value.message


def test_non_rpc_exceptions_propagate():
    def boom(params):
        raise ConnectionResetError('connection reset')
    client = FakeClient({'qos_bdev_expose': boom})
    with pytest.raises(ConnectionResetError):
        run(EXPOSE, client)
    assert client.methods == ['qos_bdev_expose']


def test_failed_create_needs_no_undo(capsys):
    client = fallback_client(qos_bdev_create=RpcError(-2, 'base bdev Nvme0n1 not found'))
    with pytest.raises(FakeJSONRPCException) as raised:
        run(EXPOSE, client)
    assert client.methods == ['qos_bdev_expose', 'qos_bdev_create']
    assert 'base bdev Nvme0n1 not found' in raised.value.message
    assert capsys.readouterr().out == ''


def test_failed_add_ns_deletes_the_qos_bdev(capsys):
    client = fallback_client(nvmf_subsystem_add_ns=RpcError(-32602, 'Invalid parameters'))
    with pytest.raises(FakeJSONRPCException) as raised:
        run(EXPOSE, client)
    assert client.methods == ['qos_bdev_expose', 'qos_bdev_create', 'nvmf_subsystem_add_ns', 'qos_bdev_delete']
    assert client.calls[-1] == ('qos_bdev_delete', {'name': 'qos0'})
    # the error re-raised is the add_ns one, as rpc.py would print it
    assert '"method": "nvmf_subsystem_add_ns"' in raised.value.message
    out, err = capsys.readouterr()
    assert out == ''
    assert 'nvmf_subsystem_add_ns failed; undoing' in err
    assert 'undone: qos_bdev_delete {"name": "qos0"}' in err


def test_failed_add_host_removes_the_namespace_then_the_qos_bdev(capsys):
    client = fallback_client(nvmf_ns_add_host=RpcError(-32602, 'Invalid parameters'))
    with pytest.raises(FakeJSONRPCException) as raised:
        run(EXPOSE, client)
    assert client.calls[3:] == [
        ('nvmf_ns_add_host', {'nqn': SUBSYS, 'nsid': 3, 'host': HOST}),
        ('nvmf_subsystem_remove_ns', {'nqn': SUBSYS, 'nsid': 3}),
        ('qos_bdev_delete', {'name': 'qos0'}),
    ]
    assert '"method": "nvmf_ns_add_host"' in raised.value.message
    err = capsys.readouterr().err
    assert 'nvmf_ns_add_host failed; undoing' in err
    assert 'undone: nvmf_subsystem_remove_ns {"nqn": "%s", "nsid": 3}' % SUBSYS in err
    assert 'undone: qos_bdev_delete {"name": "qos0"}' in err


def test_failed_undo_says_what_is_left_and_still_reports_the_first_error(capsys):
    client = fallback_client(nvmf_ns_add_host=RpcError(-32602, 'Invalid parameters'),
                             nvmf_subsystem_remove_ns=RpcError(-32603, 'Internal error'),
                             qos_bdev_delete=RpcError(-16, 'Device or resource busy'))
    with pytest.raises(FakeJSONRPCException) as raised:
        run(EXPOSE, client)
    assert client.methods[-2:] == ['nvmf_subsystem_remove_ns', 'qos_bdev_delete']
    assert '"method": "nvmf_ns_add_host"' in raised.value.message
    err = capsys.readouterr().err
    assert 'could not undo: nvmf_subsystem_remove_ns' in err and 'Internal error (-32603)' in err
    assert 'remove it with: rpc.py nvmf_subsystem_remove_ns %s 3' % SUBSYS in err
    assert 'could not undo: qos_bdev_delete' in err and 'Device or resource busy (-16)' in err
    assert 'remove it with: rpc.py --plugin qos_rpc qos_bdev_delete -n qos0' in err


def test_dry_run_client_returning_none_sends_only_the_target_method(capsys):
    # rpc.py --dry-run clients print the request and return None.
    client = run(EXPOSE, FakeClient({'qos_bdev_expose': None}))
    assert client.methods == ['qos_bdev_expose']
    assert capsys.readouterr().out == ''


# The error parser, on the message formats of the rpc.py clients.

def test_rpc_error_of_socket_client_message():
    message = ('request:\n{\n  "name": "qos0",\n  "method": "qos_bdev_expose",\n  "req_id": 1\n}\n'
               'Got JSON-RPC error response\nresponse:\n{\n  "code": -32601,\n  "message": "Method not found"\n}')
    assert qos_rpc._rpc_error(FakeJSONRPCException(message)) == {'code': -32601, 'message': 'Method not found'}


def test_rpc_error_ignores_response_words_inside_the_error_text():
    message = ('request:\n{}\nGot JSON-RPC error response\nresponse:\n'
               '{\n  "code": -22,\n  "message": "bad response:\\n x"\n}')
    assert qos_rpc._rpc_error(FakeJSONRPCException(message))['code'] == -22


@pytest.mark.parametrize('message', [
    'Error while connecting to /var/tmp/spdk.sock\nIs SPDK application running?',
    'Timeout while waiting for response:\n\n',
    'request:\n{}\nGot JSON-RPC error response\nGoRPCClient: error on JSON-RPC call',
])
def test_rpc_error_is_none_without_an_error_object(message):
    assert qos_rpc._rpc_error(FakeJSONRPCException(message)) is None
    assert qos_rpc._rpc_error(ValueError(message)) is None
