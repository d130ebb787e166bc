"""tools/prepare_data.py against the real readers.

    prepare_data_test.py PREPARE_DATA

- megatron-core's own IndexedDataset reads train/val: one sequence and one document per input
  document, each the tokenizer's encoding followed by the EOD id; no document is in both splits.
- transformers' AutoTokenizer loads the output directory and encodes as the tokenizer file does.
- JSONL input (--json_key), a given --tokenizer (same ids as the trained one it came from).
- dataset.json's CRC-32C of each .bin and .idx matches a bitwise reference CRC-32C of the files.
- Bad input exits 2 with a message naming it, and an existing output directory is left as it was.
- Numeric arguments outside their range exit 2 with one line naming the argument, the value and
  the range (no traceback, no abort), before anything is written; the ends of the ranges work.
- Bad paths (an input that is a directory or unreadable, an output through a file, an output that is
  a file or a directory other than a dataset, an unwritable parent, a write failing on a file size
  limit) exit 2 with one line naming the path, no traceback, and leave the output as it was.
"""

import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np

prepare = os.path.abspath(sys.argv[1])
work = tempfile.mkdtemp(prefix="prepare_data.", dir=os.environ.get("TEST_TMPDIR"))


def run(*args, expect=0, preexec_fn=None):
    result = subprocess.run([sys.executable, prepare, *args], capture_output=True, text=True,
                            preexec_fn=preexec_fn)
    assert result.returncode == expect, (args, result.returncode, result.stdout, result.stderr)
    return result


def reference_crc32c(path):
    """CRC-32C bit by bit (RFC 3720's definition), independent of the tool's table and lanes."""
    crc = 0xFFFFFFFF
    for byte in open(path, "rb").read():
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


texts = [f"document {i}: " + " ".join(["red fox", "blue sky", "green tea"][j % 3] for j in range(i % 7 + 2))
         for i in range(60)]
jsonl = os.path.join(work, "docs.jsonl")
with open(jsonl, "w") as f:
    for t in texts:
        f.write(json.dumps({"body": t, "id": 1}) + "\n")
out = os.path.join(work, "out")
run("--input", jsonl, "--json_key", "body", "--output_dir", out, "--vocab_size", "300",
    "--val_fraction", "0.2")
meta = json.load(open(os.path.join(out, "dataset.json")))
eod = meta["eod_token"]
assert meta["format"] == "orthoshard-prepared-dataset" and meta["version"] == 1, meta
assert meta["train"]["documents"] + meta["val"]["documents"] == len(texts), meta

from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

tokenizer = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
assert tokenizer.get_vocab_size() == meta["vocab_size"]
expected = {tuple(tokenizer.encode(t).ids + [eod]) for t in texts}
seen = []
for split in ("train", "val"):
    dataset = IndexedDataset(os.path.join(out, split))
    assert len(dataset) == meta[split]["documents"], (split, len(dataset))
    assert list(dataset.document_indices) == list(range(len(dataset) + 1))
    assert dataset.index.dtype == np.uint16
    docs = [tuple(int(v) for v in dataset[i]) for i in range(len(dataset))]
    assert sum(len(d) for d in docs) == meta[split]["tokens"]
    for ext in ("bin", "idx"):
        assert meta[split][f"{ext}_crc32c"] == reference_crc32c(os.path.join(out, f"{split}.{ext}")), \
            (split, ext)
    seen += docs
assert len(seen) == len(texts) and set(seen) == expected, "documents lost, duplicated or changed"
hf = AutoTokenizer.from_pretrained(out)
assert hf(texts[3])["input_ids"] == tokenizer.encode(texts[3]).ids
assert hf.eos_token_id == eod
print(f"PASS: JSONL -> {meta['train']['documents']} + {meta['val']['documents']} documents, read back by "
      f"megatron-core's IndexedDataset and transformers' AutoTokenizer; CRC-32C of every file recorded")

# A given tokenizer: the same ids; paragraphs of a text file as documents.
text = os.path.join(work, "plain.txt")
with open(text, "w") as f:
    f.write("\n\n".join(texts[:10]) + "\n")
again = os.path.join(work, "again")
run("--input", text, "--tokenizer", os.path.join(out, "tokenizer.json"), "--output_dir", again,
    "--val_fraction", "0")
dataset = IndexedDataset(os.path.join(again, "train"))
assert [tuple(int(v) for v in dataset[i]) for i in range(len(dataset))] == \
    [tuple(tokenizer.encode(t).ids + [eod]) for t in texts[:10]]
assert "val" not in json.load(open(os.path.join(again, "dataset.json")))
print("PASS: --tokenizer reuses the ids; text paragraphs are documents")

# Bad input: exit 2, a message naming it, nothing changed.
before = sorted(os.listdir(out))
stamp = os.path.getmtime(os.path.join(out, "dataset.json"))
for args, message in [
    (["--input", jsonl, "--output_dir", out], "exists; pass --overwrite"),
    (["--input", os.path.join(work, "absent.txt"), "--output_dir", os.path.join(work, "x")], "no such file"),
    (["--input", jsonl, "--output_dir", os.path.join(work, "x")], "string field 'text'"),
    (["--input", text, "--output_dir", os.path.join(work, "x"), "--tokenizer",
      os.path.join(out, "tokenizer.json"), "--eod_text", "<eos>"], "'<eos>' is not a token"),
    (["--input", text, "--output_dir", os.path.join(work, "x"), "--text_documents", "file"],
     "cannot be split into train and val"),
]:
    result = run(*args, expect=2)
    assert message in result.stderr, (args, result.stderr)
assert not os.path.exists(os.path.join(work, "x"))
assert sorted(os.listdir(out)) == before and os.path.getmtime(os.path.join(out, "dataset.json")) == stamp
leftovers = [n for n in os.listdir(work) if ".tmp-" in n or ".old-" in n]
assert not leftovers, leftovers
# --overwrite replaces it whole.
run("--input", text, "--output_dir", out, "--overwrite", "--vocab_size", "280", "--val_fraction", "0")
assert json.load(open(os.path.join(out, "dataset.json")))["train"]["documents"] == 10
assert not [n for n in os.listdir(work) if ".tmp-" in n or ".old-" in n]
print("PASS: bad input exits 2 naming it and leaves the output as it was; --overwrite replaces it")

# Bad paths: exit 2, one line naming the path, no traceback, the existing output as it was.
state = sorted(os.listdir(out)), os.path.getmtime(os.path.join(out, "dataset.json"))
a_file = os.path.join(work, "a_file")
open(a_file, "w").write("not a directory\n")
not_a_dataset = os.path.join(work, "not_a_dataset")
os.makedirs(not_a_dataset)
open(os.path.join(not_a_dataset, "keep.txt"), "w").write("mine\n")
cases = [
    (["--input", work, "--output_dir", os.path.join(work, "x")], work, "a directory, expected a readable file"),
    (["--input", jsonl, "--output_dir", os.path.join(a_file, "sub", "x")], a_file, "is a file, expected a directory"),
    (["--input", jsonl, "--output_dir", a_file, "--overwrite"], a_file, "is a file, expected a directory"),
    (["--input", jsonl, "--output_dir", not_a_dataset, "--overwrite"], not_a_dataset, "without dataset.json"),
    (["--input", jsonl, "--output_dir", "/dev/null/x"], "/dev/null", "is a file, expected a directory"),
]
if os.geteuid() != 0:  # root reads and writes whatever the mode bits say
    unreadable = os.path.join(work, "unreadable.txt")
    open(unreadable, "w").write("text\n")
    os.chmod(unreadable, 0)
    locked = os.path.join(work, "locked")
    os.makedirs(locked)
    os.chmod(locked, 0o555)
    cases += [(["--input", unreadable, "--output_dir", os.path.join(work, "x")], unreadable, "cannot read"),
              (["--input", jsonl, "--output_dir", os.path.join(locked, "x")], locked, "not writable")]
for args, path, message in cases:
    result = run(*args, "--json_key", "body", "--vocab_size", "300", expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and path in lines[0] and message in lines[0], (args, result.stderr)
assert open(a_file).read() == "not a directory\n" and os.listdir(not_a_dataset) == ["keep.txt"]
assert not os.path.exists(os.path.join(work, "x"))


# Numeric arguments outside their range (or not numbers): exit 2 before anything is read or
# written, one line naming the argument, the value and the range; no traceback, no abort.
numeric = [
    (["--min_frequency", "-3"], "--min_frequency -3: expected a value in [0, 18446744073709551615]"),
    (["--min_frequency", str(10**20)], f"--min_frequency {10**20}: expected a value in [0, "),
    (["--vocab_size", str(10**20)], f"--vocab_size {10**20}: expected a value in [257, 16777216]"),
    (["--vocab_size", "4294967297"], "--vocab_size 4294967297: expected a value in [257, 16777216]"),
    (["--vocab_size", "256"], "--vocab_size 256: expected a value in [257, 16777216]"),
    (["--seed", "-1"], "--seed -1: expected a value in [0, 18446744073709551615]"),
    (["--seed", str(2**64)], f"--seed {2**64}: expected a value in [0, 18446744073709551615]"),
    (["--val_fraction", "nan"], "--val_fraction nan: expected a value in [0.0, 1.0)"),
    (["--val_fraction", "-0.5"], "--val_fraction -0.5: expected a value in [0.0, 1.0)"),
    (["--val_fraction", "1"], "--val_fraction 1.0: expected a value in [0.0, 1.0)"),
    (["--vocab_size", "1e3"], "argument --vocab_size: invalid int value: '1e3'"),
]
for args, message in numeric:
    result = run("--input", jsonl, "--json_key", "body", "--output_dir", os.path.join(work, "x"), *args,
                 expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare_data: " + message), (args, result.stderr)
assert not os.path.exists(os.path.join(work, "x"))
# The ends of the ranges are accepted (the trainer stops at the merges the corpus has).
run("--input", jsonl, "--json_key", "body", "--output_dir", os.path.join(work, "edge"), "--vocab_size",
    "16777216", "--min_frequency", str(2**64 - 1), "--seed", str(2**64 - 1), "--val_fraction", "0")
assert json.load(open(os.path.join(work, "edge", "dataset.json")))["vocab_size"] == 257
print(f"PASS: {len(numeric)} numeric arguments outside their range exit 2 with one line naming the "
      f"argument, the value and the range; the ends of the ranges are accepted")


def small_file_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # the first file past 1000 bytes fails


result = run("--input", jsonl, "--json_key", "body", "--vocab_size", "300", "--output_dir", out,
             "--overwrite", expect=2, preexec_fn=small_file_limit)
lines = result.stderr.strip().splitlines()
assert len(lines) == 1 and "writing '" in lines[0] and "File too large" in lines[0], result.stderr
assert (sorted(os.listdir(out)), os.path.getmtime(os.path.join(out, "dataset.json"))) == state
assert not [n for n in os.listdir(work) if ".tmp-" in n or ".old-" in n]
print(f"PASS: {len(cases) + 1} bad paths exit 2 with one line naming the path; the output is left as "
      f"it was")
