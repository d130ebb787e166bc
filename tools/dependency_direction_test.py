"""Checks the dependency direction of ../shared/ARCHITECTURE.md on every BUILD file.

The library targets are public (so another workspace can build on them, see deps.bzl); this test,
not Bazel visibility, keeps a package from depending on one below it in the table: ddp/ and
optimizers/ never depend on each other, layout/ stays free of LibTorch, and so on. It evaluates each
BUILD.bazel with stand-ins for the rules (no Bazel needed) and checks the `deps` of every target
that is not a test (a *_test or *_benchmark rule, or testonly) against the packages its own package
may use, and the `#include`s of every non-test source file against the same rules.

usage: dependency_direction_test.py WORKSPACE_ROOT
"""

import os
import re
import sys

# Package -> orthoshard packages it may depend on (besides itself), from ARCHITECTURE.md's table.
# checkpoint/ -> buffers (load writes params into the buffers and runs their param sync): the
# departure docs/architecture.md records; of the optimizers it sees only optimizers/state.h.
ALLOWED = {
    "common": set(),
    "layout": {"common"},
    "collectives": {"common"},
    "buffers": {"common", "layout", "collectives"},
    "optimizers": {"common"},
    "optimizers/distributed": {"common", "layout", "collectives", "buffers", "optimizers"},
    "ddp": {"common", "layout", "collectives", "buffers"},
    "checkpoint": {"common", "layout", "collectives", "buffers", "optimizers"},
    "model": {"common", "collectives"},
    "data": {"common"},
    # integration/'s sub-packages sit below the trainer: they never include integration/ itself.
    "integration/config": {"common", "layout", "model", "optimizers"},
    "integration/metrics": {"common", "collectives", "optimizers", "integration/config"},
}
# Packages that may use anything (the application, examples, benchmarks, build tooling).
ANYTHING = {"integration", "integration/e2e", "examples", "bench", "tools", "third_party", ""}
# Always allowed: the system libraries and the build's own helpers.
ALWAYS = ("//third_party", "//tools", "@")


def component(package):
    """The ALLOWED key a package belongs to (its longest prefix among them)."""
    best = None
    for key in list(ALLOWED) + list(ANYTHING):
        if key and (package == key or package.startswith(key + "/")):
            if best is None or len(key) > len(best):
                best = key
    return best if best is not None else package


def targets(build_file):
    """(name, deps, test) of every rule call in a BUILD file; test: a test or benchmark rule, or testonly."""
    found = []

    def rule_named(kind):
        def rule(**kwargs):
            deps = kwargs.get("deps", [])
            # Benchmarks, like tests, are leaves nothing links against.
            test = kind.endswith(("_test", "_benchmark")) or bool(kwargs.get("testonly", False))
            found.append((kwargs.get("name", "?"), list(deps), test))
        return rule

    class Select(list):
        pass

    def select(branches):
        merged = Select()
        for values in branches.values():
            merged.extend(values)
        return merged

    class AnyRule(dict):
        """Unknown names: loaded constants (UPPER_CASE) are empty lists, the rest rules."""

        def __getitem__(self, name):
            if name in self:
                return dict.__getitem__(self, name)
            return [] if name.isupper() else rule_named(name)

    scope = AnyRule(select=select, glob=lambda *a, **k: [], load=lambda *a, **k: None,
                    package=lambda **k: None, exports_files=lambda *a, **k: None,
                    package_group=lambda **k: None)
    with open(build_file) as f:
        source = f.read()
    exec(compile(source, build_file, "exec"), {"__builtins__": {"True": True, "False": False,
                                                                "len": len, "str": str}}, scope)
    return found


NON_LIBRARY_SOURCE = re.compile(r"(_test|_benchmark|_fuzzer)\.cc$")
INCLUDE = re.compile(r'^#include "([^"]+)/[^/"]+"', re.M)


def include_problems(root):
    """The include graph under the same rules: a non-test source of a checked package includes only
    headers of its own component or of the components it may use (third-party headers pass)."""
    problems = []
    packages = {os.path.dirname(os.path.relpath(os.path.join(d, "BUILD.bazel"), root))
                for d, _, f in os.walk(root) if "BUILD.bazel" in f}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "bazel-")) and
                       d not in ("testing", "testdata", "third_party")]
        own = component("" if rel == "." else rel)
        if own in ANYTHING or own not in ALLOWED:
            continue
        for name in filenames:
            if not name.endswith((".h", ".cc")) or NON_LIBRARY_SOURCE.search(name):
                continue
            with open(os.path.join(dirpath, name), errors="replace") as f:
                for included in INCLUDE.findall(f.read()):
                    top = included.split("/")[0]
                    if top not in packages and included not in packages:
                        continue  # absl/, ATen/, gtest/, google/...: not ours
                    target = component(included)
                    if target != own and target not in ALLOWED[own]:
                        problems.append("%s/%s includes %s/ (%s/ may use only %s)" % (
                            rel, name, included, own, ", ".join(sorted(ALLOWED[own]))))
    return problems


def main():
    root = sys.argv[1]
    problems = []
    checked = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            rel = ""
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "bazel-")) and
                       not os.path.exists(os.path.join(dirpath, d, "WORKSPACE"))]
        if "BUILD.bazel" not in filenames or rel.startswith(("third_party", "tools")):
            continue
        own = component(rel)
        if own in ANYTHING:
            continue
        for name, deps, test in targets(os.path.join(dirpath, "BUILD.bazel")):
            if test:
                continue
            checked += 1
            for dep in deps:
                if dep.startswith(":") or dep.startswith(ALWAYS):
                    continue
                package = dep[2:].split(":")[0]
                target = component(package)
                if target != own and target not in ALLOWED[own]:
                    problems.append("//%s:%s depends on %s (%s/ may use only %s)" % (
                        rel, name, dep, own, ", ".join(sorted(ALLOWED[own])) or "nothing"))
    problems += include_problems(root)
    for p in problems:
        print("FAIL: " + p)
    if checked < 20:
        print("FAIL: only %d targets checked; the BUILD files were not read" % checked)
        return 1
    if problems:
        return 1
    print("PASS: %d non-test targets and their sources' includes follow the dependency direction" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
