"""Tensor-parallel benchmark (BENCHMARKS.md section "tp"): what owner-mode Muon saves over
Megatron's duplicated mode on the optimizer step, what tensor parallelism costs against data
parallelism on this CPU, and how the params, grads and optimizer state split per rank.

    tools/python3 bench/tp_bench.py --pretrain=bazel-bin/integration/pretrain \
        --tp_muon=bazel-bin/optimizers/distributed/tp_muon_benchmark [--quick]

or through the report: `bazel run //bench:report -- --only=tp`. Prints the section's markdown.
Timing figures are ratios of runs made back to back in the same repeat (in alternating order), as
the rest of the report, because this machine is shared and noisy.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys

# The optimizer benchmark's lines, as the launcher prefixes them: "[rank 0] owner      step median
# 5734.1 ms (min ..., max ...), rank 0 thread CPU median 5134.0 ms, ns_cost rank 0 3.26e+10 rank 1
# 3.26e+10  owner/duplicated ...".
MODE_LINE = re.compile(r"^(?:\[rank \d+\] )?(owner|duplicated|blockwise)\s+step median\s+"
                       r"([0-9.]+) ms \(min\s+([0-9.]+), max\s+([0-9.]+)\), rank 0 thread CPU "
                       r"median\s+([0-9.]+) ms, ns_cost rank 0 ([0-9.e+]+) rank 1 ([0-9.e+]+)")

# The pretrain comparisons: fp32 Newton–Schulz (a CPU without bf16 arithmetic would measure its
# bf16 GEMMs instead), one thread per rank, the final eval on one batch, no checksum checks.
# small's max_seq_len (model/gpt_config.cc), the sequence length of every sample.
SEQ_LEN = 256
COMMON = ["--muon_ns_dtype=fp32", "--eval_every=0", "--eval_batches=1", "--check_every=0",
          "--num_threads=1", "--nproc_per_node=2"]


def run(binary, args, timeout=3600):
    """stdout of one run of `binary`."""
    print(f"[tp_bench] {binary} {' '.join(args)}", file=sys.stderr, flush=True)
    proc = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return proc.stdout


def parse_tp_muon(text):
    """{mode: {median_ms, min_ms, max_ms, cpu_ms, ns_cost: [rank 0, rank 1]}} of the optimizer
    benchmark's output."""
    modes = {}
    for line in text.splitlines():
        m = MODE_LINE.match(line.strip())
        if m:
            modes[m.group(1)] = {"median_ms": float(m.group(2)), "min_ms": float(m.group(3)),
                                 "max_ms": float(m.group(4)), "cpu_ms": float(m.group(5)),
                                 "ns_cost": [float(m.group(6)), float(m.group(7))]}
    missing = {"owner", "duplicated", "blockwise"} - set(modes)
    if missing:
        raise ValueError(f"tp_muon_benchmark printed no line for {sorted(missing)}: {text[-800:]}")
    return modes


def summary_of(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def measure_grid(pretrain, model, batch, steps, repeats):
    """tp 2 x dp 1 against tp 1 x dp 2 on 2 ranks, and owner against duplicated at tp 2, on
    `model` with `batch` samples per step: per-repeat step-time ratios and the last runs'
    summaries."""
    runs = {"dp2": ["--tp=1"], "tp2": ["--tp=2"],
            "tp2_duplicated": ["--tp=2", "--muon_tp_mode=duplicated"]}
    ratios = {"tp/dp": [], "optimizer owner/duplicated": []}
    last = {}
    for rep in range(repeats):
        order = list(runs.items())
        if rep % 2:
            order.reverse()
        got = {}
        for name, flags in order:
            got[name] = summary_of(run(pretrain, COMMON + flags + [
                f"--model={model}", f"--global_batch={batch}", f"--steps={steps}"]))
        ratios["tp/dp"].append(got["tp2"]["step_s"] / got["dp2"]["step_s"])
        ratios["optimizer owner/duplicated"].append(
            got["tp2"]["optimizer_s"] / got["tp2_duplicated"]["optimizer_s"])
        last = got
    return ratios, last


def memory_rows(summaries, whole_params):
    """(what, tp 2 bytes, dp 2 bytes, whole bytes) per rank for params, grads and optimizer state,
    the most any rank holds. Whole: every fp32 param (params, grads) once, and every param's state
    once (the dp 2 ranks' states added: the layer-wise layout keeps each on one owner)."""
    whole_state = sum(r["optimizer_state_bytes"] for r in summaries["dp2"]["memory"])
    rows = []
    for key, whole in (("params_bytes", whole_params * 4), ("grads_bytes", whole_params * 4),
                       ("optimizer_state_bytes", whole_state)):
        tp = max(r[key] for r in summaries["tp2"]["memory"])
        dp = max(r[key] for r in summaries["dp2"]["memory"])
        rows.append((key.replace("_bytes", "").replace("_", " "), tp, dp, whole))
    return rows


def cell(values, digits=3):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}–{max(values):.{digits}f})")


def render(tp_muon, reps, grid, repeats, model, batch, steps, whole_params):
    owner, dup, block = tp_muon["owner"], tp_muon["duplicated"], tp_muon["blockwise"]
    ns = owner["ns_cost"]
    md = ["**Optimizer step, gpt2-124m's matrices at tp 2** "
          "(`//optimizers/distributed:tp_muon_benchmark`: 12 layers of qkv [1152, 768], proj "
          "[768, 384], fc1 [2048, 768] (gate and up halves), fc2 [768, 1024] per tp rank, 2 Gloo "
          f"ranks as tp 2 × dp 1, 1 thread each, bf16 Newton–Schulz, {reps} interleaved "
          "repetitions of one step per mode; goal owner/duplicated ≤ 0.55, ideal 0.5):", "",
          "| mode | step median ms (min–max) | rank 0 thread CPU ms | Newton–Schulz cost per "
          "rank (Σ max·min²) |", "|---|---|---|---|"]
    for name, m in (("owner", owner), ("duplicated", dup), ("blockwise", block)):
        md.append(f"| {name} | {m['median_ms']:.0f} ({m['min_ms']:.0f}–{m['max_ms']:.0f}) | "
                  f"{m['cpu_ms']:.0f} | {m['ns_cost'][0]:.3g} / {m['ns_cost'][1]:.3g} |")
    md += ["", f"owner / duplicated: **{owner['median_ms'] / dup['median_ms']:.3f}** on the "
           f"medians, {owner['min_ms'] / dup['min_ms']:.3f} on the minimums, "
           f"{owner['cpu_ms'] / dup['cpu_ms']:.3f} on rank 0's CPU time; owner's Newton–Schulz "
           f"cost is {max(ns) / (sum(ns) / 2):.4f} of the mean on the busier rank. `blockwise` "
           "is cheapest (each slice on its own, no exchange) but is another update, one that "
           "changes with tp.", ""]
    ratios, summaries = grid
    md += [f"**Tensor vs data parallelism on 2 CPU ranks** (`{model}`, {batch} samples × "
           f"{SEQ_LEN} tokens per step, {steps} steps, "
           f"`{' '.join(COMMON)}`; {repeats} repeat(s) in alternating order, median (range) of "
           "the per-repeat ratios):", "",
           "| measure | ratio |", "|---|---|",
           f"| step time, tp 2 × dp 1 / tp 1 × dp 2 | {cell(ratios['tp/dp'])} |",
           f"| optimizer time at tp 2, owner / duplicated | "
           f"{cell(ratios['optimizer owner/duplicated'])} |", "",
           "Per-rank memory (the most any rank holds, padding included; whole: every param, "
           "grad and state tensor once):", "",
           "| bytes per rank | tp 2 × dp 1 | tp 1 × dp 2 (layerwise) | whole | "
           "tp 2 / (whole / 2) |",
           "|---|---|---|---|---|"]
    for name, tp, dp, whole in memory_rows(summaries, whole_params):
        md.append(f"| {name} | {tp:,} | {dp:,} | {whole:,} | {tp / (whole / 2):.3f} |")
    md += ["", "At tp 2 each rank holds its slices of the split matrices and embedding and the "
           "(small) norms whole; layer-wise dp 2 holds whole params and grads and each param's "
           "state on one owner.", ""]
    return "\n".join(md)


def section(pretrain, tp_muon, quick, repeats):
    reps = 2 if quick else 5
    text = run(tp_muon, [str(reps)] + (["4"] if quick else []))
    modes = parse_tp_muon(text)
    model, batch, steps = "small", 8, 3 if quick else 6
    grid = measure_grid(pretrain, model, batch, steps, repeats)
    whole_params = grid[1]["dp2"]["num_params"]
    return render(modes, reps, grid, repeats, model, batch, steps, whole_params)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pretrain", default="bazel-bin/integration/pretrain")
    p.add_argument("--tp_muon", default="bazel-bin/optimizers/distributed/tp_muon_benchmark")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None, help="default 3, or 1 with --quick")
    a = p.parse_args()
    print(section(a.pretrain, a.tp_muon, a.quick, a.repeats or (1 if a.quick else 3)))


if __name__ == "__main__":
    main()
