"""Loads an orthoshard safetensors export with the Python `safetensors` package and prints each tensor.

usage: load_export.py OUT_DIR
Reads OUT_DIR/model.safetensors.index.json if present (Hugging Face sharded layout), else
OUT_DIR/model.safetensors, opens every file with safetensors.safe_open(framework="pt") and prints one
line per tensor: name, torch dtype, shape, file, and the hex of its raw little-endian bytes.
Exit status 3 if `safetensors` (or torch) cannot be imported, so the caller can tell a missing
package from a failed load.
"""
import json
import os
import sys

try:
    import torch
    from safetensors import safe_open
except ImportError as e:  # the C++ test fails and prints this
    print(f"import failed: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    out_dir = sys.argv[1]
    index_path = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        print(f"total_size\t{index['metadata']['total_size']}")
        files = sorted(set(index["weight_map"].values()))
        weight_map = index["weight_map"]
    else:
        files = ["model.safetensors"]
        weight_map = None
    for file in files:
        with safe_open(os.path.join(out_dir, file), framework="pt") as f:
            assert f.metadata().get("format") == "pt", f.metadata()
            for name in f.keys():
                if weight_map is not None:
                    assert weight_map[name] == file, (name, file)
                t = f.get_tensor(name)
                raw = bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()).hex()
                shape = ",".join(str(d) for d in t.shape)
                print(f"tensor\t{name}\t{t.dtype}\t[{shape}]\t{file}\t{raw}")


if __name__ == "__main__":
    main()
