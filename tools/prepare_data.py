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
    dataset.json           vocab_size, eod_token, file names, sources; per split its document and
                           token counts and the CRC-32C of its .bin and .idx (pretrain checks them)
    train.bin, train.idx   Megatron MMapIndexedDataset (one sequence per document, uint16 tokens
    val.bin, val.idx       when the vocabulary has fewer than 65500 entries, else int32)
    tokenizer.json         Hugging Face tokenizers
    tokenizer_config.json  so that transformers' AutoTokenizer.from_pretrained(DIR) loads it
The validation split holds out whole documents (--val_fraction of them, chosen by --seed), so no
document is in both.

Exit codes: 0 done; 2 bad input or a bad path, with one line naming it and what was expected: a
numeric argument outside its range (RANGES below) or not a number, a missing or unreadable input, invalid JSON, an empty corpus, an existing output without --overwrite,
an output that is a file or a directory other than a prepared dataset, an output parent that is a
file or not writable, a write that fails (disk full, file size limit). An existing output is then
left as it was.
"""

import argparse
import contextlib
import errno
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


# CRC-32C (Castagnoli; reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF): the
# checksum common/crc32c.h computes, so pretrain can check the files against dataset.json. The
# standard library has only zlib's CRC-32, so this is numpy: the bytes are cut into _LANES equal
# lanes updated side by side, one byte of every lane per step (the table-driven register update
# crc' = T[(crc ^ byte) & 0xff] ^ (crc >> 8)), and the lane registers are then joined. A CRC
# register is linear over GF(2): the register after A then B is Z_|B|(register after A) xor the
# register of B started from 0, where Z_n is the register update of n zero bytes, a 32x32 bit
# matrix (zlib's crc32_combine). About 1 s per 100 MB.
_CRC32C_POLY = 0x82F63B78
_LANES = 16384
_BLOCK = _LANES * 1024  # bytes per numpy pass: 16 MiB


def _crc32c_table():
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_CRC32C_POLY), table >> 1).astype(np.uint32)
    return table


_CRC32C_TABLE = _crc32c_table()


def _gf2_apply(matrix, x):
    """matrix (32 column images) times the 32-bit vector x."""
    result, bit = 0, 0
    while x:
        if x & 1:
            result ^= matrix[bit]
        x >>= 1
        bit += 1
    return result


def _zeros_matrix(n, _cache={}):
    """Z_n: the register update of n zero bytes, as the images of the 32 unit vectors."""
    if n not in _cache:
        power = [int(_CRC32C_TABLE[(1 << b) & 0xFF]) ^ ((1 << b) >> 8) for b in range(32)]  # Z_1
        result = [1 << b for b in range(32)]
        k = n
        while k:
            if k & 1:
                result = [_gf2_apply(power, c) for c in result]
            power = [_gf2_apply(power, c) for c in power]
            k >>= 1
        _cache[n] = result
    return _cache[n]


def _crc32c_register(data):
    """The register after `data` (uint8 array) started from 0; len(data) a multiple of _LANES."""
    length = len(data) // _LANES
    columns = np.ascontiguousarray(data.reshape(_LANES, length).T)  # [length, _LANES]
    lanes = np.zeros(_LANES, dtype=np.uint32)
    for column in columns:
        lanes = _CRC32C_TABLE[(lanes ^ column) & 0xFF] ^ (lanes >> 8)
    while len(lanes) > 1:  # join neighbours: Z_length(left) xor right
        matrix = np.array(_zeros_matrix(length), dtype=np.uint32)
        left, joined = lanes[0::2], lanes[1::2].copy()
        for bit in range(32):
            joined ^= np.where((left >> bit) & 1 == 1, matrix[bit], np.uint32(0))
        lanes, length = joined, 2 * length
    return int(lanes[0])


def crc32c_update(crc, data):
    """Extends `crc` (of the bytes before; 0 for none) by the bytes `data`."""
    data = np.frombuffer(data, dtype=np.uint8)
    register = crc ^ 0xFFFFFFFF
    whole = len(data) - len(data) % _LANES
    for start in range(0, whole, _BLOCK):
        block = data[start:min(start + _BLOCK, whole)]
        register = _gf2_apply(_zeros_matrix(len(block)), register) ^ _crc32c_register(block)
    for byte in data[whole:].tolist():
        register = int(_CRC32C_TABLE[(register ^ byte) & 0xFF]) ^ (register >> 8)
    return register ^ 0xFFFFFFFF


def crc32c_file(path):
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            crc = crc32c_update(crc, block)
    return crc


@contextlib.contextmanager
def naming(path):
    """Gives an OSError raised inside (file.write's errors name no file) the path being written."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror, path) from e
        raise


def write_megatron(prefix, documents, dtype):
    """Writes documents (lists of ids, EOD included) as one sequence and one document each."""
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(documents), dtype=np.int64)
    if len(documents) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    with naming(prefix + ".bin"), open(prefix + ".bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())
    with naming(prefix + ".idx"), open(prefix + ".idx", "wb") as f:
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


def check_input_file(flag, path):
    """Raises InputError unless `path` is an existing regular file."""
    if not os.path.lexists(path):
        raise InputError(f"{flag} '{path}': no such file, expected a readable file")
    if not os.path.isfile(path):
        kind = "a directory" if os.path.isdir(path) else "not a regular file"
        raise InputError(f"{flag} '{path}': {kind}, expected a readable file")


def open_input(flag, path):
    """open() for reading UTF-8 text; an OSError (permissions, I/O) becomes InputError."""
    try:
        return open(path, "r", encoding="utf-8", errors="strict")
    except OSError as e:
        raise InputError(f"{flag} '{path}': cannot read ({e.strerror}), expected a readable file")


def check_output_dir(output_dir, overwrite):
    """Raises InputError for an --output_dir that cannot be written or must not be replaced."""
    output = os.path.abspath(output_dir)
    if os.path.lexists(output):
        if not os.path.isdir(output):
            raise InputError(f"--output_dir '{output_dir}' is a file, expected a directory to "
                             f"create (or a prepared dataset to replace with --overwrite)")
        if not overwrite:
            raise InputError(f"--output_dir '{output_dir}' exists; pass --overwrite to replace it")
        if os.listdir(output) and not os.path.isfile(os.path.join(output, "dataset.json")):
            raise InputError(f"--output_dir '{output_dir}' is a directory without dataset.json: "
                             f"--overwrite replaces only a prepared dataset or an empty directory")
    ancestor = os.path.dirname(output)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise InputError(f"--output_dir '{output_dir}': '{ancestor}' is a file, expected a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"--output_dir '{output_dir}': directory '{ancestor}' is not writable "
                         f"(read-only filesystem or permissions)")


def read_documents(paths, json_key, text_documents):
    """Yields (source path, document text) in input order; raises InputError for bad input."""
    for path in paths:
        check_input_file("--input", path)
        is_jsonl = path.endswith((".jsonl", ".json"))
        with open_input("--input", path) as f:
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
            except OSError as e:
                raise InputError(f"--input '{path}': cannot read ({e.strerror}), expected a readable file")
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


# The range of every numeric argument, checked before anything is read or written: (low, high,
# closed on the right, why). --vocab_size: at least the 256 byte tokens and the EOD; at most 2^24,
# since the ids must fit the int32 token files (< 2^31) and tokenizers' BpeTrainer reserves about 66
# bytes per entry of vocab_size up front (measured with tokenizers 0.23: 17.7 GB at 2^28, an abort
# at 2^32), so 2^24 bounds that to about 1.1 GB while being 64x the largest published vocabularies
# (262144). --min_frequency: BpeTrainer's u64 (0, its own default, learns what 1 does). --seed:
# any 64-bit unsigned value.
U64_MAX = 2**64 - 1
MAX_VOCAB_SIZE = 2**24
RANGES = {
    "vocab_size": (257, MAX_VOCAB_SIZE, True, "256 byte tokens + the EOD, up to 2^24"),
    "min_frequency": (0, U64_MAX, True, "tokenizers' u64 pair count"),
    "seed": (0, U64_MAX, True, "a 64-bit unsigned seed"),
    "val_fraction": (0.0, 1.0, False, "a fraction of the documents"),
}


def check_ranges(args):
    """Raises InputError naming the first numeric argument outside its range (NaN is outside)."""
    for name, (low, high, closed, why) in RANGES.items():
        value = getattr(args, name)
        inside = low <= value <= high if closed else low <= value < high
        if not inside:
            bracket = "]" if closed else ")"
            raise InputError(f"--{name} {value}: expected a value in [{low}, {high}{bracket} ({why})")


def prepare(args):
    output = os.path.abspath(args.output_dir)
    check_ranges(args)
    check_output_dir(args.output_dir, args.overwrite)

    sources, texts = [], []
    for path, text in read_documents(args.input, args.json_key, args.text_documents):
        sources.append(path)
        texts.append(text)
    if not texts:
        raise InputError("the inputs hold no documents (empty files, or only blank lines)")

    if args.tokenizer is not None:
        from tokenizers import Tokenizer
        check_input_file("--tokenizer", args.tokenizer)
        open_input("--tokenizer", args.tokenizer).close()
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

    meta = {"format": FORMAT, "version": VERSION, "vocab_size": vocab_size, "eod_token": eod,
            "eod_text": args.eod_text, "tokenizer": "tokenizer.json", "tokenizer_origin": origin,
            "sources": [{"path": os.path.abspath(p), "sha256": sha256(p)} for p in args.input]}
    try:
        write_output(output, meta, splits, dtype, tokenizer, args.eod_text)
        return meta
    except OSError as e:
        where = f"'{e.filename}'" if e.filename else f"--output_dir '{args.output_dir}'"
        raise InputError(f"writing {where}: {e.strerror or e}; expected a writable directory with "
                         f"room for the dataset (an existing output is left as it was)")


def write_output(output, meta, splits, dtype, tokenizer, eod_text):
    """Writes the dataset into a temporary sibling of `output` and renames it into place; adds the
    splits to `meta`. Raises OSError (the staging directory removed, `output` as it was)."""
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    try:
        staging = tempfile.mkdtemp(prefix=os.path.basename(output) + ".tmp-", dir=parent)
    except OSError as e:  # name the directory, not the temporary name that was not made
        raise OSError(e.errno, e.strerror, parent) from e
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private; a dataset directory is an ordinary one
        for name, docs in splits.items():
            prefix = os.path.join(staging, name)
            write_megatron(prefix, docs, dtype)
            meta[name] = {"prefix": name, "documents": len(docs), "tokens": sum(len(d) for d in docs),
                          "bin_crc32c": crc32c_file(prefix + ".bin"),
                          "idx_crc32c": crc32c_file(prefix + ".idx")}
        tokenizer_path = os.path.join(staging, "tokenizer.json")
        try:
            tokenizer.save(tokenizer_path)
        except Exception as e:  # tokenizers raises its own Exception type, also for I/O errors
            raise OSError(errno.EIO, f"cannot write the tokenizer ({e})", tokenizer_path)
        config_path = os.path.join(staging, "tokenizer_config.json")
        with naming(config_path), open(config_path, "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eod_text,
                       "bos_token": eod_text, "unk_token": None,
                       "clean_up_tokenization_spaces": False}, f, indent=2)
        meta_path = os.path.join(staging, "dataset.json")
        with naming(meta_path), open(meta_path, "w") as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        # Whole or absent: the old directory (if --overwrite) moves aside only once the new one
        # is complete, and is removed after the rename.
        old = None
        if os.path.exists(output):
            old = tempfile.mkdtemp(prefix=os.path.basename(output) + ".old-", dir=parent)
            os.rename(output, os.path.join(old, "d"))
        try:
            os.rename(staging, output)
        except BaseException:
            if old is not None:
                os.rename(os.path.join(old, "d"), output)
                os.rmdir(old)
            raise
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its errors (a bad or missing argument) as one line and exit 2."""

    def error(self, message):
        print(f"prepare_data: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
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
    except OSError as e:  # a path the checks above did not foresee: still one line, still exit 2
        print(f"prepare_data: '{e.filename}': {e.strerror or e}", file=sys.stderr)
        return 2
    summary = ", ".join(f"{name} {meta[name]['documents']} documents / {meta[name]['tokens']} tokens"
                        for name in ("train", "val") if name in meta)
    print(f"prepare_data: {args.output_dir}: vocab {meta['vocab_size']}, EOD {meta['eod_token']}, "
          f"{summary}. Train with: pretrain --data=prepared:{args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
