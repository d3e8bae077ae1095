#!/usr/bin/env python3
"""qos-core's import graph, read from the source: every `crate::` path (use lines and
inline paths, test modules included) and `super::` path, resolved to the file that
defines the module. Fails (exit 1) when two files import each other through any circle,
or when the I/O path's shared state (ledger.rs, channel.rs, window.rs) imports the
monitor's policies (anything under monitor/): issue 41's layering, kept by `make lint`.

Usage: python3 qos-core/tools/import_circles.py qos-core/src
"""
import os, re, sys
root = sys.argv[1]
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.relpath(os.path.join(d, f), root)
            mod = p[:-3].replace('/', '::')
            if mod == 'lib': mod = ''
            files[mod] = p
def resolve(parts):
    for n in range(len(parts), 0, -1):
        m = '::'.join(parts[:n])
        if m in files: return m
    return None
edges = {m: set() for m in files}
for mod, p in files.items():
    src = open(os.path.join(root, p)).read()
    # crate:: paths, including grouped `use crate::{a::X, b::Y}`
    lines = [l for l in src.split('\n') if not l.strip().startswith('//')]
    text = '\n'.join(lines)
    # expand use groups crudely: crate::{a, b::c}
    for m in re.finditer(r'crate::\{([^}]*)\}', text):
        for item in m.group(1).split(','):
            parts = [x for x in item.strip().split('::') if x and x[0].islower()]
            t = resolve(parts)
            if t is not None and t != mod and not t.startswith(mod + '::') and not (mod.startswith(t + '::') if t else True):
                edges[mod].add(t)
    for m in re.finditer(r'crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)', text):
        parts = m.group(1).split('::')
        t = resolve(parts)
        # a module's own descendants or ancestors are its declaration tree, not imports
        if t is not None and t != mod and not t.startswith(mod + '::') and not (mod.startswith(t + '::') if t else True):
            edges[mod].add(t)
    parent = mod.rsplit('::', 1)[0] if '::' in mod else ''
    for m in re.finditer(r'super::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)', text):
        parts = m.group(1).split('::')
        base = parent.split('::') if parent else []
        t = resolve(base + parts)
        if t is not None and t != mod and not t.startswith(mod + '::') and not mod.startswith(t + '::') and t != '':
            edges[mod].add(t)
# Tarjan
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in edges:
    if v not in idx: sc(v)
big = [s for s in sccs if len(s) > 1]
print('edges:', sum(len(e) for e in edges.values()), 'files:', len(files))
for s in big:
    print('CIRCLE:', sorted(files[m] for m in s))
    for m in sorted(s):
        print('   ', files[m], '->', sorted(files[t] for t in edges[m] if t in s))
if not big:
    print('no import circle')
# The I/O path's shared state must not reach into the monitor's policies.
back = [(files[f], files[t]) for f in ('ledger', 'channel', 'window')
        for t in edges.get(f, ()) if t.startswith('monitor::')]
for f, t in back:
    print(f'BACK EDGE: {f} imports {t} (the I/O path must not import the monitor\'s parts)')
sys.exit(1 if big or back else 0)
