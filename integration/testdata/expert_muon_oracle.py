"""torch.optim.Muon over the expert matrices that //integration:moe_optimizer_test's ranks updated.

usage: expert_muon_oracle.py RANK_FILE.pt [RANK_FILE.pt ...]

Each file (torch::pickle_save of a dict, one per rank) holds, for every expert matrix the rank
owns, "<name>/before" (the param entering step 1), "<name>/grad" (the gradient the optimizer read:
the data-parallel mean after the grad sync) and "<name>/after" (the param after the step), and
"<name>/blocks" (int64 rows of its fused blocks, orthogonalised separately: fc1's gate and up; one
block for fc2), plus "hyper": lr (the base lr x the step's schedule factor), weight decay,
momentum, nesterov, eps, Newton-Schulz steps and its three coefficients.

Each block goes through a fresh torch.optim.Muon (torch 2.11, the same libtorch_cpu.so as the
test, one thread: bitwise comparable on any CPU, as optimizers/oracle_test.cc explains) for one
step with that gradient; the result must equal "after" bit for bit. Exit 1 naming the first block
that differs, else print one line per file.
"""

import os
import sys

import torch
import torch.jit._pickle


def main():
    torch.set_num_threads(1)
    for path in sys.argv[1:]:
        # torch::pickle_save tags the dict's types with this function (a known, safe global).
        with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
            records = torch.load(path)
        label = os.path.basename(path)
        lr, wd, momentum, nesterov, eps, ns_steps, a, b, c = records["hyper"].tolist()
        names = sorted(k[: -len("/before")] for k in records if k.endswith("/before"))
        blocks_checked = 0
        for name in names:
            before, grad, after = (records[f"{name}/{f}"] for f in ("before", "grad", "after"))
            rows = records[f"{name}/blocks"].tolist()
            assert sum(rows) == before.shape[0], (name, rows, before.shape)
            start = 0
            for i, n in enumerate(rows):
                p = torch.nn.Parameter(before[start:start + n].clone())
                p.grad = grad[start:start + n].clone()
                opt = torch.optim.Muon([p], lr=lr, weight_decay=wd, momentum=momentum,
                                       nesterov=bool(nesterov), ns_coefficients=(a, b, c),
                                       eps=eps, ns_steps=int(ns_steps), adjust_lr_fn="original")
                opt.step()
                want = after[start:start + n]
                if not torch.equal(p.detach(), want):
                    diff = (p.detach() - want).abs().max().item()
                    print(f"{label}: {name} block {i} (rows {start}..{start + n}) differs from "
                          f"torch.optim.Muon: max |diff| {diff}")
                    sys.exit(1)
                if torch.equal(before[start:start + n], want):
                    print(f"{label}: {name} block {i} did not move")
                    sys.exit(1)
                start += n
                blocks_checked += 1
        print(f"{label}: {len(names)} expert matrices ({blocks_checked} blocks) bitwise equal to "
              f"torch.optim.Muon")


if __name__ == "__main__":
    main()
