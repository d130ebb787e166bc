"""docs/flags.md from `pretrain --help`: the flag reference, generated so that it cannot drift.

usage:
  flags_doc.py PRETRAIN                  print the page
  flags_doc.py PRETRAIN --check PAGE     exit 1 (with a diff) when PAGE is not what PRETRAIN prints

Every flag of integration/pretrain_main.cc (the TrainerConfig fields of
integration/config/trainer_config_fields.h, plus --config and --nproc_per_node) becomes one row:
flag, default, meaning. //integration:flags_doc_test runs the --check form on the built binary.
"""

import difflib
import re
import subprocess
import sys

SOURCE = "integration/pretrain_main.cc"
REGENERATE = ("bazel build //integration:pretrain && "
              "python3 integration/flags_doc.py bazel-bin/integration/pretrain > docs/flags.md")


def flags(help_text):
    """[(name, default, meaning)] of the flags absl lists under `Flags from SOURCE:`."""
    lines = help_text.splitlines()
    try:
        start = lines.index("  Flags from %s:" % SOURCE) + 1
    except ValueError:
        raise SystemExit("flags_doc: `--help` lists no flags from %s" % SOURCE)
    entries = []
    for line in lines[start:]:
        if not line.strip() or line.startswith("  Flags from "):
            break
        if line.startswith("    --"):
            entries.append(line.strip())
        elif entries:
            entries[-1] += " " + line.strip()
    out = []
    for entry in entries:
        match = re.fullmatch(r"--(\w+) \((.*)\); default: (.*);", entry)
        if match is None:
            raise SystemExit("flags_doc: cannot read the --help entry %r" % entry)
        name, meaning, default = match.groups()
        out.append((name, default, meaning))
    return out


def page(help_text):
    rows = ["| `--%s` | `%s` | %s |" % (name, default, meaning.replace("|", "\\|"))
            for name, default, meaning in flags(help_text)]
    return "\n".join([
        "# pretrain flags",
        "",
        "Every flag of `bazel run //integration:pretrain -- --help`, generated from that output by",
        "`integration/flags_doc.py` (`//integration:flags_doc_test` fails when this page and the",
        "binary disagree). Every flag except `--config` and `--nproc_per_node` is also a field of",
        "the text-format config (`--config=FILE`, `integration/config/pretrain_config.proto`);",
        "flags given on the command line override the file. A value outside a flag's range,",
        "and a flag given where the configured mode never reads it (`--muon_tp_mode` at `--tp=1`,",
        "an `fsdp:` flag with another `--dist`, `--recompute_layers` without `--recompute`, an",
        "MoE flag with a dense model), exit 2 before launch with one line naming the flag.",
        "Regenerate with:",
        "",
        "```sh",
        REGENERATE,
        "```",
        "",
        "| flag | default | meaning |",
        "|---|---|---|",
    ] + rows) + "\n"


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--check"):
        raise SystemExit(__doc__)
    help_text = subprocess.run([sys.argv[1], "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    generated = page(help_text)
    if len(sys.argv) == 2:
        sys.stdout.write(generated)
        return 0
    with open(sys.argv[3]) as f:
        current = f.read()
    if current == generated:
        print("PASS: docs/flags.md is what `pretrain --help` prints (%d flags)" %
              len(flags(help_text)))
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), generated.splitlines(True),
                                               "docs/flags.md", "pretrain --help"))
    print("FAIL: docs/flags.md differs from `pretrain --help`; regenerate it:\n  " + REGENERATE)
    return 1


if __name__ == "__main__":
    sys.exit(main())
