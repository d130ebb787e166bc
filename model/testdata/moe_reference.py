"""The PyTorch reference that //model:moe_test compares model/moe.cc's MoeMlp with, computed live.

usage: moe_reference.py OUTPUT.pt

For each case (below) the script draws the inputs (the MLP input m [B, T, C], the router, the
experts' fc1 = [gate; up] and fc2, optionally a shared expert and its gate, and an upstream
gradient dy), computes the reference and writes everything with torch.save as one flat dict
{"<case>/<name>": tensor} (read back in C++ by torch::pickle_load). The reference is written the
way Hugging Face's MixtralSparseMoeBlock (transformers/models/mixtral/modeling_mixtral.py) and
Qwen2MoeSparseMoeBlock are, independently of moe.cc: a loop over experts, each taking the tokens
that chose it (torch.where on a one-hot expert mask, ordered by choice then token; moe.cc sorts
the token copies by expert, then token, then choice, and runs one grouped pass), weighted by the
renormalised top-k router probabilities and scattered back with index_add_.

What the C++ test checks with these records:
  <case>/top_experts    [N, k] int64: the routing decisions, which must match exactly. The router
                        is the same fp32 op as moe.cc's (F.linear of the fp32 input; softmax; topk),
                        so the logits are the same bits; the gap between the k-th and the (k+1)-th
                        probability is printed to show no decision is a near tie.
  <case>/out64          the MLP output in fp64 with those routing decisions (the exact value up to
                        fp64 rounding, ~1e-16 relative);
  <case>/out_bound      per element, a first-order bound on |fp32 result - exact| for ANY fp32
                        evaluation of the same formulas (derivation at forward_error_bound); the
                        C++ fp32 output must lie within it;
  <case>/out_hf32       this script's fp32 evaluation (informational: printed distance to out64
                        in units of the bound, and whether moe.cc's fp32 output equals it bitwise);
  <case>/load_balance64, <case>/z_loss64 with <case>/load_balance_bound, <case>/z_loss_bound: the
                        auxiliary losses E * sum_e f_e P_e and mean_t logsumexp(z_t)^2 in fp64
                        from the fp32 routing counts, and bounds on the fp32 error;
  <case>/grad/<name>    the gradients of (out * dy).sum() + alpha * load_balance + beta * z_loss
                        with respect to m and every weight, in fp64 (the experts, the shared expert
                        and its gate in fp64; the router in fp32 as moe.cc computes it for fp64
                        params), for the C++ fp64 run.
"""

import math
import sys

import torch
import torch.nn.functional as F

U32 = 2.0 ** -24  # fp32 unit roundoff


def gamma(n):
    """Higham's gamma_n = n u / (1 - n u): a sum or dot product of n terms, in any order, is within
    gamma_n * sum |terms| of the exact value (Accuracy and Stability of Numerical Algorithms,
    3.1)."""
    return n * U32 / (1 - n * U32)


CASES = {
    # Mixtral's shape at toy size: 8 experts, top-2.
    "mixtral": dict(B=2, T=37, C=32, E=8, k=2, F=24, Fs=0, seed=11),
    # Qwen2-MoE's: plus a shared expert under a sigmoid gate.
    "shared": dict(B=2, T=37, C=32, E=8, k=2, F=24, Fs=16, seed=12),
    # Three of four experts per token (renormalisation over k > 2).
    "top3": dict(B=3, T=19, C=16, E=4, k=3, F=20, Fs=8, seed=13),
}
ALPHA, BETA = 0.37, 0.11  # aux-loss weights in the gradient objective (any non-zero values)


def draw(case):
    g = torch.Generator().manual_seed(case["seed"])
    C, E, Fe, Fs = case["C"], case["E"], case["F"], case["Fs"]

    def randn(*shape, std):
        return torch.randn(*shape, generator=g) * std

    w = dict(
        m=randn(case["B"], case["T"], C, std=1.0),
        router=randn(E, C, std=2.0 / math.sqrt(C)),
        fc1=randn(E, 2 * Fe, C, std=1.0 / math.sqrt(C)),
        fc2=randn(E, C, Fe, std=1.0 / math.sqrt(Fe)),
        dy=randn(case["B"], case["T"], C, std=1.0).double(),
    )
    if Fs > 0:
        w.update(shared_fc1=randn(2 * Fs, C, std=1.0 / math.sqrt(C)),
                 shared_fc2=randn(C, Fs, std=1.0 / math.sqrt(Fs)),
                 shared_gate=randn(1, C, std=1.0 / math.sqrt(C)))
    return w


def expert(x, fc1, fc2):
    """Mixtral's expert: w2(silu(w1 x) * w3 x) with fc1 = [w1; w3], fc2 = w2."""
    gate, up = fc1.chunk(2, dim=0)
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), fc2)


def route(x32, router32, k):
    """The fp32 routing (as moe.cc): top-k of softmax(x R^T), weights renormalised over the k."""
    logits = F.linear(x32, router32)
    probs = F.softmax(logits, dim=-1, dtype=torch.float)
    top_p, top_e = torch.topk(probs, k, dim=-1)
    return logits, probs, top_p / top_p.sum(dim=-1, keepdim=True), top_e


def sparse_moe(x, w, top_e, weights, E):
    """MixtralSparseMoeBlock's loop: per expert, its tokens, weighted, index_add_ back."""
    out = torch.zeros_like(x)
    mask = F.one_hot(top_e, num_classes=E).permute(2, 1, 0)  # [E, k, N]
    for e in range(E):
        choice, token = torch.where(mask[e])
        y = expert(x[token], w["fc1"][e], w["fc2"][e])
        out.index_add_(0, token, y * weights[token, choice, None].to(x.dtype))
    if "shared_fc1" in w:
        out = out + torch.sigmoid(F.linear(x, w["shared_gate"])) * expert(
            x, w["shared_fc1"], w["shared_fc2"])
    return out


def forward_error_bound(x, w, top_e, weights, logits):
    """Per element of the output, a first-order bound on |fp32 evaluation - exact value|, for any
    order of the sums (every dot product of n terms within gamma_n * sum |terms|), from the exact
    (fp64) operands. For token t and its choice i of expert e, with A = |W| |x| the magnitudes of
    the products:
      gate g, up v (dot products over C):   |dg| <= gamma_C Ag,  |dv| <= gamma_C Av
      s = silu(g) (|silu'| <= 1.1; exp, a division, a product: 4 roundings)
                                            |ds| <= 1.1 |dg| + 4u |s|
      h = s v                               |dh| <= |ds| |v| + |s| |dv| + u |h|
      y = fc2 h (dot product over F)        |dy| <= gamma_F |fc2| |h| + |fc2| |dh|
      router logits z (over C)              |dz| <= gamma_C |R| |x| =: dZ (max over the E logits)
      p = softmax(z): d log p_j = dz_j - sum_l p_l dz_l, so |dp / p| <= 2 dZ, plus exp, the sum
        over E and the division: (E + 4) u
      w_i = p_i / sum of the k:             |dw / w| <= 2 |dp / p| + (k + 1) u
      out = sum_i w_i y_i (k products, k - 1 additions onto a zero):
                                            |dout| <= sum_i (|dw_i| |y_i| + w_i |dy_i|)
                                                      + gamma_k sum_i w_i |y_i|
    and a shared expert adds sigmoid(a) y_s (a = gate x over C; |sigmoid'| <= 1/4; exp, add,
    division: 3 roundings) and one more addition:
      |d| <= (|da| / 4 + 3u sigmoid(a)) |y_s| + sigmoid(a) |dy_s| + u sigmoid(a) |y_s| + u |out|.
    Terms of order u^2 are left out (below 1e-12 relative here)."""
    C = x.shape[-1]
    ax = x.abs()

    def mlp_error(fc1, fc2, rows):
        gate, up = fc1.chunk(2, dim=0)
        g, v = F.linear(rows, gate), F.linear(rows, up)
        ag, av = F.linear(rows.abs(), gate.abs()), F.linear(rows.abs(), up.abs())
        s = F.silu(g)
        ds = 1.1 * gamma(C) * ag + 4 * U32 * s.abs()
        h = s * v
        dh = ds * v.abs() + s.abs() * gamma(C) * av + U32 * h.abs()
        n = fc2.shape[1]
        dy = gamma(n) * F.linear(h.abs(), fc2.abs()) + F.linear(dh, fc2.abs())
        return F.linear(h, fc2), dy

    E, k = w["router"].shape[0], top_e.shape[1]
    dz = gamma(C) * F.linear(ax, w["router"].abs()).max(dim=-1, keepdim=True).values  # [N, 1]
    dw_rel = 2 * (2 * dz + (E + 4) * U32) + (k + 1) * U32  # [N, 1]
    bound = torch.zeros_like(x)
    magnitude = torch.zeros_like(x)
    for i in range(k):
        for e in range(E):
            rows = (top_e[:, i] == e).nonzero().flatten()
            if rows.numel() == 0:
                continue
            y, dy = mlp_error(w["fc1"][e], w["fc2"][e], x[rows])
            wi = weights[rows, i, None]
            bound[rows] += wi * dw_rel[rows] * y.abs() + wi * dy
            magnitude[rows] += wi * y.abs()
    bound += gamma(k) * magnitude
    if "shared_fc1" in w:
        a = F.linear(x, w["shared_gate"])
        da = gamma(C) * F.linear(ax, w["shared_gate"].abs())
        sig = torch.sigmoid(a)
        y_s, dy_s = mlp_error(w["shared_fc1"], w["shared_fc2"], x)
        out = sparse_moe(x, w, top_e, weights, E)
        bound += (da / 4 + 3 * U32 * sig) * y_s.abs() + sig * dy_s + U32 * sig * y_s.abs() \
            + U32 * out.abs()
    return bound


def aux_losses(logits, top_e, E):
    """Switch Transformer's load balance E * sum_e f_e P_e (f_e: the fraction of the N k token
    copies routed to e; P_e: the mean router probability of e) and ST-MoE's z-loss, mean over
    tokens of logsumexp(z)^2, in the dtype of `logits`."""
    N, k = top_e.shape
    counts = torch.bincount(top_e.flatten(), minlength=E)
    fraction = counts.to(logits.dtype) / (N * k)
    load_balance = E * (fraction * F.softmax(logits, dim=-1).mean(dim=0)).sum()
    z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return load_balance, z_loss, counts


def aux_error_bounds(x64, router64, top_e, E):
    """Bounds on |fp32 - exact| of the two aux losses, first order. With dZ the logits' bound (as
    in forward_error_bound) and the probabilities within (2 dZ + (E + 4) u) relative:
      P_e = mean over N (a sum of N terms, one division): |dP_e| <= mean_t p_te (2 dZ_t + (E + 4)
        u) + gamma_(N+1) P_e
      load balance = E sum_e f_e P_e (f_e exact: counts / (N k) of integers below 2^24, one
        rounding; E products, E - 1 additions): |d| <= E sum_e f_e |dP_e| + gamma_(2E + 1) value
      lse_t = max + log(sum exp(z - max)): |dlse| <= dZ_t + (E + 4) u (1 + |lse|)
      z-loss = mean_t lse_t^2: |d| <= mean_t 2 |lse_t| |dlse_t| + gamma_(N+2) value."""
    N, k = top_e.shape
    C = x64.shape[-1]
    logits = F.linear(x64, router64)
    dz = gamma(C) * F.linear(x64.abs(), router64.abs()).max(dim=-1).values  # [N]
    p = F.softmax(logits, dim=-1)
    dp = p * (2 * dz[:, None] + (E + 4) * U32)
    P = p.mean(dim=0)
    dP = dp.mean(dim=0) + gamma(N + 1) * P
    f = torch.bincount(top_e.flatten(), minlength=E).double() / (N * k)
    lb = E * (f * P).sum()
    lb_bound = E * (f * dP).sum() + gamma(2 * E + 1) * lb
    lse = torch.logsumexp(logits, dim=-1)
    dlse = dz + (E + 4) * U32 * (1 + lse.abs())
    z = lse.pow(2).mean()
    z_bound = (2 * lse.abs() * dlse).mean() + gamma(N + 2) * z
    return lb_bound, z_bound


def gradients(w, top_e, E, k):
    """The fp64 gradients of (out * dy).sum() + ALPHA load_balance + BETA z_loss, with the router
    in fp32 as moe.cc computes it for fp64 params (the fp64 input cast to fp32, the weights cast
    back), the experts in fp64."""
    leaves = {name: t.double().requires_grad_(True) for name, t in w.items() if name != "dy"}
    C = leaves["m"].shape[-1]
    x = leaves["m"].reshape(-1, C)
    logits, _, weights, top = route(x.float(), leaves["router"].float(), k)
    assert torch.equal(top, top_e), "fp64 run routed differently"
    out = sparse_moe(x, leaves, top_e, weights.double(), E)
    load_balance, z_loss, _ = aux_losses(logits, top_e, E)
    objective = (out * w["dy"].reshape(-1, C)).sum() + ALPHA * load_balance + BETA * z_loss
    objective.backward()
    return {name: t.grad for name, t in leaves.items()}


def run_case(name, case, records):
    w = draw(case)
    E, k, C = case["E"], case["k"], case["C"]
    x32 = w["m"].reshape(-1, C)
    logits32, probs32, weights32, top_e = route(x32, w["router"], k)
    sorted_p = probs32.sort(dim=-1, descending=True).values
    gap = (sorted_p[:, k - 1] - sorted_p[:, k]).min().item() if k < E else float("inf")

    w32 = {n: t for n, t in w.items() if n not in ("m", "dy")}
    out_hf32 = sparse_moe(x32, w32, top_e, weights32, E)

    w64 = {n: t.double() for n, t in w32.items()}
    x64 = x32.double()
    logits64 = F.linear(x64, w64["router"])
    p64 = F.softmax(logits64, dim=-1).gather(1, top_e)
    weights64 = p64 / p64.sum(dim=-1, keepdim=True)
    out64 = sparse_moe(x64, w64, top_e, weights64, E)
    bound = forward_error_bound(x64, w64, top_e, weights64, logits64)
    ratio = ((out_hf32.double() - out64).abs() / bound).max().item()

    lb64, z64, counts = aux_losses(logits64, top_e, E)
    lb_bound, z_bound = aux_error_bounds(x64, w64["router"], top_e, E)
    lb32, z32, _ = aux_losses(logits32, top_e, E)
    assert abs(lb32.item() - lb64.item()) <= lb_bound.item(), "fp32 load balance outside bound"
    assert abs(z32.item() - z64.item()) <= z_bound.item(), "fp32 z-loss outside bound"
    assert ratio <= 1.0, f"this script's own fp32 output is {ratio} bounds from fp64"

    shape = w["m"].shape
    records.update({
        f"{name}/top_experts": top_e,
        f"{name}/counts": counts,
        f"{name}/out64": out64.reshape(shape),
        f"{name}/out_bound": bound.reshape(shape),
        f"{name}/out_hf32": out_hf32.reshape(shape),
        f"{name}/load_balance64": lb64,
        f"{name}/load_balance_bound": lb_bound,
        f"{name}/z_loss64": z64,
        f"{name}/z_loss_bound": z_bound,
        f"{name}/config": torch.tensor([case["C"], E, k, case["F"], case["Fs"]]),
        f"{name}/coefficients": torch.tensor([ALPHA, BETA], dtype=torch.float64),
    })
    for n, t in w.items():
        records[f"{name}/input/{n}"] = t
    for n, g in gradients(w, top_e, E, k).items():
        records[f"{name}/grad/{n}"] = g
    print(f"{name}: {x32.shape[0]} tokens, top-{k} of {E}, smallest gap between the k-th and next "
          f"probability {gap:.3g}; fp32 reference within {ratio:.3f} of the forward bound")


def main():
    torch.set_num_threads(1)
    records = {}
    for name, case in CASES.items():
        run_case(name, case, records)
    records["cases"] = torch.tensor([len(CASES)])
    torch.save(records, sys.argv[1])


if __name__ == "__main__":
    main()
