"""Tensor-parallel Muon planning (BENCHMARKS.md section "tp_plan"): what each rank of a TP × DP
grid runs in Newton–Schulz and sends over its tp group for Muon under `--muon_tp_mode=owner`,
`duplicated` and `blockwise`, for gpt2-124m, tinyllama-1.1b, Llama-3-8B (`llama3_8b_gqa`) and
the MoE preset `moe_60x256`, at TP 1–8 × DP 8–1024. Exact arithmetic over the plan
(layout/tp_plan.h), no timing.

    tools/python3 bench/tp_plan_bench.py --plan=bazel-bin/layout/plan

or through the report: `bazel run //bench:report -- --only=tp_plan`. Prints the section's markdown.
"""

import argparse
import json
import subprocess
import sys

PRESETS = ["gpt2-124m", "tinyllama-1.1b", "llama3_8b_gqa", "moe_60x256"]
TPS = [1, 2, 4, 8]
DPS = [8, 64, 1024]
# Megatron's default bucket size (the tool's default), layer-wise layout, 5 Newton–Schulz steps.
PLAN_FLAGS = ["--format=json", "--ns_steps=5"]


def run_plan(plan, preset, tp, dps=DPS):
    """(doc, None) for the plan tool's JSON at `tp` over `dps`, or (None, message) when the tool
    refuses the grid (exit 2: e.g. tp not dividing the KV groups). Other failures raise."""
    args = [plan, f"--preset={preset}", f"--tp={tp}", "--dp=" + ",".join(map(str, dps))]
    print(f"[tp_plan] {' '.join(args + PLAN_FLAGS)}", file=sys.stderr, flush=True)
    proc = subprocess.run(args + PLAN_FLAGS, capture_output=True, text=True, timeout=600)
    if proc.returncode == 2:
        return None, proc.stderr.strip().removeprefix("plan: ")
    if proc.returncode != 0:
        raise RuntimeError(f"plan exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout), None


def measure(plan):
    """{preset: {"plans": [plan dicts in tp, dp order], "refused": {tp: message}}}."""
    out = {}
    for preset in PRESETS:
        entry = {"plans": [], "refused": {}}
        for tp in TPS:
            doc, refused = run_plan(plan, preset, tp)
            if refused:
                entry["refused"][tp] = refused
            else:
                entry["plans"] += doc["plans"]
        out[preset] = entry
    return out


def gflop(flops):
    return f"{flops / 1e9:,.0f}" if flops >= 1e11 else f"{flops / 1e9:,.1f}"


def mb(n):
    return f"{n / 1e6:,.0f}" if n >= 1e8 else f"{n / 1e6:,.1f}"


def mode(p, name):
    return p["modes"][name]


def ratio(p):
    dup = mode(p, "duplicated")["max_ns_flops"]
    return mode(p, "owner")["max_ns_flops"] / dup if dup else 1.0


def headline_rows(results):
    """Rows of the owner-vs-duplicated table: each preset at TP 8, or its largest TP the tool
    accepts (with the reason TP 8 is refused)."""
    rows = []
    for preset, entry in results.items():
        if not entry["plans"]:
            continue
        top = max(p["tp"] for p in entry["plans"])
        for p in (p for p in entry["plans"] if p["tp"] == top):
            o, d, b = mode(p, "owner"), mode(p, "duplicated"), mode(p, "blockwise")
            rows.append([f"`{preset}`", p["tp"], p["dp"], p["ranks"],
                         f"{gflop(o['max_ns_flops'])} ({o['ns_imbalance']:.2f})",
                         f"{gflop(d['max_ns_flops'])} ({d['ns_imbalance']:.2f})",
                         f"{ratio(p):.3f}",
                         f"{gflop(b['max_ns_flops'])} ({b['ns_imbalance']:.2f})",
                         f"{mb(o['max_tp_bytes'])} / {mb(d['max_tp_bytes'])}",
                         mb(p["dp_bytes"])])
    return rows


def table(header, rows):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


HEADER = ["model", "TP", "DP", "ranks", "owner GFLOP (max/mean)", "duplicated GFLOP (max/mean)",
          "owner / duplicated", "blockwise GFLOP (max/mean)", "Muon tp MB owner / duplicated",
          "dp MB"]


def render(results):
    md = ["Exact arithmetic over the plan (`layout/tp_plan.h`), no timing: per step, the "
          "Newton–Schulz FLOPs of the busiest rank of the TP × DP grid (matrix products of 5 "
          "direct iterations, 5·(4m²n + 2m³) per logical matrix, m ≤ n: Q, K, V and gate, up "
          "apart, as Muon splits the fused QKV and fc1) with max/mean over all ranks in "
          "brackets; the bytes the busiest rank sends over its tp group for Muon (fp32 "
          "updates; it receives as many; `blockwise` sends none); and the bytes each rank sends "
          "over dp (grad reduce-scatter in fp32 + param all-gather in bf16 of the tp-local "
          "layer-wise buffers, padding included), which are the same in all three modes. "
          "Megatron's split: QKV by KV groups, fc1 by gate/up halves, proj and fc2 by columns, "
          "embedding and output by vocabulary, norms and the router whole; each MoE expert split "
          "as the dense MLP (expert TP = TP, ep 1). `owner` gives each TP-split matrix one home "
          "in its dp owners' tp group (`AssignTpHomes`, balanced by max·min²), `duplicated` runs "
          "every matrix on every tp rank of that group, `blockwise` each rank's local slices. "
          "Layer-wise layout, Megatron's default bucket size max(40M, 1M·dp). By construction, "
          "`owner`'s FLOPs summed over the grid equal TP 1's and `duplicated`'s are TP times "
          "them (`layout/tp_plan_test.cc` checks both on every preset; the MoE router, which "
          "every tp rank holds whole, runs on every tp rank in all modes); `owner`'s busiest "
          "rank approaches 1/TP of `duplicated`'s while each dp owner holds several matrices "
          "per tp rank, and equals it once a dp owner holds about one matrix per tp rank (large "
          "DP), since neither mode cuts a matrix; `blockwise` cuts them, but its update depends "
          "on TP.", "",
          "### Owner vs duplicated at the largest TP", "",
          table(HEADER, headline_rows(results)), ""]
    refusals = [(preset, tp, msg) for preset, entry in results.items()
                for tp, msg in sorted(entry["refused"].items())]
    if refusals:
        md += ["Refused by the tool (exit 2), so not in the tables:", ""]
        md += [f"- `{preset}` at TP {tp}: {msg}" for preset, tp, msg in refusals]
        md.append("")
    for preset, entry in results.items():
        if not entry["plans"]:
            continue
        rows = []
        for p in entry["plans"]:
            o, d, b = mode(p, "owner"), mode(p, "duplicated"), mode(p, "blockwise")
            rows.append([f"`{preset}`", p["tp"], p["dp"], p["ranks"],
                         f"{gflop(o['max_ns_flops'])} ({o['ns_imbalance']:.2f})",
                         f"{gflop(d['max_ns_flops'])} ({d['ns_imbalance']:.2f})",
                         f"{ratio(p):.3f}",
                         f"{gflop(b['max_ns_flops'])} ({b['ns_imbalance']:.2f})",
                         f"{mb(o['max_tp_bytes'])} / {mb(d['max_tp_bytes'])}",
                         mb(p["dp_bytes"])])
        md += [f"### {preset}", "", table(HEADER, rows), ""]
    return "\n".join(md)


def section(plan):
    return render(measure(plan))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--plan", default="bazel-bin/layout/plan")
    a = p.parse_args()
    print(section(a.plan))


if __name__ == "__main__":
    main()
