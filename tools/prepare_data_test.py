"""tools/prepare_data.py against the real readers.

    prepare_data_test.py PREPARE_DATA

- megatron-core's own IndexedDataset reads train/val: one sequence and one document per input
  document, each the tokenizer's encoding followed by the EOD id; no document is in both splits.
- transformers' AutoTokenizer loads the output directory and encodes as the tokenizer file does.
- JSONL input (--json_key), a given --tokenizer (same ids as the trained one it came from).
- Bad input exits 2 with a message naming it, and an existing output directory is left as it was.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

prepare = os.path.abspath(sys.argv[1])
work = tempfile.mkdtemp(prefix="prepare_data.", dir=os.environ.get("TEST_TMPDIR"))


def run(*args, expect=0):
    result = subprocess.run([sys.executable, prepare, *args], capture_output=True, text=True)
    assert result.returncode == expect, (args, result.returncode, result.stdout, result.stderr)
    return result


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
    seen += docs
assert len(seen) == len(texts) and set(seen) == expected, "documents lost, duplicated or changed"
hf = AutoTokenizer.from_pretrained(out)
assert hf(texts[3])["input_ids"] == tokenizer.encode(texts[3]).ids
assert hf.eos_token_id == eod
print(f"PASS: JSONL -> {meta['train']['documents']} + {meta['val']['documents']} documents, read back by "
      f"megatron-core's IndexedDataset and transformers' AutoTokenizer")

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
