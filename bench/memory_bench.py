"""Memory benchmark (BENCHMARKS.md section "memory"): per-rank peak memory against sequence length
with and without activation recompute, `--dist=layerwise` against `--dist=fsdp`, what recompute
costs in step time, and the longest run this machine can train.

    tools/python3 bench/memory_bench.py --pretrain=bazel-bin/integration/pretrain [--quick]

or through the report: `bazel run //bench:report -- --only=memory`. Prints the section's markdown.

Every figure comes from the runs' summary JSON (the last stdout line of pretrain): per rank
`allocator_peak_bytes` (LibTorch's CPU allocator's own count of tensor memory at its peak: params,
grads, optimizer state, fsdp's transients, activations), `max_rss_bytes` (the process's peak
resident memory: the same plus LibTorch's, Gloo's and the C heap's own, about 160 MB here),
`params_bytes + grads_bytes + optimizer_state_bytes` (what the rank keeps between steps) and
`peak_transient_bytes` (fsdp's gathered params and full grads at most at once). Runs are 2 ranks,
one thread each, one sample per rank per step, so the peaks are one sample's activations.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_shapes  # noqa: E402

# One thread per rank, 2 ranks; fp32 Newton–Schulz (a CPU without bf16 arithmetic would time its
# bf16 GEMMs instead); the final eval on one batch and no checksum checks, so the steps dominate.
COMMON = ["--muon_ns_dtype=fp32", "--eval_every=0", "--eval_batches=1", "--check_every=0",
          "--num_threads=1", "--nproc_per_node=2"]
RECOMPUTE = ["none", "selective", "full"]
MB = 1e6


def run(binary, args, log, timeout=7200):
    """(summary dict or None, wall s, exit code, stderr tail) of one run; appends to `log`."""
    print(f"[memory_bench] {binary} {' '.join(args)}", file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - start
    log.append((binary, args, wall, proc.returncode))
    summary = None
    if proc.returncode == 0:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary, wall, proc.returncode, proc.stderr.strip()[-600:]


def row_of(summary):
    """The figures of one run: the most any rank reached, in bytes, and the step time in s."""
    mem = summary["memory"]
    return {
        "allocator_peak": max(m["allocator_peak_bytes"] for m in mem),
        "rss": max(m["max_rss_bytes"] for m in mem),
        "persistent": max(m["params_bytes"] + m["grads_bytes"] + m["optimizer_state_bytes"]
                          for m in mem),
        "transient": max(m["peak_transient_bytes"] for m in mem),
        "step_s": summary["step_s"],
    }


def layer_bytes(model):
    """fp32 params + grads of the two largest neighbouring forward layers of `model` (forward
    layers: the embedding, each block, the head), what fsdp may hold gathered at once on top of its
    shard: the layer computing and the one prefetched. The largest pair is the head (V x C, the
    tied embedding included) and the last block, or the embedding and the first."""
    cfg = gpt_shapes.preset(model)
    C, V = cfg["hidden"], cfg["vocab_size"]
    block = sum(r * c for r, c in gpt_shapes.hidden_matrices(cfg).values()) + 2 * C
    return 8 * (V * C + C + block)


def sweep(pretrain, model, seqs, steps, log, dists=("layerwise", "fsdp"), recompute=RECOMPUTE):
    """{(dist, recompute, seq): row or {"failed": text}} over the grid."""
    out = {}
    for seq in seqs:
        for dist in dists:
            for rc in recompute:
                summary, _, code, err = run(pretrain, COMMON + [
                    f"--model={model}", f"--seq_len={seq}", "--global_batch=2",
                    f"--steps={steps}", f"--dist={dist}", f"--recompute={rc}"], log)
                out[(dist, rc, seq)] = row_of(summary) if summary else {
                    "failed": f"exit {code}: {err.splitlines()[-1] if err else ''}"}
    return out


def time_ratios(pretrain, repeats, log, model="small", steps=6):
    """Per-repeat step-time ratios selective/none and full/none on `model` (layerwise, 8 samples
    per rank), the modes run back to back in alternating order."""
    ratios = {"selective": [], "full": []}
    for rep in range(repeats):
        order = RECOMPUTE if rep % 2 == 0 else list(reversed(RECOMPUTE))
        step = {}
        for rc in order:
            summary, _, code, err = run(pretrain, COMMON + [
                f"--model={model}", "--global_batch=16", f"--steps={steps}",
                f"--recompute={rc}"], log)
            if summary is None:
                raise RuntimeError(f"pretrain --recompute={rc} exited {code}: {err}")
            step[rc] = summary["step_s"]
        for rc in ("selective", "full"):
            ratios[rc].append(step[rc] / step["none"])
    return ratios


def fsdp_vs_layerwise(pretrain, log):
    """{model: {dist: row}} at the settings of section 5 (small: its defaults; gpt2-124m: 64
    tokens, 2 samples per rank)."""
    settings = {"small": ["--global_batch=16", "--steps=3"],
                "gpt2-124m": ["--seq_len=64", "--global_batch=4", "--steps=2"]}
    out = {}
    for model, flags in settings.items():
        out[model] = {}
        for dist in ("layerwise", "fsdp"):
            summary, _, code, err = run(pretrain, COMMON + [f"--model={model}", f"--dist={dist}"]
                                        + flags, log)
            if summary is None:
                raise RuntimeError(f"pretrain --model={model} --dist={dist} exited {code}: {err}")
            out[model][dist] = row_of(summary)
    return out


def cell(values, digits=2):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}–{max(values):.{digits}f})")


def fsdp_bound(grid, model, seq, rc):
    """(fsdp allocator peak, bound) where bound = fsdp's persistent bytes + the two largest forward
    layers' params and grads + the activations, taken as layerwise's allocator peak minus its
    persistent bytes at the same recompute and length (layerwise holds nothing transient but
    activations and the optimizer step's temporaries). None when a run is missing."""
    f, l = grid.get(("fsdp", rc, seq)), grid.get(("layerwise", rc, seq))
    if not f or not l or "failed" in f or "failed" in l:
        return None
    bound = f["persistent"] + layer_bytes(model) + (l["allocator_peak"] - l["persistent"])
    return f["allocator_peak"], bound


def render_grid(model, grid, seqs, steps):
    md = [f"**{model}**, 2 ranks, 1 sample of each length per rank per step, {steps} steps "
          f"(`{' '.join(COMMON)} --model={model} --global_batch=2 --steps={steps} --seq_len=T "
          "--dist=D --recompute=R`); MB per rank, the most of the two ranks:", "",
          "| T | dist | recompute | allocator peak MB | max RSS MB | persistent MB | "
          "fsdp transient peak MB | transient / 2 layers | step s | fsdp peak / bound |",
          "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for seq in seqs:
        for (dist, rc, s), r in sorted(grid.items(), key=lambda kv: (
                kv[0][0] != "layerwise", RECOMPUTE.index(kv[0][1]))):
            if s != seq:
                continue
            if "failed" in r:
                md.append(f"| {seq} | {dist} | {rc} | {r['failed']} | | | | | | |")
                continue
            check, layers = "", ""
            if dist == "fsdp":
                b = fsdp_bound(grid, model, seq, rc)
                check = f"{b[0] / b[1]:.3f}" if b else ""
                layers = f"{r['transient'] / layer_bytes(model):.3f}"
            md.append(f"| {seq} | {dist} | {rc} | {r['allocator_peak'] / MB:.1f} | "
                      f"{r['rss'] / MB:.1f} | {r['persistent'] / MB:.1f} | "
                      f"{r['transient'] / MB:.1f} | {layers} | {r['step_s']:.2f} | {check} |")
    md += ["", "*transient / 2 layers*: fsdp's transient peak over the two largest neighbouring "
           "forward layers' fp32 params and grads (the goal is ≤ 1). "
           "*fsdp peak / bound*: fsdp's allocator peak over (its persistent bytes + the two "
           "largest neighbouring forward layers' fp32 params and grads, "
           f"{layer_bytes(model) / MB:.1f} MB here + the activations, measured as layerwise's "
           "allocator peak minus its persistent bytes at the same T and recompute); the goal is "
           "≤ 1.", ""]
    return md


def render(small_ratios, repeats, versus, grids, tiny_note):
    md = ["**Time cost of recompute** (`small`, layerwise, 8 samples × 256 tokens per rank per "
          f"step, 6 steps; {repeats} repeat(s) in alternating order, median (range) of the "
          "per-repeat ratios of the median step time; goal full / none ≤ 1.4):", "",
          "| recompute | step time / none |", "|---|---|",
          f"| selective | {cell(small_ratios['selective'], 3)} |",
          f"| full | {cell(small_ratios['full'], 3)} |", "",
          "**fsdp against layerwise at the settings of section 5** (MB per rank, the most of the "
          "two ranks; goal: fsdp's peaks below layerwise's):", "",
          "| model | dist | allocator peak MB | max RSS MB | persistent MB | fsdp transient peak "
          "MB |", "|---|---|---:|---:|---:|---:|"]
    for model, rows in versus.items():
        for dist, r in rows.items():
            md.append(f"| {model} | {dist} | {r['allocator_peak'] / MB:.1f} | {r['rss'] / MB:.1f} "
                      f"| {r['persistent'] / MB:.1f} | {r['transient'] / MB:.1f} |")
    md.append("")
    for model, (grid, seqs, steps) in grids.items():
        md += render_grid(model, grid, seqs, steps)
    if tiny_note:
        md += [tiny_note, ""]
    return "\n".join(md)


def tinyllama(pretrain, log, quick):
    """The goal run: tinyllama-1.1b, fsdp, full recompute, 2048 tokens on 2 ranks (and the same at
    512 tokens with none / full, from which the activations per token follow). Returns (grid,
    seqs, steps, note)."""
    steps = 2
    grid = {}
    seqs = [512] if quick else [512, 2048]
    # At 2048 tokens layerwise (whole params and grads per rank) and fsdp without recompute are
    # refused before launch by pretrain's memory check (seconds); fsdp with full recompute trains.
    runs = ((512, "fsdp", ["none", "full"]), (2048, "layerwise", ["full"]),
            (2048, "fsdp", ["none", "full"]))
    for seq, dist, rcs in runs:
        if seq not in seqs:
            continue
        for rc in rcs:
            summary, wall, code, err = run(pretrain, COMMON + [
                "--model=tinyllama-1.1b", f"--seq_len={seq}", "--global_batch=2",
                f"--steps={steps}", f"--dist={dist}", f"--recompute={rc}", "--lr=3e-4",
                "--warmup_steps=1"], log, timeout=5400)
            grid[(dist, rc, seq)] = row_of(summary) if summary else {
                "failed": f"exit {code}: {err.splitlines()[-1][:700] if err else ''}"}
            if summary:
                grid[(dist, rc, seq)]["loss"] = (summary["initial_loss"], summary["final_loss"])
    note = None
    none, full = grid.get(("fsdp", "none", 512)), grid.get(("fsdp", "full", 512))
    if none and full and "failed" not in none and "failed" not in full:
        # With flash attention every activation is linear in T (no T x T tensor is kept), so 2048
        # tokens without recompute hold 4 x the 512-token activations.
        activations = none["allocator_peak"] - none["persistent"]
        estimate = none["persistent"] + 4 * activations
        note = (f"At 512 tokens, recompute=full holds {full['allocator_peak'] / 1e9:.2f} GB at the "
                f"peak against {none['allocator_peak'] / 1e9:.2f} GB without it; without "
                f"recompute 2048 tokens would need about {estimate / 1e9:.1f} GB per rank (its "
                "persistent bytes + 4 × the 512-token activations), "
                f"{2 * estimate / 1e9:.1f} GB for the two ranks: more than this machine has; "
                "pretrain refuses it before launch (its memory check counts a lower bound of the "
                "activations a micro-batch keeps), as it refuses layerwise, which holds whole "
                "params and grads on every rank.")
    return grid, seqs, steps, note


def section(pretrain, quick, repeats):
    log = []
    small = time_ratios(pretrain, repeats, log, steps=3 if quick else 6)
    versus = fsdp_vs_layerwise(pretrain, log)
    seqs = [256] if quick else [256, 1024]
    grids = {"gpt2-124m": (sweep(pretrain, "gpt2-124m", seqs, 3, log), seqs, 3)}
    tiny_grid, tiny_seqs, tiny_steps, note = tinyllama(pretrain, log, quick)
    grids["tinyllama-1.1b"] = (tiny_grid, tiny_seqs, tiny_steps)
    return render(small, repeats, versus, grids, note), log


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pretrain", default="bazel-bin/integration/pretrain")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None, help="default 3, or 1 with --quick")
    a = p.parse_args()
    md, _ = section(a.pretrain, a.quick, a.repeats or (1 if a.quick else 3))
    print(md)


if __name__ == "__main__":
    main()
