"""Sample answers of qos_stats_get built from rpc-scripts/schema/stats.json, for the
tests of the Python readers (exporter/tests/test_stats_schema.py,
rpc-scripts/tests/test_stats_schema.py).

Every object of a sample records the keys a reader asks it for (`[]`, `get`, `in`): a
key the schema does not have at that place, or one only the full form has asked of a
compact answer, is a reader that disagrees with the target. Every value has the schema's
JSON type, so a reader that takes a number for an object (or the other way round) fails
as it would on a real answer. `sparse` samples leave out what the schema says may be
absent and make null what may be null.

The schema is written from the target's Rust types by spdk-plugin's tests (see
rpc-scripts/README.md, "Schema"): a field renamed there fails the reader here."""

import json
import os

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'stats.json')


def load():
    with open(SCHEMA_PATH, encoding='utf-8') as f:
        return json.load(f)


class Reads:
    """What readers asked of the samples that the schema does not give."""

    def __init__(self):
        self.unknown = set()
        self.full_only = set()

    def problems(self):
        return (['%s: read, but the schema has no such field' % p for p in sorted(self.unknown)]
                + ['%s: read from a compact answer, but only the full form has it' % p
                   for p in sorted(self.full_only)])


class Obj(dict):
    """A JSON object of a sample that records the keys asked of it."""

    def __init__(self, node, path, form, reads, values):
        super().__init__(values)
        self._node, self._path, self._form, self._reads = node, path, form, reads

    def _asked(self, key):
        prop = self._node.get('properties', {}).get(key)
        where = '%s.%s' % (self._path, key)
        if prop is None:
            self._reads.unknown.add(where)
        elif self._form == 'compact' and prop.get('x-full-form-only'):
            self._reads.full_only.add(where)

    def __getitem__(self, key):
        self._asked(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._asked(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._asked(key)
        return super().__contains__(key)


def _types(node):
    t = node.get('type')
    return t if isinstance(t, list) else [t]


def sample(schema, form, reads, sparse=False, values=None):
    """An answer of `form` ('full' or 'compact'). `values`: place (as the schema's
    paths, e.g. 'answer[].held_time_bounds_ns') -> the value to put there instead of the
    default of its type (each place must be in the schema)."""
    values = dict(values or {})
    used = set()

    def build(node, path):
        if path in values:
            used.add(path)
            return values[path]
        types = _types(node)
        if sparse and 'null' in types:
            return None
        if 'object' in types:
            props = {}
            for key in node.get('x-order') or sorted(node.get('properties', {})):
                prop = node['properties'][key]
                if form == 'compact' and prop.get('x-full-form-only'):
                    continue
                if sparse and key not in node.get('required', []):
                    continue
                props[key] = build(prop, '%s.%s' % (path, key))
            return Obj(node, path, form, reads, props)
        if 'array' in types:
            return [build(node['items'], path + '[]')]
        if 'integer' in types:
            return 3
        if 'number' in types:
            return 1.5
        if 'string' in types:
            return 'sample'
        if 'boolean' in types:
            return True
        raise ValueError('%s: no JSON type in the schema' % path)

    answer = build(schema, 'answer')
    missing = set(values) - used
    if missing:
        raise KeyError('not places of the schema (or left out of this form): %s' % sorted(missing))
    return answer


def samples(schema, forms=('full', 'compact'), values=None):
    """(form, sparse, reads, answer) for each form, dense and sparse."""
    out = []
    for form in forms:
        for sparse in (False, True):
            reads = Reads()
            out.append((form, sparse, reads, sample(schema, form, reads, sparse, values)))
    return out


_JSON_TYPES = {'object': dict, 'array': list, 'string': str, 'boolean': bool, 'null': type(None)}


def problems_of(value, node, path='answer', partial=False):
    """Where `value` (an answer, or a test's stand-in for one) is not what the schema
    says: a key the schema does not have, a value of another JSON type, and (unless
    `partial`: a stand-in that gives only what its test reads) a required key left out."""
    out = []
    types = _types(node)
    ok = any((t == 'integer' and isinstance(value, int) and not isinstance(value, bool))
             or (t == 'number' and isinstance(value, (int, float)) and not isinstance(value, bool))
             or (t in _JSON_TYPES and isinstance(value, _JSON_TYPES[t]))
             for t in types)
    if not ok:
        return ['%s: %r is not %s' % (path, value, ' or '.join(types))]
    if isinstance(value, dict):
        props = node.get('properties', {})
        for key, v in value.items():
            if key not in props:
                out.append('%s.%s: not in the schema' % (path, key))
            else:
                out += problems_of(v, props[key], '%s.%s' % (path, key), partial)
        if not partial:
            out += ['%s.%s: missing' % (path, k) for k in node.get('required', []) if k not in value]
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += problems_of(v, node['items'], '%s[%d]' % (path, i), partial)
    return out
