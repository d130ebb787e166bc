"""Parsing and rendering for //bench:report: turns the output of each benchmark binary into rows,
summarises repeated runs (median and [min, max] spread) and renders Markdown tables.

No plotting and no third-party imports here, so the unit test (report_lib_test.py) runs on canned
output with nothing but the standard library.
"""

import json
import re
import statistics


class ParseError(Exception):
    """Raised when a benchmark's output does not have the expected shape."""


# ---------------------------------------------------------------------------------------------
# Summaries of repeated runs.


class Stat:
    """Median and min-max of the values one figure took over the repeats."""

    def __init__(self, values):
        values = [float(v) for v in values if v is not None]
        if not values:
            raise ValueError("Stat of no values")
        self.values = values
        self.median = statistics.median(values)
        self.min = min(values)
        self.max = max(values)

    def format(self, digits=2, scale=1.0, suffix=""):
        """`median [min, max]`, or just the median for a single value."""
        med = f"{self.median * scale:.{digits}f}"
        if len(self.values) == 1:
            return med + suffix
        return f"{med}{suffix} [{self.min * scale:.{digits}f}, {self.max * scale:.{digits}f}]"


def summarize(runs):
    """`runs`: one dict per repeat mapping a row key to a dict of figures. Returns
    {row key: {figure: Stat}} over the keys present in every repeat (in first-run order)."""
    if not runs:
        return {}
    out = {}
    for key in runs[0]:
        if not all(key in r for r in runs):
            continue
        figures = {}
        for fig in runs[0][key]:
            vals = [r[key].get(fig) for r in runs]
            if all(isinstance(v, (int, float)) for v in vals):
                figures[fig] = Stat(vals)
        out[key] = figures
    return out


# ---------------------------------------------------------------------------------------------
# Parsers, one per benchmark output format.


def parse_gbench_json(text):
    """Google Benchmark --benchmark_out JSON → {run_name: {counter or time: value}}. Aggregates
    (mean/median/stddev rows) are skipped: repeats are separate processes here."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"benchmark JSON: {e}") from e
    if "benchmarks" not in doc:
        raise ParseError("benchmark JSON: no 'benchmarks' key")
    rows = {}
    for b in doc["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        if "error_occurred" in b and b["error_occurred"]:
            raise ParseError(f"{b['name']}: {b.get('error_message', 'error')}")
        skip = {"name", "run_name", "run_type", "family_index", "per_family_instance_index",
                "repetitions", "repetition_index", "time_unit", "label",
                "aggregate_name", "aggregate_unit"}
        figures = {k: v for k, v in b.items() if k not in skip and isinstance(v, (int, float))}
        rows[b.get("run_name", b["name"])] = figures
    return rows


_FLOAT = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


def rank0_lines(text):
    """Lines of a multi-rank binary's output as rank 0 printed them. The launcher (collectives/
    launcher.h) prefixes each child's line with "[rank N] "; lines of other ranks are dropped and
    unprefixed lines (a binary run as one rank) are kept."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^\[rank (\d+)\] ?(.*)$", line)
        if m is None:
            out.append(line)
        elif m.group(1) == "0":
            out.append(m.group(2))
    return out


def parse_collectives(text):
    """collectives_benchmark stdout → {size_MB: {allreduce, reduce_scatter, all_gather (busbw GB/s),
    rs_over_ar, ag_over_ar}}."""
    rows = {}
    line_re = re.compile(rf"^\s*(\d+)\s+(\d+)\s+({_FLOAT})\s+({_FLOAT})\s+({_FLOAT})\s+({_FLOAT})"
                         rf"\s+({_FLOAT})\s*$")
    for line in rank0_lines(text):
        m = line_re.match(line)
        if not m:
            continue
        rows[int(m.group(1))] = {
            "allreduce": float(m.group(3)),
            "reduce_scatter": float(m.group(4)),
            "all_gather": float(m.group(5)),
            "rs_over_ar": float(m.group(6)),
            "ag_over_ar": float(m.group(7)),
        }
    if not rows:
        raise ParseError("collectives: no size rows in output")
    return rows


def parse_ddp(text):
    """ddp_benchmark stdout → {mode: {forward, backward, exposed, param_sync, step, step_over_off}}
    plus the row "summary" with hidden_share, net_hidden_share (fractions), traffic_MB, buffer_MB,
    ideal_MB, wire_MB."""
    rows = {}
    mode_re = re.compile(rf"^(\S.*?\S)\s+({_FLOAT})\s+({_FLOAT})\s+({_FLOAT})\s+({_FLOAT})\s+"
                         rf"({_FLOAT})\s+({_FLOAT})\s*$")
    summary = {}
    for line in rank0_lines(text):
        m = mode_re.match(line)
        if m:
            rows[m.group(1)] = dict(zip(
                ["forward", "backward", "exposed", "param_sync", "step", "step_over_off"],
                [float(m.group(i)) for i in range(2, 8)]))
            continue
        m = re.match(rf"^hidden share of grad reduce-scatter time: ({_FLOAT})%", line)
        if m:
            summary["hidden_share"] = float(m.group(1)) / 100
        m = re.match(rf"^net hidden share .*?: ({_FLOAT})%", line)
        if m:
            summary["net_hidden_share"] = float(m.group(1)) / 100
        m = re.match(rf"^traffic per step: ({_FLOAT}) MB logical.*?buffer ({_FLOAT}) MB; ideal wire"
                     rf".*?= ({_FLOAT}) MB; wire sent.*?= ({_FLOAT}) MB", line)
        if m:
            summary.update(traffic_MB=float(m.group(1)), buffer_MB=float(m.group(2)),
                           ideal_MB=float(m.group(3)), wire_MB=float(m.group(4)))
    if not rows or "hidden_share" not in summary:
        raise ParseError("ddp: no mode rows or no hidden-share line in output")
    rows["summary"] = summary
    return rows


def parse_distributed(text):
    """distributed_benchmark stdout → {mode: {step_ms, ratio, grad_ms, rs_MB, ag_MB, ar_MB,
    wire_MB, ideal_MB}}."""
    rows = {}
    row_re = re.compile(rf"^([a-z_]+)" + rf"\s+({_FLOAT})" * 8 + r"\s*$")
    names = ["step_ms", "ratio", "grad_ms", "rs_MB", "ag_MB", "ar_MB", "wire_MB", "ideal_MB"]
    for line in rank0_lines(text):
        m = row_re.match(line)
        if m:
            rows[m.group(1)] = dict(zip(names, [float(m.group(i)) for i in range(2, 10)]))
    if not rows:
        raise ParseError("distributed: no mode rows in output")
    return rows


def parse_checkpoint(gbench_rows):
    """checkpoint_benchmark JSON rows → {name: {MBps, vs_baseline}} with each rate divided by its
    baseline's rate from the same run (writes vs BM_PlainWrite, reads and checksums vs
    BM_PlainRead)."""
    rates = {}
    for name, figs in gbench_rows.items():
        if "bytes_per_second" in figs:
            rates[name.split("/")[0]] = figs["bytes_per_second"]
    baselines = {"BM_PlainWrite": "BM_PlainWrite", "BM_SafetensorsWrite": "BM_PlainWrite",
                 "BM_CheckpointSave": "BM_PlainWrite", "BM_PlainRead": "BM_PlainRead",
                 "BM_SafetensorsRead": "BM_PlainRead", "BM_CheckpointVerify": "BM_PlainRead",
                 "BM_Crc32c": "BM_PlainRead", "BM_Crc32cPortable": "BM_PlainRead"}
    rows = {}
    for name, base in baselines.items():
        if name in rates and base in rates and rates[base] > 0:
            rows[name] = {"MBps": rates[name] / 1e6, "vs_baseline": rates[name] / rates[base]}
    if not rows:
        raise ParseError("checkpoint: no bytes_per_second counters")
    return rows


def parse_pretrain(text):
    """pretrain stdout: the last non-empty line is a JSON object; returns it."""
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        raise ParseError("pretrain: empty output")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ParseError(f"pretrain: last line is not JSON: {e}") from e


PRETRAIN_BASELINE = "muon_replicated"


def pretrain_rows(summaries):
    """{mode: pretrain summary JSON} of one run → {mode: {tokens_per_s, vs_replicated, loss}}, each
    rate over the replicated-Muon rate of the same run."""
    if PRETRAIN_BASELINE not in summaries:
        raise ParseError(f"pretrain: no {PRETRAIN_BASELINE} run to compare against")
    base = summaries[PRETRAIN_BASELINE].get("tokens_per_s", 0)
    if base <= 0:
        raise ParseError(f"pretrain: {PRETRAIN_BASELINE} reported no tokens_per_s")
    rows = {}
    for mode, doc in summaries.items():
        if "tokens_per_s" not in doc:
            raise ParseError(f"pretrain {mode}: no tokens_per_s in the summary")
        rows[mode] = {"tokens_per_s": doc["tokens_per_s"], "vs_replicated": doc["tokens_per_s"] / base}
        for key in ("final_loss", "loss", "train_loss"):
            if isinstance(doc.get(key), (int, float)):
                rows[mode]["loss"] = doc[key]
                break
    return rows


# Step-time modes of the fsdp section (`pretrain` flags per mode are in report.py).
FSDP_MODES = ["muon_layerwise", "adamw_layerwise", "muon_fsdp", "adamw_fsdp",
              "muon_fsdp_no_prefetch"]


def _step_ms(doc, mode):
    steps = doc.get("steps", 0)
    if not isinstance(doc.get("elapsed_s"), (int, float)) or not steps:
        raise ParseError(f"pretrain {mode}: no elapsed_s or steps in the summary")
    return 1000.0 * doc["elapsed_s"] / steps


def fsdp_rows(summaries):
    """{mode: pretrain summary JSON} of one repeat (every FSDP_MODES mode) → rows: per mode its step
    time, the time it waited on param gathers and grad syncs, and its logical bytes per step over
    the ideal (layerwise: a reduce-scatter and an all-gather of the buffer, 2x; fsdp: an all-gather
    for forward, one for backward and a reduce-scatter, 3x); and a "ratios" row with the figures the
    issue asks for, each within this repeat."""
    for mode in FSDP_MODES:
        if mode not in summaries:
            raise ParseError(f"fsdp: no {mode} run")
    rows = {}
    for mode in FSDP_MODES:
        doc = summaries[mode]
        buffer = doc.get("param_buffer_bytes", 0)
        per_step = doc.get("comm_bytes_per_step")
        if not buffer or not isinstance(per_step, (int, float)):
            raise ParseError(f"pretrain {mode}: no comm_bytes_per_step or param_buffer_bytes")
        passes = 3 if "fsdp" in mode else 2
        rows[mode] = {"step_ms": _step_ms(doc, mode),
                      "gather_wait_ms": 1000.0 * doc.get("param_gather_wait_s", 0.0),
                      "grad_wait_ms": 1000.0 * doc.get("grad_sync_wait_s", 0.0),
                      "comm_MB": per_step / 2**20,
                      "comm_vs_ideal": per_step / (passes * buffer)}
    r = {m: rows[m]["step_ms"] for m in FSDP_MODES}
    exposed_no_prefetch = rows["muon_fsdp_no_prefetch"]["gather_wait_ms"]
    rows["ratios"] = {
        "muon_over_adamw_fsdp": r["muon_fsdp"] / r["adamw_fsdp"],
        "muon_over_adamw_layerwise": r["muon_layerwise"] / r["adamw_layerwise"],
        "fsdp_over_layerwise_muon": r["muon_fsdp"] / r["muon_layerwise"],
        "fsdp_over_layerwise_adamw": r["adamw_fsdp"] / r["adamw_layerwise"],
        # Muon's extra time with sharded params minus without: what sharding costs Muon.
        "muon_extra_ms_fsdp": r["muon_fsdp"] - r["adamw_fsdp"],
        "muon_extra_ms_layerwise": r["muon_layerwise"] - r["adamw_layerwise"],
        "gather_hidden_share": (1.0 - rows["muon_fsdp"]["gather_wait_ms"] / exposed_no_prefetch
                                if exposed_no_prefetch > 0 else None),
    }
    return rows


def fsdp_memory_rows(summaries):
    """{(dist, dp): pretrain summary JSON} → {dp: figures}: per-rank persistent bytes (the most
    any rank holds) of layerwise and fsdp, the ideal (params + grads + state of the whole model,
    from layerwise at dp 1) / dp, and fsdp's transient peak. Exact byte counts, no timing."""
    whole_doc = summaries.get(("layerwise", 1))
    if not whole_doc:
        raise ParseError("fsdp memory: no layerwise run at dp 1 (the whole model)")
    whole = whole_doc.get("max_persistent_bytes", 0)
    rows = {}
    for dp in sorted({dp for _, dp in summaries}):
        lw, fs = summaries.get(("layerwise", dp)), summaries.get(("fsdp", dp))
        if not lw or not fs:
            raise ParseError(f"fsdp memory: missing a run at dp {dp}")
        ideal = whole / dp
        rows[dp] = {"layerwise_MB": lw["max_persistent_bytes"] / 2**20,
                    "fsdp_MB": fs["max_persistent_bytes"] / 2**20,
                    "ideal_MB": ideal / 2**20,
                    "fsdp_over_ideal": fs["max_persistent_bytes"] / ideal,
                    "layerwise_over_fsdp": lw["max_persistent_bytes"] / fs["max_persistent_bytes"],
                    "fsdp_peak_transient_MB": fs["max_peak_transient_bytes"] / 2**20}
    return rows


# Section "peer": orthoshard's pretrain against the PyTorch peer (bench/torch_peer.py), per model.
# Row names; each ratio is (name, orthoshard mode, peer mode) of tokens/s within one repeat.
# The last runs orthoshard's layerwise Muon with --overlap_grad_reduce=false and
# --overlap_param_gather=false: what the overlap hides.
# orthoshard_adamw_distopt_fused is distopt with --adamw_fused (ATen's fused kernel, as
# torch.optim.AdamW(fused=True)): the like-for-like comparison with the fused peer, where the default
# keeps the slice-invariant foreach=False order.
PEER_ORTHOSHARD_MODES = ["orthoshard_muon_layerwise", "orthoshard_adamw_distopt",
                         "orthoshard_muon_layerwise_no_overlap", "orthoshard_adamw_distopt_fused",
                         "orthoshard_muon_layerwise_direct"]
PEER_TORCH_MODES = ["torch_muon", "torch_adamw", "torch_adamw_fused"]
PEER_RATIOS = [("muon", "orthoshard_muon_layerwise", "torch_muon"),
               ("muon_direct", "orthoshard_muon_layerwise_direct", "torch_muon"),
               ("adamw_vs_fused", "orthoshard_adamw_distopt", "torch_adamw_fused"),
               ("adamw_vs_default", "orthoshard_adamw_distopt", "torch_adamw"),
               ("adamw_fused_vs_fused", "orthoshard_adamw_distopt_fused", "torch_adamw_fused")]


def _number(doc, key):
    v = doc.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _sum_or_none(*values):
    return None if any(v is None for v in values) else sum(values)


def peer_rows(summaries, tokens_per_step, model_flops_per_step):
    """{mode: summary JSON} of one model in one repeat (every PEER_*_MODES mode: pretrain's
    summary or torch_peer's JSON line) → rows per mode: tokens_per_s, step_s, steady (1: step_s is
    the run's median steady step; 0: pretrain reported none, so step_s is tokens_per_step over its
    whole-run tokens_per_s), cpu_s_per_step, mfu (model_flops_per_step / step_s over the highest
    gemm_flops_per_s of this repeat's peer runs: what the machine reached, which load only lowers),
    final_loss and the step breakdown forward_s, backward_s, optimizer_s, exposed_comm_s (the
    communication wait on the step's critical path: the least any rank waited; pretrain: grad syncs
    and param gathers per step, the peer: its DDP backward's sync time), rank_skew_s (the most any
    rank waited minus the least: imbalance, not communication) and rank0_wait_s (pretrain only: rank
    0's grad sync + param gather waits, skew included); figures a summary lacks are None. Plus a "ratios" row: PEER_RATIOS of tokens/s
    and of CPU seconds per step, and a "reference" row with the GEMM rate (gemm_GFLOPs)."""
    for mode in PEER_ORTHOSHARD_MODES + PEER_TORCH_MODES:
        if mode not in summaries:
            raise ParseError(f"peer: no {mode} run")
    gemm = [_number(summaries[m], "gemm_flops_per_s") for m in PEER_TORCH_MODES]
    gemm = [g for g in gemm if g]
    if not gemm:
        raise ParseError("peer: no torch_peer run reported gemm_flops_per_s")
    gemm = max(gemm)
    rows = {}
    for mode in PEER_ORTHOSHARD_MODES + PEER_TORCH_MODES:
        doc = summaries[mode]
        torch_peer = mode in PEER_TORCH_MODES
        step_s = _number(doc, "step_s")
        steady = step_s is not None
        if not steady:
            whole = _number(doc, "tokens_per_s")
            if not whole:
                raise ParseError(f"peer {mode}: neither step_s nor tokens_per_s in the summary")
            step_s = tokens_per_step / whole
        rows[mode] = {
            "tokens_per_s": tokens_per_step / step_s, "step_s": step_s, "steady": float(steady),
            "cpu_s_per_step": _number(doc, "cpu_s_per_step"),
            "mfu": model_flops_per_step / step_s / gemm, "final_loss": _number(doc, "final_loss"),
            "forward_s": _number(doc, "forward_s"), "backward_s": _number(doc, "backward_s"),
            "optimizer_s": _number(doc, "optimizer_s"),
            "exposed_comm_s": _number(doc, "exposed_comm_s"),
            "rank_skew_s": _number(doc, "rank_skew_s"),
            "rank0_wait_s": None if torch_peer else _sum_or_none(
                _number(doc, "grad_sync_wait_s"), _number(doc, "param_gather_wait_s"))}
    ratios = {}
    for name, ours, theirs in PEER_RATIOS:
        ratios[name] = rows[ours]["tokens_per_s"] / rows[theirs]["tokens_per_s"]
        cpu_ours, cpu_theirs = rows[ours]["cpu_s_per_step"], rows[theirs]["cpu_s_per_step"]
        ratios["cpu_" + name] = cpu_ours / cpu_theirs if cpu_ours and cpu_theirs else None
    # Exposed communication with overlap over without (issue 19's goal: <= 0.2): on the critical
    # path, and as rank 0 waited (skew included); None when either run lacks the figure.
    def over(figure):
        on = rows["orthoshard_muon_layerwise"][figure]
        off = rows["orthoshard_muon_layerwise_no_overlap"][figure]
        return on / off if on is not None and off else None
    ratios["exposed_comm_overlap"] = over("exposed_comm_s")
    ratios["rank0_wait_overlap"] = over("rank0_wait_s")
    rows["ratios"] = ratios
    rows["reference"] = {"gemm_GFLOPs": gemm / 1e9}
    return rows


# ---------------------------------------------------------------------------------------------
# Rendering.


def markdown_table(header, rows):
    """A GitHub Markdown table; numbers already formatted as strings."""
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


STRATEGIES = ["layerwise", "megatron_lpt", "distopt"]


def layout_tables(doc):
    """layout_table JSON → {preset: Markdown table} with one row per dp: padding %, buckets and
    NS cost imbalance for each strategy."""
    by_preset = {}
    for r in doc["rows"]:
        by_preset.setdefault(r["preset"], {}).setdefault(r["dp"], {})[r["strategy"]] = r
    tables = {}
    for preset, by_dp in by_preset.items():
        header = (["dp"] + [f"padding % {s}" for s in STRATEGIES]
                  + [f"buckets {s}" for s in STRATEGIES]
                  + [f"NS imbalance {s}" for s in STRATEGIES])
        rows = []
        for dp in sorted(by_dp):
            cells = by_dp[dp]
            row = [dp]
            row += [f"{100 * cells[s]['padding_fraction']:.4f}" if s in cells else "–"
                    for s in STRATEGIES]
            row += [cells[s]["buckets"] if s in cells else "–" for s in STRATEGIES]
            row += [f"{cells[s]['ns_cost_imbalance']:.3f}" if s in cells else "–"
                    for s in STRATEGIES]
            rows.append(row)
        tables[preset] = markdown_table(header, rows)
    return tables


def stat_cell(stats, fig, digits=2, scale=1.0, suffix=""):
    s = stats.get(fig)
    return s.format(digits, scale, suffix) if s else "–"


def muon_table(summary):
    """Summarised optimizers_benchmark rows → the Muon table."""
    rows = []
    for name, st in summary.items():
        m = re.match(r"BM_MuonStep/(\d+)/(\d+)", name)
        if not m:
            continue
        dtype = "bf16" if m.group(1) == "0" else "fp32"
        threads = "default" if m.group(2) == "0" else m.group(2)
        used = f" ({st['threads'].median:.0f})" if "threads" in st else ""
        rows.append([f"{dtype} NS, {threads} threads{used}",
                     stat_cell(st, "muon_ms"), stat_cell(st, "mm_ms"),
                     stat_cell(st, "mm_fraction", 3),
                     stat_cell(st, "ns_ms") if "ns_ms" in st else "-",
                     stat_cell(st, "mm_over_ns", 3) if "mm_over_ns" in st else "-"])
    return markdown_table(["Muon step 1024×4096", "step ms", "its at::mm ms", "mm / step",
                           "NS alone ms", "mm / NS"], rows)


def muon_elementwise_table(summary):
    """The BM_MuonElementwise row → ATen's elementwise ops of a Muon step vs the fused passes."""
    rows = [["1024×4096 fp32, bf16 update", stat_cell(st, "aten_ms"), stat_cell(st, "fused_ms"),
             stat_cell(st, "speedup", 2)]
            for name, st in summary.items() if name.startswith("BM_MuonElementwise")]
    return markdown_table(["Muon elementwise", "ATen ops ms", "fused ms", "speedup"], rows)


def adamw_fused_table(summary):
    """BM_AdamWFused rows → AdamW's ATen ops vs the fused passes, per size."""
    rows = []
    for name, st in summary.items():
        m = re.match(r"BM_AdamWFused/(\d+)", name)
        if not m:
            continue
        n = int(m.group(1))
        rows.append([f"{n:,} fp32 ({n * 4 / 2**20:g} MiB)", stat_cell(st, "aten_ms", 3),
                     stat_cell(st, "fused_ms", 3), stat_cell(st, "speedup", 2),
                     stat_cell(st, "aten_fused_ms", 3), stat_cell(st, "aten_fused_speedup", 2)])
    return markdown_table(["AdamW elementwise", "ATen ops ms", "fused passes ms", "speedup",
                           "ATen fused kernel ms", "speedup"], rows)


def adamw_table(summary):
    rows = []
    for name, st in summary.items():
        m = re.match(r"BM_AdamWStep/(\d+)", name)
        if not m:
            continue
        n = int(m.group(1))
        rows.append([f"{n:,} fp32 ({n * 4 / 2**20:.0f} MiB)", stat_cell(st, "adamw_GBps"),
                     stat_cell(st, "copy_GBps"), stat_cell(st, "ratio", 3)])
    return markdown_table(["AdamW step", "AdamW GB/s (7 passes)", "copy GB/s (2 passes)",
                           "AdamW / copy"], rows)


def collectives_table(summary):
    rows = [[mb, stat_cell(st, "allreduce", 3), stat_cell(st, "reduce_scatter", 3),
             stat_cell(st, "all_gather", 3), stat_cell(st, "rs_over_ar", 3),
             stat_cell(st, "ag_over_ar", 3)] for mb, st in summary.items()]
    return markdown_table(["size MiB", "all-reduce busbw GB/s", "reduce-scatter busbw GB/s",
                           "all-gather busbw GB/s", "RS / AR", "AG / AR"], rows)


def ddp_table(summary):
    rows = [[mode, stat_cell(st, "forward"), stat_cell(st, "backward"), stat_cell(st, "exposed"),
             stat_cell(st, "param_sync"), stat_cell(st, "step"), stat_cell(st, "step_over_off", 3)]
            for mode, st in summary.items() if mode != "summary"]
    return markdown_table(["mode", "forward ms", "backward ms", "exposed comm ms", "param sync ms",
                           "step ms", "step / off"], rows)


def distributed_table(summary):
    rows = [[mode, stat_cell(st, "step_ms"), stat_cell(st, "ratio", 3), stat_cell(st, "grad_ms"),
             stat_cell(st, "wire_MB"), stat_cell(st, "ideal_MB"),
             (Stat([w / i for w, i in zip(st["wire_MB"].values, st["ideal_MB"].values)]).format(3)
              if "wire_MB" in st and "ideal_MB" in st and min(st["ideal_MB"].values) > 0 else "–")]
            for mode, st in summary.items()]
    return markdown_table(["mode", "step+sync ms", "vs replicated", "grad sync ms",
                           "wire MB/rank", "ideal 2(N−1)/N·buffer MB", "wire / ideal"], rows)


def checkpoint_table(summary):
    base = {"BM_PlainWrite": "plain write", "BM_SafetensorsWrite": "plain write",
            "BM_CheckpointSave": "plain write", "BM_PlainRead": "plain read",
            "BM_SafetensorsRead": "plain read", "BM_CheckpointVerify": "plain read",
            "BM_Crc32c": "plain read", "BM_Crc32cPortable": "plain read"}
    rows = [[name.replace("BM_", ""), stat_cell(st, "MBps", 0), stat_cell(st, "vs_baseline", 3),
             base.get(name, "")] for name, st in summary.items()]
    return markdown_table(["operation", "MB/s", "ratio", "baseline (same run)"], rows)


def pretrain_table(summary):
    rows = [[mode, stat_cell(st, "tokens_per_s", 0), stat_cell(st, "vs_replicated", 3),
             stat_cell(st, "loss", 3)] for mode, st in summary.items()]
    return markdown_table(["mode", "tokens/s", "vs replicated Muon", "final loss"], rows)


def fsdp_step_table(summary):
    rows = [[mode, stat_cell(st, "step_ms", 0), stat_cell(st, "gather_wait_ms", 1),
             stat_cell(st, "grad_wait_ms", 1), stat_cell(st, "comm_MB", 1),
             stat_cell(st, "comm_vs_ideal", 3)]
            for mode, st in summary.items() if mode != "ratios"]
    return markdown_table(["mode", "step ms", "waited on param gathers ms",
                           "waited on grad syncs ms", "logical MB per step",
                           "logical bytes / ideal"], rows)


def fsdp_ratio_table(summary):
    st = summary.get("ratios", {})
    return markdown_table(["figure", "value"], [
        ["Muon-fsdp / AdamW-fsdp step time (goal ≤ 1.1; Megatron's draft 1.5–2.7)",
         stat_cell(st, "muon_over_adamw_fsdp", 3)],
        ["Muon-layerwise / AdamW-layerwise step time (the same compute without param sharding)",
         stat_cell(st, "muon_over_adamw_layerwise", 3)],
        ["Muon's extra ms per step over AdamW, fsdp", stat_cell(st, "muon_extra_ms_fsdp", 0)],
        ["Muon's extra ms per step over AdamW, layerwise",
         stat_cell(st, "muon_extra_ms_layerwise", 0)],
        ["fsdp / layerwise step time, Muon", stat_cell(st, "fsdp_over_layerwise_muon", 3)],
        ["fsdp / layerwise step time, AdamW", stat_cell(st, "fsdp_over_layerwise_adamw", 3)],
        ["share of param-gather time hidden by prefetching, 1 − waited(prefetch) / "
         "waited(no prefetch)", stat_cell(st, "gather_hidden_share", 1, 100, "%")]])


def fsdp_memory_table(summary):
    rows = [[str(dp), stat_cell(st, "layerwise_MB", 1), stat_cell(st, "fsdp_MB", 1),
             stat_cell(st, "ideal_MB", 1), stat_cell(st, "fsdp_over_ideal", 3),
             stat_cell(st, "layerwise_over_fsdp", 2), stat_cell(st, "fsdp_peak_transient_MB", 1)]
            for dp, st in summary.items()]
    return markdown_table(["dp", "layerwise MB", "fsdp MB", "ideal (whole) / dp MB",
                           "fsdp / ideal", "layerwise / fsdp", "fsdp transient peak MB"], rows)


def _timing_cell(st):
    s = st.get("steady")
    if not s:
        return "–"
    return "steady median" if s.min == 1 else "whole run" if s.max == 0 else "mixed"


def peer_table(summary):
    """Summarised peer_rows of one model → tokens/s, step, CPU, MFU and loss per mode."""
    rows = [[mode, stat_cell(st, "tokens_per_s", 0), stat_cell(st, "step_s", 3),
             stat_cell(st, "cpu_s_per_step", 3), stat_cell(st, "mfu", 1, 100, "%"),
             stat_cell(st, "final_loss", 3), _timing_cell(st)]
            for mode, st in summary.items() if mode not in ("ratios", "reference")]
    return markdown_table(["run", "tokens/s", "step s", "CPU s per step (all ranks)", "MFU",
                           "final loss", "step time from"], rows)


def peer_ratio_table(summary):
    st = summary.get("ratios", {})
    ref = summary.get("reference", {})
    return markdown_table(["figure", "value"], [
        ["tokens/s, orthoshard layerwise Muon / torch Muon", stat_cell(st, "muon", 3)],
        ["tokens/s, orthoshard layerwise Muon --muon_ns_form=direct / torch Muon (the peer's "
         "own products, bitwise)", stat_cell(st, "muon_direct", 3)],
        ["tokens/s, orthoshard ZeRO-1 AdamW / torch AdamW(fused=True)",
         stat_cell(st, "adamw_vs_fused", 3)],
        ["tokens/s, orthoshard ZeRO-1 AdamW / torch AdamW (default: its for-loop on CPU)",
         stat_cell(st, "adamw_vs_default", 3)],
        ["tokens/s, orthoshard ZeRO-1 AdamW --adamw_fused / torch AdamW(fused=True) (the same "
         "ATen kernel on both sides)", stat_cell(st, "adamw_fused_vs_fused", 3)],
        ["CPU s per step, orthoshard layerwise Muon / torch Muon", stat_cell(st, "cpu_muon", 3)],
        ["CPU s per step, orthoshard layerwise Muon --muon_ns_form=direct / torch Muon",
         stat_cell(st, "cpu_muon_direct", 3)],
        ["CPU s per step, orthoshard ZeRO-1 AdamW / torch AdamW(fused=True)",
         stat_cell(st, "cpu_adamw_vs_fused", 3)],
        ["CPU s per step, orthoshard ZeRO-1 AdamW / torch AdamW (default: for-loop)",
         stat_cell(st, "cpu_adamw_vs_default", 3)],
        ["CPU s per step, orthoshard ZeRO-1 AdamW --adamw_fused / torch AdamW(fused=True)",
         stat_cell(st, "cpu_adamw_fused_vs_fused", 3)],
        ["exposed communication of orthoshard layerwise Muon on the critical path (per step the "
         "least wait of any rank on grad syncs + param gathers), overlap on / off",
         stat_cell(st, "exposed_comm_overlap", 3)],
        ["the same as rank 0 waited (rank skew included), overlap on / off",
         stat_cell(st, "rank0_wait_overlap", 3)],
        ["torch.mm over the model's GEMM shapes, all ranks at once, GFLOP/s (the MFU "
         "denominator)", stat_cell(ref, "gemm_GFLOPs", 1)]])


def peer_breakdown_table(summary):
    """Where a step's time goes per mode, ms (– where the run did not report the figure)."""
    rows = [[mode] + [stat_cell(st, fig, 0, 1000) for fig in (
        "forward_s", "backward_s", "optimizer_s", "exposed_comm_s", "rank_skew_s", "rank0_wait_s",
        "step_s")] for mode, st in summary.items() if mode not in ("ratios", "reference")]
    return markdown_table(["run", "forward ms", "backward ms", "optimizer ms", "exposed comm ms",
                           "rank skew ms", "rank 0 waits ms", "step ms"], rows)


def _split_sections(text):
    """[(key, chunk)]: the text before the first "## " heading (key None), then one chunk per
    "## " heading (key: the heading's number, "7." for "## 7. ...", else the whole heading)."""
    chunks, key, lines = [], None, []
    for line in text.split("\n"):
        if line.startswith("## "):
            chunks.append((key, "\n".join(lines)))
            title = line[3:].strip()
            key, lines = title.split(" ", 1)[0] if title[:1].isdigit() else title, [line]
        else:
            lines.append(line)
    chunks.append((key, "\n".join(lines)))
    return chunks


def merge_sections(old_text, new_text, provenance):
    """A partial report (`--only=...`) merged into the full one it updates: each numbered section of
    `new_text` replaces the section of the same number in `old_text`, or is inserted in number order
    among the numbered sections, with `provenance` (when, where, which commit it was measured) as its
    first paragraph; the old header, machine table, run log and every other section are kept.
    Without an old report, `new_text`."""
    if not old_text.strip():
        return new_text
    number = lambda key: float(key.rstrip("."))  # noqa: E731
    numbered = lambda key: bool(key) and key[:1].isdigit()  # noqa: E731
    new = {k: c for k, c in _split_sections(new_text) if numbered(k)}

    def stamped(chunk):
        heading, _, body = chunk.partition("\n")
        return heading + "\n\n" + provenance.rstrip("\n") + "\n\n" + body.lstrip("\n")

    out = [(k, stamped(new[k]) if k in new else c) for k, c in _split_sections(old_text)]
    for k in sorted((k for k in new if k not in {key for key, _ in out}), key=number):
        positions = [i for i, (key, _) in enumerate(out) if numbered(key)]
        later = [i for i in positions if number(out[i][0]) > number(k)]
        at = later[0] if later else (positions[-1] + 1 if positions else len(out))
        out.insert(at, (k, stamped(new[k])))
    return "\n".join(c for _, c in out)


def carry_summary(old_text, new_text):
    """A full report `new_text` with the hand-kept "## Summary" section of `old_text` (the headline
    ratios, with links into the sections) placed before its first "## " section, so that a full run
    does not drop it; `new_text` as it is when the old report has no summary or the new one has its
    own. The summary's figures are the ones it was last edited with: its comment says so."""
    old = dict((k, c) for k, c in _split_sections(old_text) if k is not None)
    chunks = _split_sections(new_text)
    if "Summary" not in old or any(k == "Summary" for k, _ in chunks):
        return new_text
    head, rest = chunks[0], chunks[1:]
    return "\n".join([head[1], old["Summary"]] + [c for _, c in rest])


# A word that must not begin a wrapped line: at the start of a line Markdown would read it as a
# list item, heading, quote, table row, setext underline or ordered-list number.
_NO_BREAK_BEFORE = re.compile(r"^(?:[-+*]|[#>|].*|=+|-+|\d+[.)])$")


def wrap_markdown(text, width=100):
    """`text` with every prose line longer than `width` wrapped at spaces (a list item's
    continuation lines indented by two), so that the file reads in an editor. Headings, table
    rows, images, code blocks and lines within `width` are kept as they are; a word longer than
    `width` stays whole. Rendering is unchanged: Markdown joins a paragraph's lines with spaces."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if (fenced or len(line) <= width or line.startswith(("#", "|", "![", "```", "    "))):
            out.append(line)
            continue
        indent = "  " if line.startswith(("- ", "* ")) else ""
        words = re.split(r"(?<=\S) (?=\S)", line)
        current = words[0]
        for word in words[1:]:
            if len(current) + 1 + len(word) > width and not _NO_BREAK_BEFORE.match(word):
                out.append(current)
                current = indent + word
            else:
                current += " " + word
        out.append(current)
    return "\n".join(out)
