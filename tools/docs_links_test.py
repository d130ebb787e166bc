"""The docs stay browsable: every relative link in the Markdown pages resolves (the file exists
and, for `page.md#anchor`, the page has a heading whose GitHub anchor is `anchor`), every Bazel
target a page names in backticks (`//pkg:name`) is declared in pkg/BUILD.bazel, and every page of
docs/ is readable in one sitting (at most MAX_PAGE_BYTES).

usage: docs_links_test.py ROOT   (the repository root; README.md, BENCHMARKS.md and docs/*.md)

Pages are split and renamed as the docs grow (docs/architecture.md was one 74 KB page) and tests
move between packages; a link left pointing at a moved section, or a guarantee citing a test that
is no longer there, is a dead end for the reader, and this test names each one.
"""
import os
import re
import sys

LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
HEADING = re.compile(r'^(#{1,6}) (.*)$', re.M)
FENCE = re.compile(r'^```.*?^```', re.M | re.S)
TARGET = re.compile(r'`//([\w/]*):([\w.\-]+)`')
# The brief's "each readable in one sitting (<= ~20 KB)"; BENCHMARKS.md (the generated report at
# the root) is not a page of docs/.
MAX_PAGE_BYTES = 20 * 1024


def anchor(heading):
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped except '-' and
    '_', spaces to '-' (so '`--tp`' gives '--tp' and 'Newton–Schulz' gives 'newtonschulz')."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)   # a link's text only
    text = text.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors_of(text):
    seen = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub('', text)):
        a = anchor(m.group(2))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f'{a}-{n}')
    return out


def main(root):
    pages = [os.path.join(root, 'README.md'), os.path.join(root, 'BENCHMARKS.md')]
    docs = os.path.join(root, 'docs')
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith('.md'))
    cache = {}
    bad = []
    for page in pages:
        text = open(page, encoding='utf-8').read()
        for m in LINK.finditer(FENCE.sub('', text)):
            target = m.group(1)
            if re.match(r'^[a-z]+:', target):
                continue                                   # http:, https:, mailto:
            path, _, frag = target.partition('#')
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            rel = os.path.relpath(page, root)
            if not os.path.exists(full):
                bad.append(f'{rel}: link to {target}: no file {os.path.relpath(full, root)}')
                continue
            if frag and full.endswith('.md'):
                if full not in cache:
                    cache[full] = anchors_of(open(full, encoding='utf-8').read())
                if frag not in cache[full]:
                    bad.append(f'{rel}: link to {target}: {os.path.relpath(full, root)} has no '
                               f'heading with anchor #{frag}')
        for m in TARGET.finditer(text):
            package, name = m.groups()
            build = os.path.join(root, package, 'BUILD.bazel')
            declared = os.path.exists(build) and re.search(
                r'name\s*=\s*"' + re.escape(name) + '"', open(build, encoding='utf-8').read())
            if not declared:
                bad.append(f'{os.path.relpath(page, root)}: names //{package}:{name}, which '
                           f'{os.path.relpath(build, root)} does not declare')
        if os.path.dirname(page) == docs and len(text.encode('utf-8')) > MAX_PAGE_BYTES:
            bad.append(f'{os.path.relpath(page, root)}: {len(text.encode("utf-8"))} bytes, more '
                       f'than {MAX_PAGE_BYTES}: split it by topic')
    for line in bad:
        print('FAIL: ' + line)
    print(f'{len(pages)} pages, {len(bad)} problems')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
