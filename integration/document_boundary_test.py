"""Attention stops at document boundaries: a corpus whose documents leak into each other when
concatenated trains, with pretrain's document mask, to no better than the information bound.

    document_boundary_test.py PRETRAIN PREPARE_DATA

The corpus is pairs of documents A, B: A is K tokens drawn uniformly from M symbols, B is a copy of
A, each followed by EOD. Across the boundary B is a copy of what came K + 1 tokens earlier (a fixed
relative offset, which rotary attention finds quickly); within B alone its tokens are independent
uniform draws. So with --reset_attention_mask (the default), no model can predict B's tokens 2..K
from what it may see, nor A's: with the EOD loss mask, per pair 2K targets are counted (K - 1 of A,
A's EOD, the same for B), of which 2(K - 1) are uniform over M symbols, and the expected eval loss of
ANY model is at least (K - 1) / K * ln M (cross entropy against a uniform target is ln M plus a
KL >= 0). With --reset_attention_mask=false the same training copies B from A, and the loss falls
well below that bound: the data does leak, so the first run's loss proves the mask holds.

The same documents without EOD tokens, written by megatron-core's own IndexedDatasetBuilder (each
document two sequences), train without --eod_token: the documents the .idx records restart attention
and positions as EODs do. Every target is then counted: per pair, B's first token is A's first
(visible from A's last position, in A's document) and the other 2K - 1 targets are uniform given
what their position may see, so the bound is (2K - 1) / (2K) * ln M; with
--reset_attention_mask=false the loss falls well below it again.

Margins: the bound is an expectation; the eval mean over N ~ 2000 counted targets of a model near
uniform fluctuates by ~sd(-log q)/sqrt(N) < 0.02 nats, so FLOOR = 0.95 x bound (0.12 nats below it)
cannot fail by chance. The leaking run is asserted below 0.75 x bound: copying removes the loss of
half the uniform targets, bringing it towards 0.5 x bound (measured in the run and printed).
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

K, M = 8, 16  # tokens per document, symbols (ids 1..M; EOD is 0)
pretrain, prepare = (os.path.abspath(p) for p in sys.argv[1:3])
sys.path.insert(0, os.path.dirname(prepare))
from prepare_data import write_megatron  # noqa: E402 (the tool's own Megatron writer)
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402

work = tempfile.mkdtemp(prefix="doc_boundary.", dir=os.environ.get("TEST_TMPDIR"))
rng = np.random.default_rng(11)
for split, pairs in (("train", 4000), ("val", 200)):
    documents = []
    for _ in range(pairs):
        a = [int(v) for v in rng.integers(1, M + 1, size=K)]
        documents += [a + [0], a + [0]]
    write_megatron(os.path.join(work, split), documents, np.uint16)
    builder = IndexedDatasetBuilder(os.path.join(work, f"{split}_noeod.bin"), dtype=np.uint16)
    for document in documents:
        builder.add_item(torch.tensor(document[:K // 2]))
        builder.add_item(torch.tensor(document[K // 2:K]))
        builder.end_document()
    builder.finalize(os.path.join(work, f"{split}_noeod.idx"))

bound = (K - 1) / K * math.log(M)


def train(reset, eod=True, expect_line=None, extra=(), expect=0):
    suffix, documents = ("", ["--eod_token=0", "--eod_mask_loss"]) if eod else ("_noeod", [])
    args = [pretrain, "--nproc_per_node=1", "--model=tiny", f"--data=megatron:{work}/train{suffix}",
            f"--eval_data=megatron:{work}/val{suffix}", f"--vocab_size={M + 1}", *documents,
            f"--reset_attention_mask={'true' if reset else 'false'}",
            "--steps=600", "--global_batch=16", "--seq_len=64", "--eval_every=0",
            "--eval_batches=4", "--optimizer=adamw", "--dist=replicated", "--lr=3e-3", *extra]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != expect:
        sys.exit(f"FAIL: {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    if expect != 0:
        return result.stderr
    if expect_line is not None and expect_line not in result.stdout:
        sys.exit(f"FAIL: no '{expect_line}' in:\n{result.stdout}")
    return json.loads(result.stdout.strip().splitlines()[-1])["eval_loss"]


masked = train(reset=True)
leaking = train(reset=False)
print(f"information bound {bound:.3f} nats; eval loss with the document mask {masked:.3f}, "
      f"without {leaking:.3f}")
assert masked >= 0.95 * bound, f"FAIL: the masked run beat the information bound: {masked} < {bound}"
assert leaking <= 0.75 * bound, f"FAIL: the corpus did not leak without the mask: {leaking}"
print("PASS: attention stops at document boundaries")

index_bound = (2 * K - 1) / (2 * K) * math.log(M)
ckpt = os.path.join(work, "ckpt")
from_index = train(reset=True, eod=False, extra=[f"--save_dir={ckpt}"],
                   expect_line="no end-of-document token; the .idx records 8000 documents: "
                               "attention and positions restart after each")
index_leaking = train(reset=False, eod=False)
print(f"without EOD tokens: information bound {index_bound:.3f} nats; eval loss with the .idx's "
      f"documents {from_index:.3f}, without {index_leaking:.3f}")
assert from_index >= 0.95 * index_bound, \
    f"FAIL: the run on the .idx's documents beat the information bound: {from_index} < {index_bound}"
assert index_leaking <= 0.75 * index_bound, f"FAIL: the corpus did not leak without the mask: {index_leaking}"
print("PASS: attention stops at the document boundaries a megatron-core .idx records")
error = train(reset=False, eod=False, extra=[f"--save_dir={ckpt}", "--resume"], expect=2)
assert "documents=index,reset" in error, error
print("PASS: the checkpoint records the .idx's documents: a resume without them exits 2")
