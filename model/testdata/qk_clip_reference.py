"""QK-clip's reference in plain PyTorch (float64), for //model:qk_clip_test.

usage: qk_clip_reference.py INPUT.osref OUTPUT.osref

INPUT (written by qk_clip_test.cc) holds, per case NAME (text record "cases", one per line):
  NAME/config     i64 [num_layers, hidden, num_heads, num_kv_heads]   NAME/theta, NAME/eps, NAME/tau
                  f64 []
  NAME/positions  i64 [B, T] (each token's rotary position)  NAME/segments i64 [B, T] (documents;
                  all zero: plain causal attention)
  NAME/x/<l>      f32 [B, T, C]  the input of block l, as the C++ forward computed it
  NAME/attn_norm/<l> f32 [C]     NAME/qkv/<l> f32 [(H + 2 KV) D, C]  (Megatron's grouped layout)
OUTPUT holds, per case and block l:
  NAME/max_logit/<l>  f64 [H]  max over attended (i, j) of q_i . k_j / sqrt(D), after rotary
  NAME/abs_logit/<l>  f64 [H]  max over the same pairs of the same sum with every product of the
                               computation taken in absolute value (the scale of its rounding
                               errors, see qk_clip_test.cc)
  NAME/new_qkv/<l>    f64      the qkv weight after QK-clip at tau (per KV group g: S_g the max of
                               its heads, gamma_g = min(1, tau / S_g), query and key rows times
                               sqrt(gamma_g)), Kimi K2 / Megatron-LM's rule written out here.
The file format is optimizers/testdata/torch_oracle.py's OSREF1.
"""

import math
import struct
import sys

import torch


def read(path):
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"OSREF1\0\0", "not an OSREF1 file"
    (count,), pos = struct.unpack_from("<I", data, 8), 12
    dtypes = {0: torch.float32, 1: torch.float64, 3: torch.int64}
    for _ in range(count):
        (n,), pos = struct.unpack_from("<I", data, pos), pos + 4
        name, pos = data[pos:pos + n].decode(), pos + n
        code, ndim = struct.unpack_from("<BI", data, pos)
        pos += 5
        dims = struct.unpack_from("<%dq" % ndim, data, pos)
        pos += 8 * ndim
        if code == 2:
            out[name], pos = data[pos:pos + dims[0]].decode(), pos + dims[0]
            continue
        dtype = dtypes[code]
        size = math.prod(dims) * torch.empty((), dtype=dtype).element_size()
        out[name] = torch.frombuffer(bytearray(data[pos:pos + size]), dtype=dtype).reshape(dims)
        pos += size
    return out


def write(path, records):
    codes = {torch.float32: 0, torch.float64: 1, torch.int64: 3}
    out = [b"OSREF1\0\0", struct.pack("<I", len(records))]
    for name, t in records.items():
        t = t.contiguous()
        nb = name.encode()
        out.append(struct.pack("<I", len(nb)) + nb + struct.pack("<BI", codes[t.dtype], t.dim()))
        out.append(struct.pack("<%dq" % t.dim(), *t.shape))
        out.append(t.numpy().tobytes())
    with open(path, "wb") as f:
        f.write(b"".join(out))


def rotate(x, cos, sin):
    """Rotary with the rotate-half convention: pairs (x_j, x_{j + D/2})."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rotate_abs(x_abs, cos, sin):
    """The rotation with every product in absolute value: |x1 c - x2 s| <= |x1| |c| + |x2| |s|."""
    x1, x2 = x_abs.chunk(2, dim=-1)
    c, s = cos.abs(), sin.abs()
    return torch.cat([x1 * c + x2 * s, x1 * s + x2 * c], dim=-1)


def block_logits(x, norm, qkv, positions, segments, layers, theta, eps):
    """Per query head: the max logit and the max of its absolute-value version, over attended pairs."""
    _, hidden, heads, kv = layers
    d, r = hidden // heads, heads // kv
    b, t, _ = x.shape
    x, norm, qkv = x.double(), norm.double(), qkv.double()
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm
    h_abs = h.abs()
    w = qkv.view(kv, r + 2, d, hidden)
    q = torch.einsum("btc,grdc->bgrtd", h, w[:, :r])          # [B, KV, R, T, D]
    k = torch.einsum("btc,gdc->bgtd", h, w[:, r])              # [B, KV, T, D]
    q_abs = torch.einsum("btc,grdc->bgrtd", h_abs, w[:, :r].abs())
    k_abs = torch.einsum("btc,gdc->bgtd", h_abs, w[:, r].abs())
    j = torch.arange(d // 2, dtype=torch.float64)
    angle = positions.double()[..., None] * theta ** (-2.0 * j / d)  # [B, T, D/2]
    cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
    q, k = rotate(q, cos, sin), rotate(k, cos[:, :, 0], sin[:, :, 0])
    q_abs, k_abs = rotate_abs(q_abs, cos, sin), rotate_abs(k_abs, cos[:, :, 0], sin[:, :, 0])
    scores = torch.einsum("bgrid,bgjd->bgrij", q, k) / math.sqrt(d)
    scores_abs = torch.einsum("bgrid,bgjd->bgrij", q_abs, k_abs) / math.sqrt(d)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    allowed = (segments[:, :, None] == segments[:, None, :]) & causal  # [B, T, T]
    allowed = allowed[:, None, None]
    neg = torch.tensor(-math.inf, dtype=torch.float64)
    best = torch.where(allowed, scores, neg).amax(dim=(0, 3, 4)).reshape(heads)
    best_abs = torch.where(allowed, scores_abs, neg).amax(dim=(0, 3, 4)).reshape(heads)
    return best, best_abs


def clipped(qkv, best, layers, tau):
    _, hidden, heads, kv = layers
    d, r = hidden // heads, heads // kv
    w = qkv.double().view(kv, r + 2, d, hidden).clone()
    for g in range(kv):
        s = best[g * r:(g + 1) * r].max().item()
        if s > tau:
            w[g, :r + 1] *= math.sqrt(tau / s)  # query heads and key head; value untouched
    return w.view_as(qkv)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: qk_clip_reference.py INPUT.osref OUTPUT.osref")
    torch.set_num_threads(1)
    inp = read(sys.argv[1])
    out = {}
    for name in inp["cases"].split("\n"):
        layers = inp[f"{name}/config"].tolist()
        theta, eps, tau = (inp[f"{name}/{k}"].item() for k in ("theta", "eps", "tau"))
        for l in range(layers[0]):
            best, best_abs = block_logits(inp[f"{name}/x/{l}"], inp[f"{name}/attn_norm/{l}"],
                                          inp[f"{name}/qkv/{l}"], inp[f"{name}/positions"],
                                          inp[f"{name}/segments"], layers, theta, eps)
            out[f"{name}/max_logit/{l}"] = best
            out[f"{name}/abs_logit/{l}"] = best_abs
            out[f"{name}/new_qkv/{l}"] = clipped(inp[f"{name}/qkv/{l}"], best, layers, tau)
    write(sys.argv[2], out)
    print(f"qk_clip_reference.py: {len(out)} records from torch {torch.__version__}")


if __name__ == "__main__":
    main()
