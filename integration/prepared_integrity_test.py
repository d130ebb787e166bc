"""A prepared directory whose files no longer match its dataset.json is refused before training.

    prepared_integrity_test.py PRETRAIN PREPARE_DATA

Runs tools/prepare_data.py and then the real `pretrain --data=prepared:DIR`:
- as written, it trains (so pretrain's CRC-32C of the files equals the tool's);
- train.{bin,idx} replaced by val.{bin,idx}: exit 2 naming train.bin and both token counts;
- one byte of train.bin changed (same size, same counts): exit 2 naming train.bin's CRC-32C;
- the same file with a dataset.json from before the CRCs were recorded: trains (only the counts are
  checked then), but `--resume` of a run saved on the original file exits 2: the loader's resume
  fingerprint covers every byte of the data;
- train.bin truncated in place under a running 2-rank job: the ranks die of SIGBUS (the file is
  memory-mapped) and pretrain's last line says so: the rank, exit code 135, the signal and the
  likely cause.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

pretrain, prepare = (os.path.abspath(p) for p in sys.argv[1:3])
work = tempfile.mkdtemp(prefix="prepared_integrity.", dir=os.environ.get("TEST_TMPDIR"))


def run(*args, expect=0):
    result = subprocess.run(list(args), capture_output=True, text=True)
    if result.returncode != expect:
        sys.exit(f"FAIL: {' '.join(args)} exited {result.returncode}, expected {expect}:\n"
                 f"{result.stdout}\n{result.stderr}")
    return result


rng = random.Random(3)
words = "alpha beta gamma delta river stone light north quick silver garden window".split()
corpus = os.path.join(work, "corpus.txt")
with open(corpus, "w") as f:
    for _ in range(6000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(8, 30))) + ".\n\n")
data = os.path.join(work, "data")
run(sys.executable, prepare, "--input", corpus, "--output_dir", data, "--vocab_size", "300",
    "--val_fraction", "0.2")
meta = json.load(open(os.path.join(data, "dataset.json")))
train_tokens, val_tokens = meta["train"]["tokens"], meta["val"]["tokens"]
assert train_tokens != val_tokens, meta
# The loader's sampled fingerprint reads 64 blocks of 1024 tokens, at (n - 1024) * b / 63: the byte
# changed below lies between the first two, which a sampled fingerprint would miss.
assert train_tokens > 64 * 1024, train_tokens
changed_token = 1024 + ((train_tokens - 1024) // 63 - 1024) // 2


def pretrain_on(*extra, expect=0):
    return run(pretrain, "--nproc_per_node=1", "--model=tiny", f"--data=prepared:{data}",
               "--global_batch=4", "--seq_len=32", "--eval_every=0", "--eval_batches=1", *extra,
               expect=expect)


ckpt = os.path.join(work, "ckpt")
pretrain_on("--steps=2", f"--save_dir={ckpt}")
print("PASS: the prepared directory as written trains (pretrain's CRC-32C equals prepare_data's)")

originals = {name: open(os.path.join(data, name), "rb").read()
             for name in ("train.bin", "train.idx", "dataset.json")}
for ext in ("bin", "idx"):
    shutil.copyfile(os.path.join(data, f"val.{ext}"), os.path.join(data, f"train.{ext}"))
err = pretrain_on("--steps=2", expect=2).stderr
assert (f"prepared dataset '{data}/train.bin': {val_tokens} tokens, '{data}/dataset.json' says "
        f"{train_tokens}") in err, err
print("PASS: train files replaced by the val files: exit 2 naming train.bin and the token counts")

changed = bytearray(originals["train.bin"])
changed[2 * changed_token] ^= 0x01  # the low bit of a uint16 token: still inside the vocabulary
open(os.path.join(data, "train.bin"), "wb").write(changed)
open(os.path.join(data, "train.idx"), "wb").write(originals["train.idx"])
err = pretrain_on("--steps=2", expect=2).stderr
assert f"prepared dataset '{data}/train.bin': CRC-32C 0x" in err and "dataset.json' says 0x" in err, err
print("PASS: one byte of train.bin changed: exit 2 naming train.bin's CRC-32C")

for split in ("train", "val"):  # a dataset.json as written before the CRCs were recorded
    del meta[split]["bin_crc32c"], meta[split]["idx_crc32c"]
json.dump(meta, open(os.path.join(data, "dataset.json"), "w"))
pretrain_on("--steps=2")
err = pretrain_on("--steps=4", f"--save_dir={ckpt}", "--resume", expect=2).stderr
assert "content CRC-32C (the data's files changed)" in err, err
print("PASS: without recorded CRCs the changed file trains, and --resume on it exits 2 (the resume "
      "fingerprint covers every byte)")

# Truncated in place under a running job: every rank maps train.bin, so every rank's next read past
# the new end is a SIGBUS; the job must say which signal and why, not exit 135 in silence.
for name, contents in originals.items():
    open(os.path.join(data, name), "wb").write(contents)
err_path = os.path.join(work, "truncated.err")
with open(err_path, "w") as err_file:
    job = subprocess.Popen([pretrain, "--nproc_per_node=2", "--model=tiny", f"--data=prepared:{data}",
                            "--global_batch=4", "--seq_len=32", "--eval_every=0", "--log_every=1",
                            "--steps=1000000"], stdout=subprocess.PIPE, stderr=err_file, text=True)
    try:
        for line in job.stdout:  # training has started once rank 0 logs a step
            if "| loss" in line:
                break
        os.truncate(os.path.join(data, "train.bin"), 0)
        job.stdout.read()
        code = job.wait(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
err = open(err_path).read()
lines = [line for line in err.splitlines() if line.startswith("pretrain: ")]
assert code == 135, (code, err)
assert lines and lines[-1].endswith(
    " failed first with exit code 135 (killed by SIGBUS: a memory-mapped file it reads, a token "
    "file or a checkpoint shard, was truncated or changed in place under the job)"), err
print(f"PASS: train.bin truncated under a running 2-rank job: exit 135 and {lines[-1]!r}")
