"""Computes, live on the test's machine, the PyTorch trajectories that //optimizers:oracle_test replays.

usage: torch_oracle.py OUTPUT.osref [--device=cuda]

The C++ AdamW and Muon must equal torch.optim.AdamW(foreach=False) and torch.optim.Muon of the pinned
wheel (torch 2.11.0) bit for bit. Both sides run the same libtorch_cpu.so on the same CPU, one
intra-op thread each, with the same kernels chosen (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA, if set,
reach both: the test starts this script with its own environment), so the comparison is bitwise on any
CPU: nothing is checked in and nothing depends on the machine that wrote it.

Each case is an optimizer, its hyperparameters, params of awkward shapes, a gradient for every step,
the lr factor and gradient scale of every step, every intermediate param and the final state. The
reference of a case is one of:
  torch.optim.AdamW   torch.optim.AdamW(foreach=False), or (fused=True) with the fused kernel (the
                      hp's last value), lr set per step
  torch.optim.Muon    torch.optim.Muon, lr set per step, gradients pre-multiplied by the step's scale
  python.muon         muon_step() below, for what torch.optim.Muon cannot do (fp32 Newton-Schulz,
                      Megatron's "spectral" lr scale, fused weights split into logical blocks); it is
                      torch's _single_tensor_muon op for op with those options added, and this script
                      first proves it bitwise equal to torch.optim.Muon on every torch-compatible
                      case (it exits 1 otherwise).

File format (all little-endian; numpy is not needed on the C++ side):
  magic  b"OSREF1\\0\\0"               8 bytes
  count  u32                          number of records
  record u32 name_len, name (utf-8), u8 dtype (0 = f32, 1 = f64, 2 = raw bytes, 3 = i64),
         u32 ndim, i64 dims[ndim], then prod(dims) elements (bytes for dtype 2)
Records of case NAME (listed, in order, by the text record "cases", one name per line):
  NAME/optimizer   text "adamw" | "muon"
  NAME/reference   text, see above
  NAME/hp          f64; AdamW: lr, beta1, beta2, eps, weight_decay, fused (1 or 0)
                        Muon: lr, weight_decay, momentum, nesterov, scale_rule (0 original,
                              1 match_rms_adamw, 2 spectral), extra_scale, ns_steps, a, b, c, eps,
                              ns_dtype (0 bf16, 1 fp32), norm_scale, n (triples), the n triples,
                              cycle (1: iteration i uses triple i % n, else min(i, n - 1))
  NAME/lr_factors  f64 [steps]   NAME/grad_scales  f64 [steps]   NAME/resume_after  i64 []
  NAME/params      text, param names one per line
  NAME/<p>/split   i64 [1 + blocks]: num_groups, block rows (Muon fused weights only)
  NAME/<p>/init, NAME/<p>/grad/<s>, NAME/<p>/after/<s>   f32
  NAME/<p>/state/<field>   final state: exp_avg, exp_avg_sq, step (f64 []) | momentum_buffer
"""

import math
import struct
import sys

import numpy as np
import torch

# ---- the cases -------------------------------------------------------------------------------

# Awkward shapes: a single element, a row, a column, square, tall, wide and a few hundred rows.
MATRIX_SHAPES = {
    "one": (1, 1), "row": (1, 40), "column": (40, 1), "square": (32, 32), "tall": (48, 16),
    "wide": (16, 48), "long": (300, 24), "broad": (24, 300),
}
ADAMW_SHAPES = dict(MATRIX_SHAPES, vector=(33,), scalar=())

MUON_DEFAULTS = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, scale_rule="original",
                     extra_scale=1.0, ns_steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7,
                     ns_dtype="bf16", norm_scale=1.0, cycle=False)

# Polar Express (Amsel et al., arXiv:2505.16932), the five per-iteration quintics as the
# modded-nanogpt speedrun publishes them (train_gpt.py `polar_express`), which normalises by
# ||X|| * (1 + 2e-2). Typed here from the publication, independently of muon.cc's table: the C++
# side asks for its "polar_express" schedule by name and must give these results bit for bit.
POLAR_EXPRESS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
# Megatron-LM's "quintic" and "aol" tables, typed here from NVIDIA Emerging-Optimizers'
# emerging_optimizers/orthogonalized_optimizers/muon_utils.py (_COEFFICIENT_SETS), independently of
# ns_schedule.cc. That newton_schulz divides by the Frobenius norm clamped at eps
# (torch.nn.functional.normalize: norm_scale 1) and cycles these tables (iteration i uses i % len).
QUINTIC = [
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
]
AOL = [
    (4.0098, -7.0585, 2.4635),
    (3.4585, -5.5479, 2.5959),
    (2.7573, -3.2939, 1.4254),
    (2.7215, -3.0494, 1.3169),
]
ADAMW_DEFAULTS = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, fused=False)


def muon_case(name, steps=5, shapes=MATRIX_SHAPES, grad_std=1.0, lr_factors=None,
              grad_scales=None, splits=None, reference="torch.optim.Muon", **hp):
    return dict(name=name, optimizer="muon", reference=reference, hp=dict(MUON_DEFAULTS, **hp),
                steps=steps, shapes=shapes, grad_std=grad_std, lr_factors=lr_factors,
                grad_scales=grad_scales, splits=splits or {})


def adamw_case(name, steps=5, shapes=ADAMW_SHAPES, grad_std=0.1, lr_factors=None, grad_scales=None,
               **hp):
    return dict(name=name, optimizer="adamw", reference="torch.optim.AdamW",
                hp=dict(ADAMW_DEFAULTS, **hp), steps=steps, shapes=shapes, grad_std=grad_std,
                lr_factors=lr_factors, grad_scales=grad_scales, splits={})


def varying(steps, seed, low, high):
    """A factor per step, drawn uniformly from [low, high): an lr or scale that changes every step."""
    gen = torch.Generator().manual_seed(seed)
    return [low + (high - low) * float(x) for x in torch.rand(steps, generator=gen, dtype=torch.float64)]


LONG = 60
CASES = [
    # Muon against torch.optim.Muon (bf16 Newton-Schulz).
    muon_case("muon/defaults"),
    muon_case("muon/match_rms_plain_momentum0_wd0", scale_rule="match_rms_adamw", nesterov=False,
              momentum=0.0, weight_decay=0.0),
    muon_case("muon/momentum0999_wd5_ns3_coeffs_eps", momentum=0.999, weight_decay=5.0, ns_steps=3,
              coefficients=(2.0, -1.5, 0.5), eps=1e-3),
    muon_case("muon/ns7_match_rms_nesterov", ns_steps=7, scale_rule="match_rms_adamw", lr=0.05,
              momentum=0.9),
    # Gradients so small that the Frobenius norm is clamped at eps before dividing.
    muon_case("muon/eps_clamp_tiny_grads", grad_std=1e-9, eps=1e-4),
    muon_case("muon/60_steps_lr_and_scale_every_step", steps=LONG,
              shapes={k: MATRIX_SHAPES[k] for k in ("one", "row", "tall", "broad")},
              lr_factors=varying(LONG, 11, 0.05, 1.0), grad_scales=varying(LONG, 12, 0.2, 1.0)),
    # Muon against this script's muon_step (no torch.optim counterpart).
    muon_case("muon/fp32_newton_schulz", reference="python.muon", ns_dtype="fp32"),
    muon_case("muon/fp32_ns3_coeffs_plain", reference="python.muon", ns_dtype="fp32", ns_steps=3,
              coefficients=(2.0, -1.5, 0.5), nesterov=False, momentum=0.5),
    muon_case("muon/spectral_bf16", reference="python.muon", scale_rule="spectral", extra_scale=0.5),
    # Coefficient schedules: one triple per iteration (the last repeats past the list's end).
    muon_case("muon/polar_express_bf16", reference="python.muon", coefficients=POLAR_EXPRESS,
              norm_scale=1.02),
    muon_case("muon/polar_express_fp32_ns7", reference="python.muon", coefficients=POLAR_EXPRESS,
              norm_scale=1.02, ns_dtype="fp32", ns_steps=7),
    # Megatron-LM's cycled tables: quintic for one and two cycles, aol for its one cycle of 4.
    muon_case("muon/megatron_quintic_bf16", reference="python.muon", coefficients=QUINTIC,
              cycle=True),
    muon_case("muon/megatron_quintic_fp32_ns10", reference="python.muon", coefficients=QUINTIC,
              cycle=True, ns_dtype="fp32", ns_steps=10),
    muon_case("muon/megatron_aol_bf16_ns4", reference="python.muon", coefficients=AOL, cycle=True,
              ns_steps=4),
    muon_case("muon/megatron_aol_fp32_ns4", reference="python.muon", coefficients=AOL, cycle=True,
              ns_dtype="fp32", ns_steps=4),
    muon_case("muon/schedule_of_two_fp32", reference="python.muon", ns_dtype="fp32",
              coefficients=[(3.4445, -4.7750, 2.0315), (2.0, -1.5, 0.5)], ns_steps=4),
    muon_case("muon/spectral_fp32_40_steps", reference="python.muon", scale_rule="spectral",
              extra_scale=2.0, ns_dtype="fp32", steps=40,
              shapes={k: MATRIX_SHAPES[k] for k in ("column", "wide", "long")},
              lr_factors=varying(40, 13, 0.1, 1.0)),
    # Fused weights: QKV of 2 query groups, 2 heads of 4 per group ([2 * (8 + 4 + 4), 16]), and
    # SwiGLU gate/up ([2 * 12, 10]), orthogonalised per logical block.
    muon_case("muon/fused_blocks", reference="python.muon",
              shapes={"qkv": (32, 16), "fc1": (24, 10), "plain": (12, 20)},
              splits={"qkv": (2, (8, 4, 4)), "fc1": (1, (12, 12))}),
    muon_case("muon/fused_blocks_fp32_match_rms", reference="python.muon", ns_dtype="fp32",
              scale_rule="match_rms_adamw", shapes={"qkv": (32, 16), "fc1": (24, 10)},
              splits={"qkv": (2, (8, 4, 4)), "fc1": (1, (12, 12))}),
    # AdamW against torch.optim.AdamW(foreach=False).
    adamw_case("adamw/defaults"),
    adamw_case("adamw/beta1_0_eps1e-3_wd0", beta1=0.0, beta2=0.99, eps=1e-3, weight_decay=0.0),
    adamw_case("adamw/betas_095_09999_eps0_wd1_lr01", beta1=0.95, beta2=0.9999, eps=0.0,
               weight_decay=1.0, lr=0.1),
    adamw_case("adamw/60_steps_lr_and_scale_every_step", steps=LONG, beta2=0.95, weight_decay=0.1,
               lr_factors=varying(LONG, 21, 0.05, 1.0), grad_scales=varying(LONG, 22, 0.2, 1.0)),
    # Above the fused CPU path's threshold (2^21 elements, optimizers/internal/fused_elementwise.h).
    adamw_case("adamw/large_fused_path", steps=3, shapes={"big": (2048, 1040), "small": (7, 3)},
               beta2=0.95, weight_decay=0.1),
    # AdamWHyper::fused against torch.optim.AdamW(fused=True): ATen's fused kernel.
    adamw_case("adamw_fused/defaults", fused=True),
    adamw_case("adamw_fused/beta1_0_eps0_wd1_lr01", fused=True, beta1=0.0, beta2=0.9999, eps=0.0,
               weight_decay=1.0, lr=0.1),
    adamw_case("adamw_fused/60_steps_lr_and_scale_every_step", fused=True, steps=LONG, beta2=0.95,
               weight_decay=0.1, lr_factors=varying(LONG, 23, 0.05, 1.0),
               grad_scales=varying(LONG, 24, 0.2, 1.0)),
    adamw_case("adamw_fused/large", fused=True, steps=3,
               shapes={"big": (2048, 1040), "small": (7, 3)}, beta2=0.95, weight_decay=0.1),
]


# ---- the Python Muon reference ----------------------------------------------------------------

def schedule(hp):
    """The per-iteration coefficient list: a single triple is used for every iteration."""
    c = hp["coefficients"]
    return [tuple(c)] if isinstance(c[0], (int, float)) else [tuple(t) for t in c]


def newton_schulz(update, hp):
    """torch/optim/_muon.py _zeropower_via_newtonschulz, in hp["ns_dtype"] instead of always bf16,
    with a coefficient schedule (iteration i uses triple min(i, last), or i % len when
    hp["cycle"]) and the norm scaled by
    hp["norm_scale"] before the eps clamp (scaled only when it is not 1, as torch does not)."""
    coefficients = schedule(hp)
    x = update.bfloat16() if hp["ns_dtype"] == "bf16" else update.float().clone()
    transpose = update.size(0) > update.size(1)
    if transpose:
        x = x.T
    norm = x.norm() if hp["norm_scale"] == 1.0 else x.norm() * hp["norm_scale"]
    x.div_(norm.clamp(min=hp["eps"]))
    for i in range(hp["ns_steps"]):
        n = len(coefficients)
        a, b, c = coefficients[i % n if hp["cycle"] else min(i, n - 1)]
        gram = x @ x.T
        gram_update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, gram_update, x, beta=a)
    return x.T if transpose else x


def lr_scale(rows, cols, hp):
    """torch's _adjust_lr ratio, plus Megatron's spectral rule extra_scale * sqrt(max(rows, cols))."""
    if hp["scale_rule"] == "original":
        return math.sqrt(max(1, rows / cols))
    if hp["scale_rule"] == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return hp["extra_scale"] * math.sqrt(max(rows, cols))


def muon_step(param, grad, buf, hp, lr, split):
    """torch/optim/_muon.py _single_tensor_muon op for op, with per-block Newton-Schulz for `split`."""
    buf.lerp_(grad, 1 - hp["momentum"])
    update = grad.lerp(buf, hp["momentum"]) if hp["nesterov"] else buf
    rows, cols = param.shape
    if split is None:
        ortho = newton_schulz(update, hp)
        param.mul_(1 - lr * hp["weight_decay"])
        param.add_(ortho, alpha=-(lr * lr_scale(rows, cols, hp)))
        return
    groups, block_rows = split
    per_group = rows // groups
    update3 = update.view(groups, per_group, cols)
    orthos, offset = [], 0
    for r in block_rows:
        orthos.append(newton_schulz(update3.narrow(1, offset, r).reshape(groups * r, cols), hp))
        offset += r
    param.mul_(1 - lr * hp["weight_decay"])
    param3 = param.view(groups, per_group, cols)
    offset = 0
    for r, ortho in zip(block_rows, orthos):
        param3.narrow(1, offset, r).add_(ortho.reshape(groups, r, cols),
                                         alpha=-(lr * lr_scale(groups * r, cols, hp)))
        offset += r


# ---- running a case ----------------------------------------------------------------------------

def inputs(case, seed):
    """Initial params and per-step gradients, seeded by the case's index."""
    gen = torch.Generator().manual_seed(seed)
    scale = 0.05 if case["optimizer"] == "muon" else 1.0
    init = {n: torch.randn(s, generator=gen) * scale for n, s in case["shapes"].items()}
    grads = {n: [torch.randn(s, generator=gen) * case["grad_std"] for _ in range(case["steps"])]
             for n, s in case["shapes"].items()}
    return init, grads


def run(case, init, grads, reference, device):
    """Runs `case` through `reference` on `device`; returns the param after every step and the final
    state (on the CPU)."""
    steps, hp = case["steps"], case["hp"]
    names = list(case["shapes"])
    params = [torch.nn.Parameter(init[n].to(device, copy=True)) for n in names]
    lr_factors = case["lr_factors"] or [1.0] * steps
    grad_scales = case["grad_scales"] or [1.0] * steps
    opt = None
    if reference == "torch.optim.AdamW":
        fused = {"fused": True} if hp["fused"] else {"foreach": False}
        opt = torch.optim.AdamW(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                eps=hp["eps"], weight_decay=hp["weight_decay"], **fused)
    elif reference == "torch.optim.Muon":
        opt = torch.optim.Muon(params, lr=hp["lr"], weight_decay=hp["weight_decay"],
                               momentum=hp["momentum"], nesterov=hp["nesterov"],
                               ns_coefficients=hp["coefficients"], eps=hp["eps"],
                               ns_steps=hp["ns_steps"], adjust_lr_fn=hp["scale_rule"])
    bufs = [torch.zeros_like(p) for p in params]
    after = {n: [] for n in names}
    for s in range(steps):
        lr = hp["lr"] * lr_factors[s]
        with torch.no_grad():
            for n, p in zip(names, params):
                # The C++ optimizers multiply the gradient by the step's scale (clipping) first.
                g = grads[n][s].to(device)
                p.grad = g * grad_scales[s] if grad_scales[s] != 1.0 else g.clone()
            if opt is not None:
                opt.param_groups[0]["lr"] = lr
                opt.step()
            else:
                for n, p, buf in zip(names, params, bufs):
                    muon_step(p.data, p.grad, buf, hp, lr, case["splits"].get(n))
        for n, p in zip(names, params):
            after[n].append(p.detach().cpu().clone())
    state = {}
    for n, p, buf in zip(names, params, bufs):
        if reference == "torch.optim.AdamW":
            st = opt.state[p]
            state[n] = {"exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"],
                        "step": torch.tensor(float(st["step"]), dtype=torch.float64)}
        elif reference == "torch.optim.Muon":
            state[n] = {"momentum_buffer": opt.state[p]["momentum_buffer"]}
        else:
            state[n] = {"momentum_buffer": buf}
    return after, state


class Writer:
    def __init__(self):
        self.records = []

    def tensor(self, name, t):
        t = t.detach().contiguous().cpu()
        codes = {torch.float32: 0, torch.float64: 1, torch.int64: 3}
        if t.dtype not in codes:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        self.records.append((name, codes[t.dtype], list(t.shape), t.numpy().tobytes()))

    def floats(self, name, values):
        self.tensor(name, torch.tensor(values, dtype=torch.float64))

    def text(self, name, s):
        b = s.encode("utf-8")
        self.records.append((name, 2, [len(b)], b))

    def write(self, path):
        out = [b"OSREF1\0\0", struct.pack("<I", len(self.records))]
        for name, code, dims, data in self.records:
            nb = name.encode("utf-8")
            out.append(struct.pack("<I", len(nb)) + nb + struct.pack("<BI", code, len(dims)))
            out.append(struct.pack("<%dq" % len(dims), *dims))
            out.append(data)
        with open(path, "wb") as f:
            f.write(b"".join(out))


def hp_vector(case):
    hp = case["hp"]
    if case["optimizer"] == "adamw":
        return [hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"],
                1.0 if hp["fused"] else 0.0]
    rule = {"original": 0.0, "match_rms_adamw": 1.0, "spectral": 2.0}[hp["scale_rule"]]
    return [hp["lr"], hp["weight_decay"], hp["momentum"], 1.0 if hp["nesterov"] else 0.0, rule,
            hp["extra_scale"], float(hp["ns_steps"]), *schedule(hp)[0], hp["eps"],
            0.0 if hp["ns_dtype"] == "bf16" else 1.0, hp["norm_scale"], float(len(schedule(hp))),
            *[x for triple in schedule(hp) for x in triple], 1.0 if hp["cycle"] else 0.0]


def check_polar_express_table():
    """The published table is what it claims: on a random matrix, its five iterations land much
    closer to the polar factor U V^T (from an SVD in fp64) than the fixed quintic's five do, whose
    singular values are known to oscillate in about [0.7, 1.2]. A mistyped coefficient breaks this."""
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh
    def err(**hp):
        hp = dict(MUON_DEFAULTS, ns_dtype="fp32", **hp)
        return (newton_schulz(g.float(), hp).double() - polar).norm() / polar.norm()
    pe, quintic = err(coefficients=POLAR_EXPRESS, norm_scale=1.02), err()
    if not (pe < 0.5 * quintic and pe < 0.1):
        sys.exit(f"torch_oracle.py: Polar Express error {pe:.3g} vs quintic {quintic:.3g}")


def check_megatron_tables():
    """quintic (5 iterations) and aol (4) orthogonalise: on a random full-rank matrix every singular
    value of the fp64 iteration's output is the composed quintic of the input's and lies in the
    table's band over [0.02, 0.8] (quintic [0.9777, 1.0318], aol [0.9873, 1.0820]), far inside the
    fixed quintic's [0.68, 1.13]. A mistyped or reordered coefficient moves them out."""
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    s_in = torch.linalg.svdvals(g) / g.norm()
    for table, steps, low, high in ((QUINTIC, 5, 0.9777, 1.0318), (AOL, 4, 0.9873, 1.0820)):
        hp = dict(MUON_DEFAULTS, coefficients=table, cycle=True, ns_steps=steps)
        x = g / g.norm()
        for i in range(steps):
            a, b, c = table[i % len(table)]
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        s_out = torch.linalg.svdvals(x)
        composed = s_in.clone()
        for i in range(steps):
            a, b, c = table[i % len(table)]
            composed = a * composed + b * composed ** 3 + c * composed ** 5
        # The composition is not monotonic: compare the sorted values.
        composed = composed.sort(descending=True).values
        if not (torch.allclose(s_out, composed, rtol=0, atol=1e-9)
                and low <= s_out.min() and s_out.max() <= high):
            sys.exit(f"torch_oracle.py: {hp['ns_steps']} iterations of {table} give singular "
                     f"values in [{s_out.min():.4f}, {s_out.max():.4f}], expected [{low}, {high}]")


def equal_trajectories(a, b):
    return all(torch.equal(x, y) for n in a for x, y in zip(a[n], b[n]))


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--device=cuda"):
        sys.exit("usage: torch_oracle.py OUTPUT.osref [--device=cuda]")
    device = torch.device("cuda:0" if len(sys.argv) == 3 else "cpu")
    torch.set_num_threads(1)
    check_polar_express_table()
    check_megatron_tables()
    w = Writer()
    w.text("meta/torch_version", torch.__version__)
    w.text("meta/cpu_capability", torch.backends.cpu.get_cpu_capability())
    w.text("cases", "\n".join(c["name"] for c in CASES))
    for index, case in enumerate(CASES):
        name, steps = case["name"], case["steps"]
        init, grads = inputs(case, 1000 + index)
        after, state = run(case, init, grads, case["reference"], device)
        if case["reference"] == "torch.optim.Muon":
            # The Python Muon reference must be torch's, bit for bit, wherever torch can run it.
            mine, _ = run(case, init, grads, "python.muon", device)
            if not equal_trajectories(after, mine):
                sys.exit(f"{name}: torch_oracle.py's muon_step differs from torch.optim.Muon")
        w.text(f"{name}/optimizer", case["optimizer"])
        w.text(f"{name}/reference", case["reference"])
        w.floats(f"{name}/hp", hp_vector(case))
        w.floats(f"{name}/lr_factors", case["lr_factors"] or [1.0] * steps)
        w.floats(f"{name}/grad_scales", case["grad_scales"] or [1.0] * steps)
        w.tensor(f"{name}/resume_after", torch.tensor(steps // 2, dtype=torch.int64))
        w.text(f"{name}/params", "\n".join(case["shapes"]))
        for n in case["shapes"]:
            if n in case["splits"]:
                groups, rows = case["splits"][n]
                w.tensor(f"{name}/{n}/split", torch.tensor([groups, *rows], dtype=torch.int64))
            w.tensor(f"{name}/{n}/init", init[n])
            for s in range(steps):
                w.tensor(f"{name}/{n}/grad/{s}", grads[n][s])
                w.tensor(f"{name}/{n}/after/{s}", after[n][s])
            for field, t in state[n].items():
                w.tensor(f"{name}/{n}/state/{field}", t)
    w.write(sys.argv[1])
    print(f"torch_oracle.py: {len(CASES)} cases from torch {torch.__version__} on {device} "
          f"(ATen CPU capability {torch.backends.cpu.get_cpu_capability()})")


if __name__ == "__main__":
    main()
