#!/usr/bin/env python3
"""Lists the import graph between the top-level modules of a crate (and between the files of each
module folder) and fails if it has a cycle.

   scripts/module-cycles.py crates/engine/src [src ...]

An edge a -> b is a `use crate::b...` (or `crate::b::` path in code, not in comments) in a's
files (a's folder counts as a). Exit 1 and the cycle when there is one."""
import os, re, sys

def graph(root):
    mods = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            top = rel.split(os.sep)[0].removesuffix('.rs')
            if top in ('lib', 'main'):
                continue
            text = open(path).read()
            code = '\n'.join(l.split('//')[0] for l in text.split('\n'))
            deps = set(re.findall(r'\bcrate::([a-z_0-9]+)', code))
            # `use crate::{a, b::c}` groups
            for g in re.findall(r'use crate::\{([^}]*)\}', code, re.S):
                deps |= set(re.findall(r'(?:^|[,{\s])([a-z_0-9]+)(?=::|\s*[,}]|\s*$)', g))
            mods.setdefault(top, set()).update(d for d in deps if d != top)
    names = set(mods)
    return {m: sorted(d for d in ds if d in names) for m, ds in mods.items()}

def cycle(g):
    state, stack = {}, []
    def visit(n):
        state[n] = 1; stack.append(n)
        for d in g.get(n, []):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        state[n] = 2; stack.pop()
        return None
    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None

def folders(root):
    """The module folders under root (a `mod.rs`, or a `name.rs` beside a `name/`): their files'
    edges through `super::sibling`."""
    out = []
    for dirpath, _, files in os.walk(root):
        if dirpath == root:
            continue
        sibs = {f.removesuffix('.rs') for f in files if f.endswith('.rs')} - {'mod'}
        g = {}
        for s in sibs:
            code = '\n'.join(l.split('//')[0] for l in open(os.path.join(dirpath, s + '.rs')))
            deps = set(re.findall(r'\bsuper::([a-z_0-9]+)', code))
            for grp in re.findall(r'use super::\{([^}]*)\}', code, re.S):
                deps |= set(re.findall(r'([a-z_0-9]+)::', grp))
            g[s] = sorted(d for d in deps if d in sibs and d != s)
        out.append((dirpath, g))
    return out

bad = False
for root in sys.argv[1:]:
    for dirpath, g in folders(root):
        c = cycle(g)
        print(f'{dirpath}: ' + '; '.join(f'{m} -> {", ".join(d) or "-"}' for m, d in sorted(g.items())))
        print('  CYCLE: ' + ' -> '.join(c) if c else '  no cycle')
        bad |= bool(c)
    g = graph(root)
    print(f'{root}:')
    for m in sorted(g):
        print(f'  {m} -> {", ".join(g[m]) or "-"}')
    c = cycle(g)
    if c:
        print('  CYCLE: ' + ' -> '.join(c)); bad = True
    else:
        print('  no cycle')
sys.exit(1 if bad else 0)
