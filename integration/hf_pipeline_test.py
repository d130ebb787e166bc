"""From raw text to a Hugging Face model, with the real tools at every step.

    hf_pipeline_test.py PRETRAIN CKPT PREPARE_DATA

1. Pipeline (two ranks): a small text corpus -> tools/prepare_data.py (BPE trained by Hugging Face
   tokenizers, Megatron .bin/.idx, EOD per document, val split) -> `pretrain --data=prepared:DIR`
   with documents and the EOD loss mask -> `ckpt export --format=hf` -> transformers'
   AutoModelForCausalLM / AutoTokenizer load it, and its loss on the held-out windows, each document
   computed on its own as pretrain's document mask does, equals pretrain's eval loss.
2. Export checks: a --tokenizer file that is not a tokenizers file, whose ids pass the model's
   vocabulary, whose merges name tokens outside its vocabulary (files tokenizers itself refuses), with
   a key twice or 400 kB of nesting, or a FIFO, exits 2 with one line and writes nothing; a bare tokenizer.json loads in AutoTokenizer with the
   checkpoint's EOD as eos; without --tokenizer, stderr says so and GenerationConfig reads the EOD as
   eos_token_id.
3. Logits, per preset (tiny: tied, multi-head; small: tied, grouped-query with 4 query heads per KV
   head), one exported whole and one in shards with an index: LlamaForCausalLM's logits and loss on
   the same ids equal `ckpt forward`'s, which runs orthoshard's own model on the checkpoint. The
   mixture-of-experts presets the same way, each trained on 2 ranks with --ep=2 (so every rank saved
   only its own experts): moe-tiny and moe-small (sharded) as MixtralForCausalLM, moe-tiny-shared as
   Qwen2MoeForCausalLM; transformers loads every tensor (no missing or unexpected keys) and its
   logits equal `ckpt forward`'s, which builds the model at ep 1 with every expert.

Tolerances: both sides compute in fp32 with the same operations in different orders (HF's RMSNorm
and rotary are written out in PyTorch ops, ours are ATen's fused kernels), so they differ by
rounding only: fp32 unit roundoff 2^-24 = 6e-8 times a depth of at most ~10^3 accumulated terms
(dot products of length C or F <= 704, over 4 blocks) times the logits' magnitude (< 20 here) bounds
a logit's difference by ~1e-3 in the worst case and ~1e-5 typically (random-walk accumulation);
LOGIT_TOL = 2e-4 sits between (measured: ~1e-6). A mean of log-probabilities moves by at most the
largest logit difference, so the losses get the same bound plus 5e-7 for pretrain's 6-decimal print.
MoE adds the router: both compute its logits and softmax in fp32 and take the top-k of the same
probabilities up to rounding, so the bound holds unless two experts' probabilities tie within
rounding (~1e-7) for some token, which would send it elsewhere in one model (measured: no such
token; the experts' and shared expert's products are of length C or F_e <= 352, within the bound's
depth; max |logit diff| ~4e-7).
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file

LOGIT_TOL = 2e-4
LOSS_TOL = LOGIT_TOL + 5e-7

pretrain, ckpt, prepare = (os.path.abspath(p) for p in sys.argv[1:4])
python = sys.executable
work = tempfile.mkdtemp(prefix="hf_pipeline.", dir=os.environ.get("TEST_TMPDIR"))


def run(*args, **kwargs):
    result = subprocess.run(list(args), capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def write_corpus(path, documents, seed):
    rng = random.Random(seed)
    words = ("alpha beta gamma delta river stone light north quick silver garden window "
             "market winter orange falcon").split()
    with open(path, "w") as f:
        for _ in range(documents):
            sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) + "."
                         for _ in range(rng.randint(2, 6))]
            f.write(" ".join(sentences) + "\n\n")


def summary_of(output):
    return json.loads(output.strip().splitlines()[-1])


# ---- 1. The pipeline -----------------------------------------------------------------------------
corpus = os.path.join(work, "corpus.txt")
write_corpus(corpus, 400, seed=5)
data = os.path.join(work, "data")
print(run(python, prepare, "--input", corpus, "--output_dir", data, "--vocab_size", "384",
          "--val_fraction", "0.1").strip())
meta = json.load(open(os.path.join(data, "dataset.json")))
eod, vocab = meta["eod_token"], meta["vocab_size"]

seq_len, eval_batches, global_batch, ranks = 64, 2, 8, 2
root = os.path.join(work, "run")
os.makedirs(root)
out = run(pretrain, "--nproc_per_node=2", "--model=tiny", f"--data=prepared:{data}", "--steps=60",
          f"--global_batch={global_batch}", f"--seq_len={seq_len}", f"--eval_batches={eval_batches}",
          "--eval_every=0", "--eod_mask_loss", f"--save_dir={root}/ckpt")
summary = summary_of(out)
assert f"vocabulary {vocab} (from --data=prepared:{data})" in out, out
assert "attention and positions restart after each" in out, out
export = os.path.join(root, "hf")
run(ckpt, "export", f"{root}/ckpt", f"--to={export}", "--format=hf", f"--tokenizer={data}")

from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402 (after the runs: slow import)
from tokenizers import Tokenizer  # noqa: E402

model = AutoModelForCausalLM.from_pretrained(export).eval()
tokenizer = AutoTokenizer.from_pretrained(export)
assert type(model).__name__ == "LlamaForCausalLM", type(model)
assert model.config.vocab_size == vocab and model.config.eos_token_id == eod, model.config
sample = "the quick silver falcon. winter market"
assert tokenizer(sample)["input_ids"] == Tokenizer.from_file(os.path.join(data, "tokenizer.json")).encode(sample).ids
assert tokenizer.decode(tokenizer(sample)["input_ids"]) == sample

# pretrain's eval set: the val split's windows in order (shuffle off), `ranks x eval_batches x
# micro-batch` of them, wrapping around; each row's documents end at EOD; the target predicted from
# an EOD is not counted (--eod_mask_loss); the loss is the mean over the counted targets.
val = np.fromfile(os.path.join(data, "val.bin"), dtype=np.uint16).astype(np.int64)
windows = (len(val) - 1) // seq_len
samples = ranks * eval_batches * (global_batch // ranks)
total, counted = 0.0, 0
with torch.no_grad():
    for sample_index in range(samples):
        w = sample_index % windows
        x = val[w * seq_len: w * seq_len + seq_len]
        y = val[w * seq_len + 1: w * seq_len + seq_len + 1]
        start = 0
        while start < seq_len:
            ends = np.nonzero(x[start:] == eod)[0]
            end = start + int(ends[0]) + 1 if len(ends) else seq_len  # the EOD ends its document
            logits = model(torch.tensor(x[start:end])[None]).logits[0].double()
            logp = torch.log_softmax(logits, -1)
            for t in range(start, end):
                if x[t] == eod:
                    continue
                total -= logp[t - start, y[t]].item()
                counted += 1
            start = end
hf_loss = total / counted
assert abs(hf_loss - summary["eval_loss"]) <= LOSS_TOL, (hf_loss, summary["eval_loss"])
print(f"PASS: pipeline: prepare -> pretrain 2 ranks ({summary['initial_eval_loss']:.3f} -> "
      f"{summary['eval_loss']:.6f} eval) -> export -> transformers eval loss {hf_loss:.6f} "
      f"on {counted} held-out targets (|diff| {abs(hf_loss - summary['eval_loss']):.1e})")

# A prepared dataset's vocabulary is the model's, so --tp must divide it too: checked before any
# rank starts (exit 2, one line, nothing on stdout). 301 requested (the corpus gives at most 334):
# an odd vocabulary (asserted).
odd = os.path.join(work, "data_odd")
run(python, prepare, "--input", corpus, "--output_dir", odd, "--vocab_size", "301",
    "--val_fraction", "0.1")
odd_vocab = json.load(open(os.path.join(odd, "dataset.json")))["vocab_size"]
assert odd_vocab % 2 == 1, odd_vocab
refused = subprocess.run([pretrain, "--nproc_per_node=2", "--tp=2", "--model=tiny",
                          f"--data=prepared:{odd}", "--steps=1"], capture_output=True, text=True)
assert refused.returncode == 2 and refused.stdout == "", (refused.returncode, refused.stdout)
assert refused.stderr.count("\n") == 1 and f"does not divide vocab_size {odd_vocab}" in refused.stderr \
    and "give a --vocab_size tp divides" in refused.stderr, refused.stderr
print(f"PASS: --tp=2 with a prepared vocabulary of {odd_vocab}: refused before launch")

# ---- 2. What an export checks and says ------------------------------------------------------------
pipeline_ckpt = f"{root}/ckpt"


def export_result(*flags):
    out_dir = os.path.join(work, "export_check")
    shutil.rmtree(out_dir, ignore_errors=True)
    # A timeout well past an export's seconds: a check that blocks (a FIFO) or takes quadratic time
    # (deep nesting) fails here instead of hanging the test.
    result = subprocess.run([ckpt, "export", pipeline_ckpt, f"--to={out_dir}", "--format=hf", *flags],
                            capture_output=True, text=True, timeout=120)
    return result, out_dir


# A --tokenizer that transformers could not load, or that does not fit the model: exit 2 naming the
# file and what is wrong, and nothing written.
good_tokenizer = json.load(open(os.path.join(data, "tokenizer.json")))
too_big = dict(good_tokenizer, added_tokens=good_tokenizer.get("added_tokens", []) + [
    {"id": 100000, "content": "<big>", "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": True}])
# Merges that name tokens outside model.vocab (or merge into one): tokenizers itself refuses the
# file (so would AutoTokenizer), and so must the export.
vocab_tokens = good_tokenizer["model"]["vocab"]
merge_pairs = [m.split(" ") if isinstance(m, str) else m for m in good_tokenizer["model"]["merges"]]
unmerged = next((a, b) for a in vocab_tokens for b in vocab_tokens if a + b not in vocab_tokens)
bad_merges = {}
for name, merge in (("unknown_merge.json", ["not-a-token", merge_pairs[0][1]]),
                    ("unmerged.json", list(unmerged))):
    bad = json.loads(json.dumps(good_tokenizer))
    as_text = isinstance(good_tokenizer["model"]["merges"][0], str)  # "A B" or ["A", "B"], as written
    bad["model"]["merges"] = bad["model"]["merges"] + [" ".join(merge) if as_text else merge]
    try:
        Tokenizer.from_str(json.dumps(bad))
        loads = True
    except BaseException:  # tokenizers' own Exception, or its PanicException (a BaseException)
        loads = False
    assert not loads, f"tokenizers loads {name}"
    bad_merges[name] = json.dumps(bad)
duplicate = json.dumps(good_tokenizer)
duplicate = duplicate.replace('"version": "1.0"', '"version": "1.0", "version": "1.0"', 1)
fifo = os.path.join(work, "fifo.json")
os.mkfifo(fifo)
for name, contents, error in (
        ("zip.json", "PK\x03\x04 not a tokenizer", "not JSON"),
        ("config.json", json.dumps({"model_type": "llama", "vocab_size": vocab}), "no \"version\": \"1.0\""),
        ("no_model.json", json.dumps({"version": "1.0", "added_tokens": []}), "no model object"),
        ("too_big.json", json.dumps(too_big), f"ids go up to 100000, past the model's vocabulary of {vocab}"),
        ("unknown_merge.json", bad_merges["unknown_merge.json"], "but 'not-a-token' is not in model.vocab"),
        ("unmerged.json", bad_merges["unmerged.json"],
         f"into '{unmerged[0] + unmerged[1]}', which is not in model.vocab"),
        ("duplicate.json", duplicate, "JSON object has the key \"version\" twice"),
        ("deep.json", "[" * 200000 + "]" * 200000, "JSON nests deeper than 32 levels"),
        ("fifo.json", None, "a FIFO, expected a regular file")):
    path = os.path.join(work, name)
    if contents is not None:
        with open(path, "w") as f:
            f.write(contents)
    result, out_dir = export_result(f"--tokenizer={path}")
    assert result.returncode == 2, (name, result.returncode, result.stderr)
    assert f"--tokenizer '{path}'" in result.stderr and error in result.stderr, (name, result.stderr)
    assert result.stderr.count("\n") == 1, (name, result.stderr)
    assert not os.path.exists(out_dir) and not os.path.exists(out_dir + ".export-tmp"), name

# A bare tokenizer.json: copied, with the checkpoint's EOD as the tokenizer's eos token.
result, out_dir = export_result(f"--tokenizer={data}/tokenizer.json")
assert result.returncode == 0, result.stderr
file_tokenizer = AutoTokenizer.from_pretrained(out_dir)
assert file_tokenizer.eos_token_id == eod, (file_tokenizer.eos_token, eod)
assert file_tokenizer(sample)["input_ids"] == tokenizer(sample)["input_ids"]

# No tokenizer: the EOD is still eos for the model and for generate(), and stderr says what is missing.
result, out_dir = export_result()
assert result.returncode == 0, result.stderr
assert "export without --tokenizer" in result.stderr and f"eos_token_id is {eod}" in result.stderr, result.stderr
assert "tokenizer.json" not in os.listdir(out_dir), os.listdir(out_dir)
assert json.load(open(os.path.join(out_dir, "config.json")))["eos_token_id"] == eod
generation = GenerationConfig.from_pretrained(out_dir)
assert generation.eos_token_id == eod and generation.bos_token_id == eod, generation
print(f"PASS: export refuses 9 bad --tokenizer files (exit 2, one line, nothing written; merges as "
      f"tokenizers checks them, a duplicate key, 400 kB of nesting at once, a FIFO); a bare tokenizer.json "
      f"loads with eos {file_tokenizer.eos_token!r}; without a tokenizer generation_config.json has "
      f"eos_token_id {generation.eos_token_id}")

# ---- 3. Logits per preset ------------------------------------------------------------------------
ids = [int(v) for v in val[:48]]
architectures = {"tiny": "LlamaForCausalLM", "small": "LlamaForCausalLM",
                 "moe-tiny": "MixtralForCausalLM", "moe-small": "MixtralForCausalLM",
                 "moe-tiny-shared": "Qwen2MoeForCausalLM"}
for preset, shard_bytes in (("tiny", None), ("small", 300_000), ("moe-tiny", None),
                            ("moe-tiny-shared", None), ("moe-small", 3_000_000)):
    root = os.path.join(work, preset)
    os.makedirs(root)
    # moe: 2 ranks, ep 2; small: 2 ranks, tp 2 (the export gathers every tensor's tp slices).
    ranks = (["--nproc_per_node=2", "--ep=2"] if preset.startswith("moe") else
             ["--nproc_per_node=2", "--tp=2"] if preset == "small" else ["--nproc_per_node=1"])
    run(pretrain, *ranks, f"--model={preset}", f"--data=prepared:{data}", "--steps=3",
        "--global_batch=4", "--seq_len=64", "--eval_every=0", "--eval_batches=1", f"--save_dir={root}/ckpt")
    if preset.startswith("moe"):
        # `ckpt verify` and `inspect` read a checkpoint whose ranks saved different experts: rank 1's
        # shard holds experts 4-7, every tensor of both shards checks out.
        assert "verified" in run(ckpt, "verify", f"{root}/ckpt")
        inspect = run(ckpt, "inspect", f"{root}/ckpt")
        record = inspect[inspect.find('name: "layers.3.mlp.experts.7.fc2.weight"\n  kind: "param"'):]
        assert record and 'file: "rank1.safetensors"' in record[:record.find("}")], inspect[:2000]
    export = os.path.join(root, "hf")
    extra = [f"--max_shard_bytes={shard_bytes}"] if shard_bytes else []
    run(ckpt, "export", f"{root}/ckpt", f"--to={export}", "--format=hf", f"--tokenizer={data}", *extra)
    files = sorted(os.listdir(export))
    if shard_bytes:
        assert "model.safetensors.index.json" in files and "model-00001-of-" in " ".join(files), files
    else:
        assert "model.safetensors" in files, files
    reference = run(ckpt, "forward", f"{root}/ckpt", "--tokens=" + ",".join(map(str, ids)),
                    f"--out={root}/logits.safetensors")
    ours_loss = float(reference.split()[1])
    ours = load_file(f"{root}/logits.safetensors")["logits"]
    model, loading = AutoModelForCausalLM.from_pretrained(export, output_loading_info=True)
    model.eval()
    assert type(model).__name__ == architectures[preset], (preset, type(model))
    assert not loading["missing_keys"] and not loading["unexpected_keys"], (preset, loading)
    config = model.config
    with torch.no_grad():
        result = model(torch.tensor(ids)[None], labels=torch.tensor(ids)[None])
    diff = (result.logits[0] - ours).abs().max().item()
    assert diff <= LOGIT_TOL, (preset, diff)
    assert abs(result.loss.item() - ours_loss) <= LOSS_TOL, (preset, result.loss.item(), ours_loss)
    print(f"PASS: {preset} as {type(model).__name__} ({config.num_attention_heads} heads / "
          f"{config.num_key_value_heads} KV, tied {config.tie_word_embeddings}, {len(files)} files): "
          f"max |logit diff| {diff:.1e}, "
          f"loss {ours_loss:.6f} vs {result.loss.item():.6f}")
