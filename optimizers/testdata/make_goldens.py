"""Writes optimizers/testdata/goldens.osg: PyTorch trajectories that the C++ oracle test replays.

The C++ AdamW and Muon must match torch.optim.AdamW(foreach=False) and torch.optim.Muon of the pinned
wheel (torch 2.11.0). This script runs them on seeded random tensors (square, tall, wide and, for
AdamW, 1-D) for five steps and stores inputs, every intermediate parameter and the final optimizer
state. Both sides run LibTorch on one intra-op thread, so on the machine that wrote the file (same CPU
model, cache size and CPU flags, and ATen CPU capability, recorded under meta/) the C++ results must
be bitwise equal; on
another machine the gemm kernels may differ and the test falls back to stated tolerances.

Regenerate (from the repository root, after tools/setup):

  PYTHONPATH=.deps/python \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:$(echo .deps/python/nvidia/*/lib | tr ' ' ':') \
  python3 optimizers/testdata/make_goldens.py optimizers/testdata/goldens.osg

File format (all little-endian; numpy is not needed on either side):
  magic  b"OSGOLD1\\0"                 8 bytes
  count  u32                          number of records
  record u32 name_len, name (utf-8), u8 dtype (0 = f32, 1 = f64, 2 = raw bytes), u32 ndim,
         i64 dims[ndim], then prod(dims) elements (bytes for dtype 2)
"""

import struct
import sys

import torch

STEPS = 5
ADAMW_SHAPES = {"square": (24, 24), "tall": (40, 16), "wide": (16, 40), "vector": (33,)}
MUON_SHAPES = {"square": (32, 32), "tall": (48, 16), "wide": (16, 48)}
# (lr, weight_decay, momentum, nesterov, adjust_lr_fn)
MUON_CONFIGS = [
    (0.02, 0.1, 0.95, True, "original"),
    (0.01, 0.05, 0.9, False, "match_rms_adamw"),
    (0.03, 0.0, 0.95, True, "match_rms_adamw"),
    (0.02, 0.1, 0.95, False, "original"),
]
# lr, beta1, beta2, eps, weight_decay; the lr of step s is lr * ADAMW_LR_FACTORS[s].
ADAMW_HP = (1e-2, 0.9, 0.95, 1e-8, 0.1)
ADAMW_LR_FACTORS = (0.2, 0.4, 1.0, 0.7, 0.3)


class Writer:
    def __init__(self):
        self.records = []

    def tensor(self, name, t):
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.float32:
            code, fmt = 0, "f"
        elif t.dtype == torch.float64:
            code, fmt = 1, "d"
        else:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        values = t.reshape(-1).tolist()
        data = struct.pack("<%d%s" % (len(values), fmt), *values)
        self.records.append((name, code, list(t.shape), data))

    def floats(self, name, values):
        self.tensor(name, torch.tensor(values, dtype=torch.float64))

    def text(self, name, s):
        b = s.encode("utf-8")
        self.records.append((name, 2, [len(b)], b))

    def write(self, path):
        out = [b"OSGOLD1\0", struct.pack("<I", len(self.records))]
        for name, code, dims, data in self.records:
            nb = name.encode("utf-8")
            out.append(struct.pack("<I", len(nb)) + nb + struct.pack("<BI", code, len(dims)))
            out.append(struct.pack("<%dq" % len(dims), *dims))
            out.append(data)
        with open(path, "wb") as f:
            f.write(b"".join(out))


def cpu_fingerprint():
    """The first processor's model name, cache size and flags from /proc/cpuinfo, joined by " | ".

    The kernels oneDNN and ATen pick (and so the rounding) depend on these; the C++ test demands
    bitwise equality only where its fingerprint is the same.
    """
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return " | ".join(fields.get(k, "") for k in ("model name", "cache size", "flags"))


def adamw_goldens(w):
    lr, beta1, beta2, eps, wd = ADAMW_HP
    w.floats("adamw/hp", [lr, beta1, beta2, eps, wd])
    w.floats("adamw/lr_factors", list(ADAMW_LR_FACTORS))
    gen = torch.Generator().manual_seed(1234)
    names = list(ADAMW_SHAPES)
    params = [torch.randn(ADAMW_SHAPES[n], generator=gen) for n in names]
    for n, p in zip(names, params):
        w.tensor(f"adamw/{n}/init", p)
    params = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd,
                            foreach=False)
    for s in range(STEPS):
        opt.param_groups[0]["lr"] = lr * ADAMW_LR_FACTORS[s]
        for n, p in zip(names, params):
            p.grad = torch.randn(p.shape, generator=gen) * 0.1
            w.tensor(f"adamw/{n}/grad/{s}", p.grad)
        opt.step()
        for n, p in zip(names, params):
            w.tensor(f"adamw/{n}/after/{s}", p)
    for n, p in zip(names, params):
        st = opt.state[p]
        w.tensor(f"adamw/{n}/exp_avg", st["exp_avg"])
        w.tensor(f"adamw/{n}/exp_avg_sq", st["exp_avg_sq"])


def muon_goldens(w):
    gen = torch.Generator().manual_seed(5678)
    names = list(MUON_SHAPES)
    init = {n: torch.randn(MUON_SHAPES[n], generator=gen) * 0.05 for n in names}
    grads = {n: [torch.randn(MUON_SHAPES[n], generator=gen) for _ in range(STEPS)] for n in names}
    for n in names:
        w.tensor(f"muon/{n}/init", init[n])
        for s in range(STEPS):
            w.tensor(f"muon/{n}/grad/{s}", grads[n][s])
    for k, (lr, wd, momentum, nesterov, adjust) in enumerate(MUON_CONFIGS):
        w.floats(f"muon/c{k}/hp", [lr, wd, momentum, 1.0 if nesterov else 0.0,
                                  0.0 if adjust == "original" else 1.0])
        params = [torch.nn.Parameter(init[n].clone()) for n in names]
        opt = torch.optim.Muon(params, lr=lr, weight_decay=wd, momentum=momentum,
                               nesterov=nesterov, adjust_lr_fn=adjust)
        for s in range(STEPS):
            for n, p in zip(names, params):
                p.grad = grads[n][s].clone()
            opt.step()
            for n, p in zip(names, params):
                w.tensor(f"muon/c{k}/{n}/after/{s}", p)
        for n, p in zip(names, params):
            w.tensor(f"muon/c{k}/{n}/momentum_buffer", opt.state[p]["momentum_buffer"])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_goldens.py OUTPUT.osg")
    torch.set_num_threads(1)
    w = Writer()
    w.text("meta/torch_version", torch.__version__)
    w.text("meta/cpu_capability", torch.backends.cpu.get_cpu_capability())
    w.text("meta/cpu_fingerprint", cpu_fingerprint())
    adamw_goldens(w)
    muon_goldens(w)
    w.write(sys.argv[1])


if __name__ == "__main__":
    main()
