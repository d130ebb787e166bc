"""No function of the non-test C++ code is longer than LIMIT lines (STYLE.md: files and functions a
reader takes in one sitting; the longest are listed on success).

Reads every .cc/.h under the tree except tests, benchmarks, fuzzers, `testing/` helpers and
third_party/. A function is a brace block opened at namespace or class scope after a signature (a
parenthesis in its head); its length is from the line of its opening brace to the line of its
closing one. Comments and string literals (raw ones too) are blanked first, so braces in them do
not count. A heuristic, not a parser: it is exact on this code base's style (clang-format, Google).

usage: function_length_test.py WORKSPACE_ROOT
"""

import os
import re
import sys

LIMIT = 100
SKIP_FILE = re.compile(r"(_test|_benchmark|_fuzzer)\.cc$")


def strip(src):
    """`src` with comments and string literals blanked (line breaks kept)."""
    out = []; i = 0; n = len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i); j = n if j < 0 else j
            i = j; continue
        if src.startswith('/*', i):
            j = src.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append('\n' * src.count('\n', i, j)); i = j; continue
        m = re.match(r'R"([^(]*)\(', src[i:i+20])
        if m and (i == 0 or not (src[i-1].isalnum() or src[i-1] == '_')):
            end = ')' + m.group(1) + '"'
            j = src.find(end, i + m.end()); j = n if j < 0 else j + len(end)
            out.append('""' + '\n' * src.count('\n', i, j)); i = j; continue
        if c in '"\'':
            j = i + 1
            while j < n and src[j] != c:
                if src[j] == '\\': j += 1
                j += 1
            out.append(c + c); i = j + 1; continue
        out.append(c); i += 1
    return ''.join(out)


def functions(path):
    """[(lines, name, first line)] of the function bodies in `path`."""
    with open(path, errors="replace") as f:
        text = strip(f.read())
    stack = []  # (kind, first line, name) of every open brace: ns, class, func or other
    found = []
    head_start = 0  # where the text before the next brace begins (after the last ; { or })
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == ";":
            head_start = i + 1
        elif c == "}":
            kind, first, name = stack.pop() if stack else ("other", line, "")
            if kind == "func":
                found.append((line - first + 1, name, first))
            head_start = i + 1
        elif c == "{":
            head = " ".join(text[head_start:i].split())
            if any(k in ("func", "other") for k, _, _ in stack):
                kind = "other"  # a block, lambda or initializer inside a function
            elif re.search(r"\bnamespace\b", head) or head.startswith('extern "'):
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", head):
                kind = "class"
            elif "(" in head:
                kind = "func"
            else:
                kind = "other"  # an initializer list at namespace scope
            name = ""
            if kind == "func":
                match = re.search(r"([~\w:<>]+)\s*\(", head)
                name = match.group(1) if match else head[:40]
            stack.append((kind, line, name))
            head_start = i + 1
    return found


def main():
    root = sys.argv[1]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "bazel-")) and
                       d not in ("third_party", "testing", "testdata") and
                       not os.path.exists(os.path.join(dirpath, d, "WORKSPACE"))]
        for name in filenames:
            if not name.endswith((".cc", ".h")) or SKIP_FILE.search(name):
                continue
            path = os.path.join(dirpath, name)
            for lines, function, first in functions(path):
                found.append((lines, "%s:%d" % (os.path.relpath(path, root), first), function))
    found.sort(reverse=True)
    if len(found) < 500:
        print("FAIL: only %d functions found; the sources were not read" % len(found))
        return 1
    long = [f for f in found if f[0] > LIMIT]
    for lines, where, function in long:
        print("FAIL: %s %s is %d lines (at most %d; split it)" % (where, function, lines, LIMIT))
    if long:
        return 1
    print("PASS: %d functions, none over %d lines; the longest:" % (len(found), LIMIT))
    for lines, where, function in found[:5]:
        print("  %4d %s %s" % (lines, where, function))
    return 0


if __name__ == "__main__":
    sys.exit(main())
