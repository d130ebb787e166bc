"""Mixture-of-experts benchmark (BENCHMARKS.md section "moe"): what layer-wise Muon on whole experts
costs against AdamW on them, the all-to-all's wire bytes, the experts' memory per rank and how the
Newton–Schulz work spreads, and MoE-small's training quality against the dense `small`.

    tools/python3 bench/moe_bench.py --pretrain=bazel-bin/integration/pretrain [--quick]

or through the report: `bazel run //bench:report -- --only=moe`. Prints the section's markdown.
Timing figures are ratios of runs made back to back in the same repeat (in alternating order), as
the rest of the report, because this machine is shared and noisy.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys

# moe-small (gpt_config.cc): 4 layers, C 256, 8 experts of F_e 352, top-2; small: F 704.
MOE_SMALL = {"layers": 4, "hidden": 256, "experts": 8, "top_k": 2, "ffn": 352}
# fp32 Newton–Schulz (a CPU without bf16 arithmetic would measure its bf16 GEMMs instead), the
# final eval on one batch only, the checksum compared at the end only: the steps are what is timed.
COMMON = ["--model=moe-small", "--muon_ns_dtype=fp32", "--eval_every=0", "--eval_batches=1",
          "--check_every=0", "--num_threads=1"]
# (ranks, ep): ep 2 on 2 ranks (expt_dp 1), and 2 (ep) x 2 (expt_dp) on 4.
GRIDS = [(2, 2), (4, 2)]
EXPERT_OPTIMIZERS = {"muon": [], "adamw": ["--route=*experts*=adamw"]}


def run(pretrain, args, timeout=1800):
    """(summary dict, stdout) of one pretrain run."""
    print(f"[moe_bench] {pretrain} {' '.join(args)}", file=sys.stderr, flush=True)
    proc = subprocess.run([pretrain] + args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"pretrain exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def uniform_ideal_bytes(ranks, ep, global_batch, seq_len):
    """Bytes one rank must send per step if routing were uniform: in every layer each of its N
    tokens' k copies lands on a remote ep rank with probability (ep - 1) / ep, and every such row
    of C fp32 values crosses four times (dispatch and combine, forward and backward)."""
    n = global_batch // ranks * seq_len
    m = MOE_SMALL
    return m["layers"] * 4 * n * m["top_k"] * (ep - 1) / ep * m["hidden"] * 4


def expert_bytes_whole():
    """fp32 bytes of every expert's fc1 [2F_e, C] and fc2 [C, F_e] over all layers."""
    m = MOE_SMALL
    return m["layers"] * m["experts"] * 3 * m["ffn"] * m["hidden"] * 4


# Tokens per step: Newton–Schulz costs the same per step at any batch while the model's compute
# grows with it, so the ratio is shown at two: 8 and 32 samples (4 micro-batches of 8) of 256.
BATCHES = [(8, 1), (32, 4)]


def measure_grids(pretrain, quick, repeats):
    seq = 256
    rows = []
    for (ranks, ep), (batch, micro) in [(g, b) for g in GRIDS for b in BATCHES]:
        steps = [f"--steps={3 if quick else 6}", f"--global_batch={batch}",
                 f"--micro_batches={micro}"]
        ratios, muon_runs, adamw_steps = [], [], []
        for rep in range(repeats):
            order = list(EXPERT_OPTIMIZERS.items())
            if rep % 2:
                order.reverse()
            got = {}
            for name, flags in order:
                got[name], _ = run(pretrain, COMMON + steps + flags + [
                    f"--nproc_per_node={ranks}", f"--ep={ep}", "--dist=layerwise"])
            ratios.append(got["muon"]["step_s"] / got["adamw"]["step_s"])
            muon_runs.append(got["muon"])
            adamw_steps.append(got["adamw"]["step_s"])
        m = muon_runs[-1]
        memory = m["memory"]
        whole = expert_bytes_whole()
        ns = [r["ns_cost"] for r in memory]
        rows.append({
            "grid": f"{ranks} ranks = ep {ep} × expt_dp {ranks // ep}, batch {batch}",
            "ratio": ratios,
            "muon_step_s": statistics.median(r["step_s"] for r in muon_runs),
            "adamw_step_s": statistics.median(adamw_steps),
            "a2a_wire_MB": m["all_to_all_wire_bytes_per_step"] / 1e6,
            "a2a_ideal_MB": uniform_ideal_bytes(ranks, ep, batch, seq) / 1e6,
            "a2a_logical_MB": m["all_to_all_bytes_per_step"] / 1e6,
            "expert_params": max(r["expert_params_bytes"] for r in memory) / (whole / ep),
            "expert_grads": max(r["expert_grads_bytes"] for r in memory) / (whole / ep),
            "expert_state": max(r["expert_state_bytes"] for r in memory) / (whole / ranks),
            "ns_balance": max(ns) / (sum(ns) / len(ns)) if sum(ns) else 0,
            "load": (min(m["expert_load_min"]), max(m["expert_load_max"])),
        })
    return rows, [f"--steps={3 if quick else 6}"]


def eval_curve(stdout):
    """[(step, eval loss)] from the log's 'eval step N: loss X' lines."""
    return [(int(s), float(v)) for s, v in re.findall(r"eval step (\d+): loss ([0-9.]+)", stdout)]


def measure_quality(pretrain, quick):
    steps = 20 if quick else 200
    every = 5 if quick else 25
    shared = [f"--steps={steps}", f"--eval_every={every}", "--eval_batches=4", "--global_batch=8",
              "--nproc_per_node=2", "--muon_ns_dtype=fp32", "--num_threads=1", "--check_every=0"]
    curves = {}
    for model, extra in (("small", []), ("moe-small", ["--ep=2"])):
        summary, out = run(pretrain, shared + [f"--model={model}"] + extra)
        curves[model] = (eval_curve(out), summary)
    return curves, shared


def cell(values, digits=3):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}–{max(values):.{digits}f})")


def render(rows, grid_steps, curves, quality_args, repeats):
    md = ["MoE-small (4 layers, C 256, 8 experts of F_e 352, top-2) with `--dist=layerwise`, "
          f"fp32 Newton–Schulz, 1 thread per rank, {' '.join(grid_steps)}, batch × 256 tokens per "
          "step (batch 32 as 4 micro-batches of 8). "
          "*Muon/AdamW on experts*: step time with every expert matrix a whole Muon matrix owned "
          "by one expt_dp rank over the same run with `--route='*experts*=adamw'` (Megatron's "
          "layer-wise optimizer falls back to AdamW for experts), back to back in each of "
          f"{repeats} repeat(s), median (range) of the per-repeat ratios; goal ≤ 1.1. "
          "*all-to-all*: bytes rank 0 sent to other ranks per step (dispatch and combine, "
          "forward and backward, the per-expert counts), against a uniform router's ideal "
          "(4 × N k (ep−1)/ep rows of C fp32); *expert memory*: the most any rank holds over "
          "whole/ep for params and grads, over whole/world for Muon's state (each expert's "
          "momentum on one owner); goal ≤ 1.05. *NS balance*: the largest rank's "
          "Newton–Schulz cost (Σ max·min² over its Muon matrices) over the mean.", "",
          "| grid | Muon/AdamW on experts | Muon step s | AdamW step s | all-to-all MB sent "
          "(uniform ideal) | expert params / grads / state vs ideal | NS balance | expert load "
          "min–max |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['grid']} | {cell(r['ratio'])} | {r['muon_step_s']:.3f} | "
                  f"{r['adamw_step_s']:.3f} | {r['a2a_wire_MB']:.2f} ({r['a2a_ideal_MB']:.2f}) | "
                  f"{r['expert_params']:.3f} / {r['expert_grads']:.3f} / {r['expert_state']:.3f} |"
                  f" {r['ns_balance']:.3f} | {r['load'][0]:.2f}–{r['load'][1]:.2f} |")
    md += ["", "Training quality: the dense `small` against MoE-small (the same attention; 2 "
           "experts of F_e 352 active per token = small's F 704, so the same FLOPs per token) on "
           f"the same tokens, 2 ranks (MoE at ep 2): `{' '.join(quality_args)}`. Eval loss:", ""]
    small, moe = curves["small"][0], curves["moe-small"][0]
    md += ["| step | small | moe-small |", "|---|---|---|"]
    moe_at = dict(moe)
    for step, loss in small:
        other = moe_at.get(step)
        md.append(f"| {step} | {loss:.4f} | {other:.4f} |" if other is not None
                  else f"| {step} | {loss:.4f} | — |")
    s_sum, m_sum = curves["small"][1], curves["moe-small"][1]
    md += ["", f"Final eval loss: small {s_sum['eval_loss']:.4f}, moe-small "
           f"{m_sum['eval_loss']:.4f} (params: small {s_sum['num_params']:,}, moe-small "
           f"{m_sum['num_params']:,}); step time small {s_sum['step_s']:.3f} s, moe-small "
           f"{m_sum['step_s']:.3f} s.", ""]
    return "\n".join(md)


def section(pretrain, quick, repeats):
    rows, grid_steps = measure_grids(pretrain, quick, repeats)
    curves, quality_args = measure_quality(pretrain, quick)
    return render(rows, grid_steps, curves, quality_args, repeats)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pretrain", default="bazel-bin/integration/pretrain")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None, help="default 3, or 1 with --quick")
    a = p.parse_args()
    print(section(a.pretrain, a.quick, a.repeats or (1 if a.quick else 3)))


if __name__ == "__main__":
    main()
