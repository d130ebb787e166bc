#!/usr/bin/env python3
"""Raw text or JSONL -> a BPE tokenizer -> Megatron-LM .bin/.idx ready for `pretrain --data=prepared:DIR`.

    tools/python3 tools/prepare_data.py --input corpus.jsonl --output_dir data/mycorpus --vocab_size 8192
    tools/python3 tools/prepare_data.py --input a.txt b.txt --text_documents=paragraph \
        --tokenizer my/tokenizer.json --output_dir data/mine

Documents: a JSONL line's --json_key field (Megatron's preprocess_data.py input); for text files,
a whole file, each paragraph (blank-line separated) or each line (--text_documents). Every document
is encoded and followed by the end-of-document token (--eod_text, added to the vocabulary as a
special token), as Megatron's `--append-eod` does.

Tokenizer: a byte-level BPE trained on the documents with Hugging Face `tokenizers` (--vocab_size,
GPT-2's pre-tokenizer, so any text round-trips), or a `tokenizer.json` the user gives (--tokenizer;
--eod_text must be one of its tokens).

Output directory (written to a temporary sibling and renamed into place: it is whole or absent):
    dataset.json           vocab_size, eod_token, file names, document and token counts, sources
    train.bin, train.idx   Megatron MMapIndexedDataset (one sequence per document, uint16 tokens
    val.bin, val.idx       when the vocabulary has fewer than 65500 entries, else int32)
    tokenizer.json         Hugging Face tokenizers
    tokenizer_config.json  so that transformers' AutoTokenizer.from_pretrained(DIR) loads it
The validation split holds out whole documents (--val_fraction of them, chosen by --seed), so no
document is in both.

Exit codes: 0 done; 2 bad input (a missing file, invalid JSON, an empty corpus, an existing
output directory without --overwrite), with a message naming it.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import struct
import sys
import tempfile

import numpy as np

FORMAT = "orthoshard-prepared-dataset"
VERSION = 1

# Megatron's MMapIndexedDataset (megatron/core/datasets/indexed_dataset.py): magic, version 1, a
# dtype code, then sequence lengths, byte pointers and the document index.
_MAGIC = b"MMIDIDX\x00\x00"
_DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


class InputError(Exception):
    """Bad input: reported with exit code 2."""


def write_megatron(prefix, documents, dtype):
    """Writes documents (lists of ids, EOD included) as one sequence and one document each."""
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(documents), dtype=np.int64)
    if len(documents) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    with open(prefix + ".bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())
    with open(prefix + ".idx", "wb") as f:
        f.write(_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", _DTYPE_CODES[np.dtype(dtype)]))
        f.write(struct.pack("<Q", len(documents)))
        f.write(struct.pack("<Q", len(documents) + 1))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(documents) + 1, dtype=np.int64).tobytes())
        f.flush()
        os.fsync(f.fileno())


def read_documents(paths, json_key, text_documents):
    """Yields (source path, document text) in input order; raises InputError for bad input."""
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"--input '{path}': no such file")
        is_jsonl = path.endswith((".jsonl", ".json"))
        with open(path, "r", encoding="utf-8", errors="strict") as f:
            try:
                if is_jsonl:
                    for number, line in enumerate(f, 1):
                        if not line.strip():
                            continue
                        try:
                            record = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise InputError(f"--input '{path}' line {number}: not JSON ({e.msg})")
                        if not isinstance(record, dict) or not isinstance(record.get(json_key), str):
                            raise InputError(f"--input '{path}' line {number}: expected an object "
                                             f"with a string field '{json_key}' (--json_key)")
                        yield path, record[json_key]
                    continue
                text = f.read()
            except UnicodeDecodeError as e:
                raise InputError(f"--input '{path}': not UTF-8 text ({e.reason} at byte {e.start})")
        if text_documents == "file":
            pieces = [text]
        elif text_documents == "line":
            pieces = text.split("\n")
        else:  # paragraph
            pieces = [p for p in text.replace("\r\n", "\n").split("\n\n")]
        for piece in pieces:
            if piece.strip():
                yield path, piece.strip("\n") if text_documents == "paragraph" else piece


def train_tokenizer(texts, vocab_size, eod_text, min_frequency):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[eod_text], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare(args):
    output = os.path.abspath(args.output_dir)
    if os.path.exists(output) and not args.overwrite:
        raise InputError(f"--output_dir '{args.output_dir}' exists; pass --overwrite to replace it")
    if not 0 <= args.val_fraction < 1:
        raise InputError(f"--val_fraction must be in [0, 1), got {args.val_fraction}")
    if args.tokenizer is None and args.vocab_size < 257:
        raise InputError(f"--vocab_size must be >= 257 (256 byte tokens + the EOD), got {args.vocab_size}")

    sources, texts = [], []
    for path, text in read_documents(args.input, args.json_key, args.text_documents):
        sources.append(path)
        texts.append(text)
    if not texts:
        raise InputError("the inputs hold no documents (empty files, or only blank lines)")

    if args.tokenizer is not None:
        from tokenizers import Tokenizer
        if not os.path.isfile(args.tokenizer):
            raise InputError(f"--tokenizer '{args.tokenizer}': no such file")
        try:
            tokenizer = Tokenizer.from_file(args.tokenizer)
        except Exception as e:  # tokenizers raises its own Exception type for malformed files
            raise InputError(f"--tokenizer '{args.tokenizer}': not a Hugging Face tokenizer.json ({e})")
        origin = os.path.abspath(args.tokenizer)
    else:
        tokenizer = train_tokenizer(texts, args.vocab_size, args.eod_text, args.min_frequency)
        origin = f"trained: byte-level BPE, vocab_size {args.vocab_size}, min_frequency {args.min_frequency}"
    eod = tokenizer.token_to_id(args.eod_text)
    if eod is None:
        raise InputError(f"--eod_text '{args.eod_text}' is not a token of the tokenizer")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    encoded = [e.ids + [eod] for e in tokenizer.encode_batch(texts)]
    order = list(range(len(encoded)))
    random.Random(args.seed).shuffle(order)
    num_val = int(round(args.val_fraction * len(encoded)))
    if args.val_fraction > 0 and (num_val == 0 or num_val == len(encoded)):
        raise InputError(f"{len(encoded)} document(s) cannot be split into train and val at "
                         f"--val_fraction {args.val_fraction}: give more documents "
                         f"(--text_documents=paragraph or line cuts text files finer) or "
                         f"--val_fraction 0")
    val_ids = sorted(order[:num_val])
    held_out = set(val_ids)
    splits = {"train": [encoded[i] for i in range(len(encoded)) if i not in held_out]}
    if num_val:
        splits["val"] = [encoded[i] for i in val_ids]
    dtype = np.uint16 if vocab_size < 65500 else np.int32  # Megatron's choice

    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=os.path.basename(output) + ".tmp-", dir=parent)
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a dataset directory is an ordinary one
    try:
        meta = {"format": FORMAT, "version": VERSION, "vocab_size": vocab_size, "eod_token": eod,
                "eod_text": args.eod_text, "tokenizer": "tokenizer.json",
                "tokenizer_origin": origin,
                "sources": [{"path": os.path.abspath(p), "sha256": sha256(p)} for p in args.input]}
        for name, docs in splits.items():
            write_megatron(os.path.join(staging, name), docs, dtype)
            meta[name] = {"prefix": name, "documents": len(docs), "tokens": sum(len(d) for d in docs)}
        tokenizer.save(os.path.join(staging, "tokenizer.json"))
        with open(os.path.join(staging, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": args.eod_text,
                       "bos_token": args.eod_text, "unk_token": None,
                       "clean_up_tokenization_spaces": False}, f, indent=2)
        with open(os.path.join(staging, "dataset.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        # Whole or absent: the old directory (if --overwrite) moves aside only once the new one
        # is complete, and is removed after the rename.
        old = None
        if os.path.exists(output):
            old = tempfile.mkdtemp(prefix=os.path.basename(output) + ".old-", dir=parent)
            os.rename(output, os.path.join(old, "d"))
        os.rename(staging, output)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True,
                        help="text files, or JSONL files (.jsonl/.json: one document per line)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--json_key", default="text", help="JSONL field holding the text")
    parser.add_argument("--text_documents", choices=["file", "paragraph", "line"], default="paragraph",
                        help="what one document of a text file is (default: blank-line separated "
                             "paragraphs)")
    parser.add_argument("--tokenizer", help="an existing tokenizer.json instead of training one")
    parser.add_argument("--vocab_size", type=int, default=8192,
                        help="vocabulary of the trained BPE, special tokens included")
    parser.add_argument("--min_frequency", type=int, default=2,
                        help="BPE: merges seen fewer times are not learned")
    parser.add_argument("--eod_text", default="<|endoftext|>", help="the end-of-document token")
    parser.add_argument("--val_fraction", type=float, default=0.05,
                        help="documents held out for validation (0: no val split)")
    parser.add_argument("--seed", type=int, default=1234, help="which documents are held out")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output_dir (atomically)")
    args = parser.parse_args(argv)
    try:
        meta = prepare(args)
    except InputError as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        return 2
    summary = ", ".join(f"{name} {meta[name]['documents']} documents / {meta[name]['tokens']} tokens"
                        for name in ("train", "val") if name in meta)
    print(f"prepare_data: {args.output_dir}: vocab {meta['vocab_size']}, EOD {meta['eod_token']}, "
          f"{summary}. Train with: pretrain --data=prepared:{args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
