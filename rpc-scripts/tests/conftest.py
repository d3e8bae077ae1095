"""Shared helpers: a fake rpc.py client and a runner that parses a command line the
way rpc.py does (a top-level parser, the plugin's subparsers, then args.func(args))."""

import argparse
import copy
import json
import os
import sys

import pytest

RPC_SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, RPC_SCRIPTS)

import qos_rpc  # noqa: E402


class FakeJSONRPCException(Exception):
    """Like spdk.rpc.client.JSONRPCException: a bare `message` attribute, no code."""

    def __init__(self, message):
        self.message = message


class RpcError:
    """An error answer {code, message} for FakeClient."""

    def __init__(self, code, message):
        self.error = {'code': code, 'message': message}


class FakeClient:
    """Records call(method, params) and answers from `answers` (method -> value,
    RpcError, or a callable taking params). Unlisted methods answer `true`.

    Errors are raised as spdk.rpc.client.JSONRPCClient.call raises them (SPDK 25.09
    and 26.9 alike): the params dict it was given gets `method` and `req_id` added, and
    the message is "request:", the params, "Got JSON-RPC error response",
    "response:", the error object, joined by newlines."""

    def __init__(self, answers=None):
        self.answers = dict(answers or {})
        self.calls = []
        self._request_id = 0

    def call(self, method, params=None):
        params = {} if params is None else params
        self._request_id += 1
        self.calls.append((method, copy.deepcopy(params)))
        answer = self.answers.get(method, True)
        if callable(answer):
            answer = answer(params)
        if isinstance(answer, RpcError):
            params["method"] = method
            params["req_id"] = self._request_id
            raise FakeJSONRPCException("\n".join([
                "request:", "%s" % json.dumps(params, indent=2),
                "Got JSON-RPC error response",
                "response:",
                json.dumps(answer.error, indent=2)]))
        return answer

    @property
    def methods(self):
        return [m for m, _ in self.calls]


def make_parser():
    parser = argparse.ArgumentParser(prog='rpc.py')
    subparsers = parser.add_subparsers(help='RPC methods', dest='called_rpc_name', metavar='')
    qos_rpc.spdk_rpc_plugin_initialize(subparsers)
    return parser


def run(argv, client=None):
    """Parses argv like rpc.py and runs the handler with `client`; returns the client."""
    client = FakeClient() if client is None else client
    args = make_parser().parse_args(argv)
    args.client = client
    args.func(args)
    return client


@pytest.fixture
def fake():
    return FakeClient()
