#!/usr/bin/env python3
"""Lists the Rust functions longer than a limit (lines from the `fn` line to the closing brace,
signature included; doc comments and attributes not counted), longest first, and fails if there
is one.

   scripts/long-fns.py [--max N] [DIR ...]      (defaults: 150, src crates/engine/src)

Comments, strings and char literals are blanked before the braces are matched; a `fn` without a
body (a trait method's declaration) is skipped. Exit 1 when a function is over the limit."""
import os, re, sys

def blank(src):
    """`src` with comments, strings and char literals turned into spaces (newlines kept)."""
    out, i, n = [], 0, len(src)
    spaces = lambda s: re.sub(r'[^\n]', ' ', s)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
        elif src.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith('/*', j):
                    depth, j = depth + 1, j + 2
                elif src.startswith('*/', j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif (m := re.match(r'b?r(#*)"', src[i:i + 20])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            j += 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", src[i:])):
            j = i + len(m.group(0))
        else:
            out.append(c)
            i += 1
            continue
        out.append(spaces(src[i:j]))
        i = j
    return ''.join(out)

def functions(path):
    """(name, first line, last line) of each function with a body in `path`."""
    s = blank(open(path, encoding='utf-8').read())
    for m in re.finditer(r'\bfn\s+([A-Za-z_][A-Za-z0-9_]*)', s):
        # The body: the first `{` after the signature outside parentheses and brackets.
        j, depth = m.end(), 0
        while j < len(s):
            if s[j] in '([':
                depth += 1
            elif s[j] in ')]':
                depth -= 1
            elif depth == 0 and s[j] in ';{':
                break
            j += 1
        if j >= len(s) or s[j] == ';':
            continue
        k, depth = j, 0
        while k < len(s):
            depth += {'{': 1, '}': -1}.get(s[k], 0)
            if depth == 0:
                break
            k += 1
        yield m.group(1), s.count('\n', 0, m.start()) + 1, s.count('\n', 0, k) + 1

def main(argv):
    limit = 150
    if argv[:1] == ['--max']:
        limit, argv = int(argv[1]), argv[2:]
    roots = argv or ['src', 'crates/engine/src']
    rows = []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for f in sorted(files):
                if f.endswith('.rs'):
                    path = os.path.join(dirpath, f)
                    for name, a, b in functions(path):
                        if b - a + 1 > limit:
                            rows.append((b - a + 1, f'{path}:{a}-{b}', name))
    for lines, where, name in sorted(rows, reverse=True):
        print(f'{lines:5d}  {where}  {name}')
    return 1 if rows else 0

if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
