"""Per-call rounding of Muon's fp32 Newton-Schulz: the direct form against the Gram form.

Mirrors optimizers/muon.cc op for op (NewtonSchulzInPlace's normalisation, NsIterateDirect,
NsIterateGram with its restart every kGramRestart = 5 steps) with torch.optim.Muon's coefficients
and 5 steps, and runs each form in fp32 and in fp64 on the same input. Prints, per MLP-shaped
matrix and singular-value spectrum, max |X_fp32 - X_fp64| over the elements for either form (the
iterate's entries are O(1/sqrt(short side))) and their ratio. Momentum matrices in training have
decaying spectra (many small singular values), where the Gram form's accumulated polynomial Q
amplifies its rounding; a Gaussian matrix (flat spectrum) shows no difference.

  tools/python3 bench/ns_rounding.py        (about 20 s on one core)
"""
import torch

A, B, C = 3.4445, -4.7750, 2.0315  # torch.optim.Muon's (a, b, c)
STEPS = 5
GRAM_RESTART = 5                   # optimizers/muon.h kGramRestart


def normalise(g):
    x = g.t() if g.size(0) > g.size(1) else g
    return x / torch.clamp(torch.linalg.vector_norm(x), min=1e-7)


def direct(x):
    for _ in range(STEPS):
        a = x @ x.t()                                  # A = X X^T
        b = torch.addmm(a, a, a, beta=B, alpha=C)      # b A + c A^2
        x = torch.addmm(x, b, x, beta=A, alpha=1.0)    # a X + (b A + c A^2) X
    return x


def gram(x):
    g = x @ x.t()                                      # A_0
    q = None                                           # Q (None: the identity)
    for i in range(STEPS):
        if i > 0 and i % GRAM_RESTART == 0:
            x, q = q @ x, None
            g = x @ x.t()
        p = torch.addmm(g, g, g, beta=B, alpha=C)
        p.diagonal().add_(A)                           # p(A) = a I + b A + c A^2
        q = p if q is None else p @ q
        if i + 1 < STEPS and (i + 1) % GRAM_RESTART != 0:
            g = p @ (p @ g)                            # A_{k+1} = p(A) A p(A)
    return q @ x


def matrix(rows, cols, decay):
    """A [rows, cols] matrix with singular values i^-decay (decay 0: Gaussian)."""
    if decay == 0:
        return torch.randn(rows, cols, dtype=torch.float64)
    u, _ = torch.linalg.qr(torch.randn(rows, cols, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, dtype=torch.float64))
    s = torch.arange(1, cols + 1, dtype=torch.float64) ** -decay
    return u @ torch.diag(s) @ v.t()


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}")
    for rows, cols in [(512, 128), (1024, 256), (3072, 768)]:
        for decay in [0, 0.5, 1.0, 2.0]:
            x64 = normalise(matrix(rows, cols, decay))
            x32 = x64.float()
            d = (direct(x32).double() - direct(x64)).abs().max().item()
            r = (gram(x32).double() - gram(x64)).abs().max().item()
            name = "gaussian" if decay == 0 else f"s_i = i^-{decay}"
            print(f"[{rows}, {cols}] {name:12}: direct {d:.1e}  gram {r:.1e}  ratio {r / d:5.1f}")


if __name__ == "__main__":
    main()
