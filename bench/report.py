"""Driver of //bench:report: runs every orthoshard benchmark in one sitting, N times round-robin,
and writes BENCHMARKS.md (median [min, max] of the repeats; each ratio is taken within one run, then
summarised) plus PNG plots.

  bazel run //bench:report -- [--out=BENCHMARKS.md] [--repeats=N] [--quick] [--only=layout,...]

With --only, the chosen sections replace theirs in an existing --out and the rest is kept, each
replaced section saying when, where and at which commit it was measured.

Run by bench/report.sh from the runfiles tree, so benchmark binaries are found by their package
path (they are `data` of the target). Output paths are relative to $BUILD_WORKSPACE_DIRECTORY.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_shapes  # noqa: E402
import memory_bench  # noqa: E402
import moe_bench  # noqa: E402
import report_lib as rl  # noqa: E402
import tp_bench  # noqa: E402
import tp_plan_bench  # noqa: E402

SECTIONS = ["layout", "optimizers", "distributed", "pretrain", "fsdp", "checkpoint", "peer",
            "precision", "moe", "tp_plan", "tp", "memory"]


def sh(cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine_info(workspace):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    commit = sh(["git", "rev-parse", "HEAD"], cwd=workspace) or "unknown"
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"], cwd=workspace)
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem, "commit": commit,
            "dirty": bool(dirty), "kernel": sh(["uname", "-sr"])}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


class Runner:
    """Runs binaries by runfiles path, logging commands and wall times."""

    def __init__(self, verbose=True):
        self.verbose = verbose
        self.log = []

    def run(self, path, args, timeout=900, interpreter=None):
        """Runs `path` with `args` (a script: under `interpreter`); returns its stdout."""
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        start = time.time()
        if self.verbose:
            print(f"[bench] {path} {' '.join(args)}", file=sys.stderr, flush=True)
        command = ([interpreter] if interpreter else []) + [path] + args
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        elapsed = time.time() - start
        self.log.append((path, args, elapsed, proc.returncode))
        if proc.returncode != 0:
            raise RuntimeError(f"{path} exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc.stdout


def gbench(runner, path, args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        runner.run(path, args + [f"--benchmark_out={out}", "--benchmark_out_format=json"])
        with open(out) as f:
            return rl.parse_gbench_json(f.read())
    finally:
        os.unlink(out)


# Binaries (runfiles paths) and their arguments, full and --quick.
BIN = {
    "layout": "bench/layout_table",
    "optimizers": "optimizers/optimizers_benchmark",
    "collectives": "collectives/collectives_benchmark",
    "ddp": "ddp/ddp_benchmark",
    "distributed": "optimizers/distributed/distributed_benchmark",
    "checkpoint": "checkpoint/checkpoint_benchmark",
    "pretrain": "integration/pretrain",
    "tp_plan": "layout/plan",
    "tp_muon": "optimizers/distributed/tp_muon_benchmark",
}


def bench_args(quick):
    return {
        "optimizers": ["--benchmark_min_time=0.05" if quick else "--benchmark_min_time=0.5"],
        "collectives": ["--max_mb", "8" if quick else "128"],
        "ddp": ["--layers", "4", "--hidden", "512", "--iters", "3"] if quick else [],
        "distributed": ["3"] if quick else [],
        "checkpoint": (["--benchmark_filter=Plain|Safetensors|Checkpoint"] if quick else []),
        "pretrain": ["--model=small", "--steps=" + ("2" if quick else "10"),
                     "--global_batch=" + ("4" if quick else "8")],
    }


# End-to-end modes of section 4: (row name, pretrain flags). The last is the baseline.
PRETRAIN_MODES = [("muon_layerwise", ["--optimizer=muon", "--dist=layerwise"]),
                  ("adamw_zero1", ["--optimizer=adamw", "--dist=distopt"]),
                  (rl.PRETRAIN_BASELINE, ["--optimizer=muon", "--dist=replicated"])]


# pretrain flags of a timed run: the final eval only, on one batch, and the param checksum compared
# only at the end, so that the steps are what is timed.
PRETRAIN_STEPS_ONLY = ["--eval_every=0", "--eval_batches=1", "--check_every=0"]

# Section 5 (fsdp), all on 2 local ranks: step time per mode (one repeat runs them back to back;
# fp32 Newton-Schulz: this project's CPUs may lack bf16 arithmetic, where bf16 matmuls are ~60x
# slower and would measure that instead of the distribution scheme).
FSDP_COMMON = ["--model=small", "--muon_ns_dtype=fp32"] + PRETRAIN_STEPS_ONLY
FSDP_MODE_FLAGS = {"muon_layerwise": ["--optimizer=muon", "--dist=layerwise"],
                   "adamw_layerwise": ["--optimizer=adamw", "--dist=layerwise"],
                   "muon_fsdp": ["--optimizer=muon", "--dist=fsdp"],
                   "adamw_fsdp": ["--optimizer=adamw", "--dist=fsdp"],
                   "muon_fsdp_no_prefetch": ["--optimizer=muon", "--dist=fsdp",
                                             "--prefetch_params=false"]}
FSDP_MEMORY_DPS = [1, 2, 4]
# A run that only fsdp can do on a 24 GB machine: TinyLlama-1.1B with AdamW (16 bytes per param of
# params, grads and state: 17.6 GB) on 2 ranks; layerwise keeps params and grads whole on both.
FSDP_LARGE = ["--model=tinyllama-1.1b", "--optimizer=adamw", "--steps=3", "--seq_len=64",
              "--global_batch=2", "--lr=3e-4", "--warmup_steps=1"] + PRETRAIN_STEPS_ONLY


def fsdp_args(quick):
    steps = ["--steps=2", "--global_batch=8"] if quick else ["--steps=10", "--global_batch=32"]
    memory = (["--model=small"] if quick else ["--model=gpt2-124m", "--seq_len=64"]) + [
        "--steps=1", "--global_batch=4", "--muon_ns_dtype=fp32"] + PRETRAIN_STEPS_ONLY
    return FSDP_COMMON + steps, memory


# Section 7 (peer), all on 2 local ranks of 1 thread: orthoshard's pretrain against the same GPT
# trained as a PyTorch user would (bench/torch_peer.py, DDP + torch.optim), run back to back per
# model. fp32 Newton-Schulz in both, as in section 5. gpt2-124m at seq 128 and batch 4 for 3 steps:
# Muon's Newton-Schulz (1.7 TFLOP per replicated step, ~30 s at 1 thread a rank) dominates its step
# at any batch, and makes this model most of the section's time.
PEER_SCRIPT = "bench/torch_peer.py"
PEER_ORTHOSHARD_FLAGS = {"orthoshard_muon_layerwise": ["--optimizer=muon", "--dist=layerwise"],
                         "orthoshard_adamw_distopt": ["--optimizer=adamw", "--dist=distopt"],
                         "orthoshard_adamw_distopt_fused": ["--optimizer=adamw", "--dist=distopt",
                                                            "--adamw_fused"],
                         "orthoshard_muon_layerwise_no_overlap": [
                             "--optimizer=muon", "--dist=layerwise", "--overlap_grad_reduce=false",
                             "--overlap_param_gather=false"],
                         "orthoshard_muon_layerwise_direct": ["--optimizer=muon",
                                                              "--dist=layerwise",
                                                              "--muon_ns_form=direct"]}
PEER_TORCH_FLAGS = {"torch_muon": ["--optimizer=muon"], "torch_adamw": ["--optimizer=adamw"],
                    "torch_adamw_fused": ["--optimizer=adamw", "--adamw_fused"]}


def peer_args(quick):
    """{model: (pretrain args, torch_peer args, global batch, seq_len)} for the peer section: the
    same model, batch, sequence and step count on both sides."""
    models = {"small": (8, 0, 3 if quick else 10)}
    if not quick:
        models["gpt2-124m"] = (4, 128, 3)
    out = {}
    for model, (batch, seq, steps) in models.items():
        shared = [f"--model={model}", f"--global_batch={batch}", f"--steps={steps}",
                  "--muon_ns_dtype=fp32", "--num_threads=1"] + ([f"--seq_len={seq}"] if seq else [])
        out[model] = (shared + ["--nproc_per_node=2"] + PRETRAIN_STEPS_ONLY,
                      shared + ["--nproc=2", "--timing_warmup=1"],
                      batch, seq or gpt_shapes.preset(model)["max_seq_len"])
    return out


def precision_args(quick):
    """{model: pretrain args} of the precision section: 2 ranks, layer-wise Muon with fp32
    Newton-Schulz; --precision is added per run. small as in the peer section; gpt2-124m on 2 x 64
    tokens for 3 steps, since a CPU without bf16 arithmetic takes minutes per bf16 step of it."""
    out = {"small": peer_args(True)["small"][0]}
    out["small"] = [a for a in out["small"] if not a.startswith("--steps=")] + [
        "--steps=" + ("3" if quick else "6")]
    if not quick:
        out["gpt2-124m"] = ["--model=gpt2-124m", "--global_batch=2", "--seq_len=64", "--steps=3",
                            "--muon_ns_dtype=fp32", "--num_threads=1", "--nproc_per_node=2"
                            ] + PRETRAIN_STEPS_ONLY
    return out


def cpu_flags():
    """The CPU's flags that decide bf16 speed (bf16 GEMMs need AVX512-BF16 or AMX to beat fp32)."""
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return {flag: flag in have for flag in wanted}
    except OSError:
        pass
    return {}


def run_precision(runner, quick, repeat):
    """One repeat of the precision section: {model: {"fp32"|"bf16"|"bf16_vs_fp32": figures}}, the
    two runs of a model back to back (reversed on odd repeats)."""
    out = {}
    for model, args in precision_args(quick).items():
        order = ["fp32", "bf16"] if repeat % 2 == 0 else ["bf16", "fp32"]
        try:
            got = {p: rl.parse_pretrain(runner.run(BIN["pretrain"], args + [f"--precision={p}"],
                                                   timeout=1800))
                   for p in order}
        except (RuntimeError, rl.ParseError, subprocess.TimeoutExpired) as e:
            print(f"[bench] precision {model} failed: {e}", file=sys.stderr)
            continue  # the other model's rows stand
        rows = {p: {"step_s": got[p]["step_s"], "tokens_per_s": got[p]["tokens_per_s"],
                    "cpu_s_per_step": got[p]["cpu_s_per_step"], "final_loss": got[p]["final_loss"],
                    "param_buffer_bytes": got[p]["param_buffer_bytes"]}
                for p in ("fp32", "bf16")}
        rows["bf16_vs_fp32"] = {
            "speed": got["fp32"]["step_s"] / got["bf16"]["step_s"],
            "cpu": got["bf16"]["cpu_s_per_step"] / got["fp32"]["cpu_s_per_step"],
            "loss_diff": got["bf16"]["final_loss"] - got["fp32"]["final_loss"]}
        out[model] = rows
    return out


def run_peer(runner, quick, repeat):
    """One repeat of the peer section: {model: peer_rows}. The runs of each ratio go back to back,
    in reverse order on odd repeats, so that a load drift does not always favour one side."""
    order = ["orthoshard_muon_layerwise", "torch_muon", "orthoshard_muon_layerwise_direct",
             "orthoshard_adamw_distopt",
             "torch_adamw_fused", "orthoshard_adamw_distopt_fused", "torch_adamw",
             "orthoshard_muon_layerwise_no_overlap"]
    out = {}
    for model, (ours, theirs, batch, seq) in peer_args(quick).items():
        docs = {}
        for mode in order[::-1] if repeat % 2 else order:
            if mode in PEER_ORTHOSHARD_FLAGS:
                text = runner.run(BIN["pretrain"], ours + PEER_ORTHOSHARD_FLAGS[mode])
            else:
                text = runner.run(PEER_SCRIPT, theirs + PEER_TORCH_FLAGS[mode],
                                  interpreter=sys.executable)
            docs[mode] = rl.parse_pretrain(text)
        cfg = gpt_shapes.preset(model)
        out[model] = rl.peer_rows(docs, batch * seq,
                                  gpt_shapes.model_flops_per_step(cfg, batch * seq, seq))
    return out


def run_large(path):
    """The FSDP_LARGE run under layerwise and fsdp: {dist: (exit code, last stderr line or the
    summary JSON)}. Failing is an expected outcome here, so exit codes are returned, not raised."""
    out = {}
    for dist in ("layerwise", "fsdp"):
        args = FSDP_LARGE + [f"--dist={dist}"]
        print(f"[bench] {path} {' '.join(args)}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run([path] + args, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            out[dist] = (None, "timed out after 1800 s")
            continue
        if proc.returncode == 0:
            out[dist] = (0, rl.parse_pretrain(proc.stdout))
        else:
            lines = [l for l in proc.stderr.splitlines() if l.strip()]
            out[dist] = (proc.returncode, lines[-1] if lines else "")
    return out


def command_for(name, args):
    target = "//" + os.path.dirname(BIN[name]) + ":" + os.path.basename(BIN[name])
    return f"bazel run {target}" + (" -- " + " ".join(args) if args else "")


def plot_all(plots_dir, layout_doc, coll_summary, adamw_summary):
    """Writes PNGs; returns {name: path} for those written. Needs matplotlib (tools/setup)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"[bench] no plots: {e}", file=sys.stderr)
        return {}
    os.makedirs(plots_dir, exist_ok=True)
    written = {}
    if layout_doc:
        presets = list(dict.fromkeys(r["preset"] for r in layout_doc["rows"]))
        for fig_name, key, ylabel, scale in [
                ("layout_padding.png", "padding_fraction", "padding (% of params)", 100),
                ("layout_ns_imbalance.png", "ns_cost_imbalance", "NS cost max/mean over ranks", 1)]:
            fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 4), squeeze=False)
            for ax, preset in zip(axes[0], presets):
                styles = {"layerwise": ("o", "-", 9), "megatron_lpt": ("s", "-", 6),
                          "distopt": ("^", "--", 5)}
                for s in rl.STRATEGIES:
                    pts = sorted((r["dp"], r[key] * scale) for r in layout_doc["rows"]
                                 if r["preset"] == preset and r["strategy"] == s)
                    if pts:
                        marker, line, size = styles[s]
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                                linestyle=line, markersize=size, label=s)
                ax.set_xscale("log", base=2)
                dps = sorted({r["dp"] for r in layout_doc["rows"]})
                ax.set_xticks(dps)
                ax.set_xticklabels([str(d) for d in dps])
                ax.set_title(preset)
                ax.set_xlabel("data-parallel size")
                ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3)
                ax.legend()
            fig.tight_layout()
            path = os.path.join(plots_dir, fig_name)
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written[fig_name] = path
    if coll_summary:
        fig, ax = plt.subplots(figsize=(6, 4))
        sizes = list(coll_summary)
        for fig_key, label in [("allreduce", "all-reduce"), ("reduce_scatter", "reduce-scatter"),
                               ("all_gather", "all-gather")]:
            med = [coll_summary[s][fig_key].median for s in sizes]
            lo = [coll_summary[s][fig_key].median - coll_summary[s][fig_key].min for s in sizes]
            hi = [coll_summary[s][fig_key].max - coll_summary[s][fig_key].median for s in sizes]
            ax.errorbar(sizes, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(x) for x in sizes])
        ax.set_xlabel("buffer size (MiB, fp32)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title("Gloo collectives, 2 ranks (median, bars: min to max)")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(plots_dir, "collectives_busbw.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written["collectives_busbw.png"] = path
    return written


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="BENCHMARKS.md")
    p.add_argument("--plots_dir", default="bench/plots")
    p.add_argument("--repeats", type=int, default=None, help="default 3, or 1 with --quick")
    p.add_argument("--quick", action="store_true", help="fewer repeats, smaller sizes (a test run)")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ",".join(SECTIONS))
    p.add_argument("--device", default="cpu", choices=["cpu"],
                   help="only cpu: the GPU variant of the report is not implemented yet")
    a = p.parse_args()
    repeats = a.repeats or (1 if a.quick else 3)
    if repeats < 1:
        p.error("--repeats must be >= 1")
    only = [s for s in a.only.split(",") if s]
    for s in only:
        if s not in SECTIONS:
            p.error(f"--only: unknown section {s!r}; expected some of {','.join(SECTIONS)}")
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", os.getcwd())
    out_path = os.path.join(workspace, a.out)
    plots_dir = os.path.join(workspace, a.plots_dir)

    info = machine_info(workspace)
    load_start = loadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    runner = Runner()
    args = bench_args(a.quick)

    # Which binaries run, in round-robin order per repeat.
    plan = []
    if "optimizers" in only:
        plan.append("optimizers")
    if "distributed" in only:
        plan += ["collectives", "ddp"]
        if os.path.exists(BIN["distributed"]):
            plan.append("distributed")
    if "checkpoint" in only:
        plan.append("checkpoint")
    if "pretrain" in only and os.path.exists(BIN["pretrain"]):
        plan.append("pretrain")
    if "fsdp" in only and os.path.exists(BIN["pretrain"]):
        plan.append("fsdp")
    if "peer" in only and os.path.exists(BIN["pretrain"]):
        plan.append("peer")
    if "precision" in only and os.path.exists(BIN["pretrain"]):
        plan.append("precision")
    fsdp_step_args, fsdp_memory_args = fsdp_args(a.quick)
    raw = {name: [] for name in plan}
    errors = {}
    for rep in range(repeats):
        for name in plan:
            if name in errors:
                continue
            try:
                if name == "pretrain":
                    raw[name].append(rl.pretrain_rows({
                        mode: rl.parse_pretrain(runner.run(BIN[name], args[name] + flags))
                        for mode, flags in PRETRAIN_MODES}))
                elif name == "fsdp":
                    raw[name].append(rl.fsdp_rows({
                        mode: rl.parse_pretrain(runner.run(BIN["pretrain"],
                                                           fsdp_step_args + flags))
                        for mode, flags in FSDP_MODE_FLAGS.items()}))
                elif name == "peer":
                    raw[name].append(run_peer(runner, a.quick, rep))
                elif name == "precision":
                    raw[name].append(run_precision(runner, a.quick, rep))
                elif name in ("optimizers", "checkpoint"):
                    rows = gbench(runner, BIN[name], args[name])
                    raw[name].append(rl.parse_checkpoint(rows) if name == "checkpoint" else rows)
                else:
                    text = runner.run(BIN[name], args[name])
                    parse = {"collectives": rl.parse_collectives, "ddp": rl.parse_ddp,
                             "distributed": rl.parse_distributed}[name]
                    raw[name].append(parse(text))
            except (RuntimeError, rl.ParseError, FileNotFoundError, subprocess.TimeoutExpired) as e:
                errors[name] = str(e)
                print(f"[bench] {name} failed: {e}", file=sys.stderr)
    # Memory is exact arithmetic (no timing): one run per mode and dp.
    fsdp_memory, fsdp_large = None, None
    if "fsdp" in plan:
        try:
            fsdp_memory = rl.summarize([rl.fsdp_memory_rows({
                (dist, dp): rl.parse_pretrain(runner.run(
                    BIN["pretrain"],
                    fsdp_memory_args + [f"--dist={dist}", f"--nproc_per_node={dp}"]))
                for dist in ("layerwise", "fsdp") for dp in FSDP_MEMORY_DPS})])
        except (RuntimeError, rl.ParseError, subprocess.TimeoutExpired) as e:
            errors["fsdp_memory"] = str(e)
        if not a.quick:
            fsdp_large = run_large(BIN["pretrain"])
    layout_doc = None
    if "layout" in only:
        try:
            layout_doc = json.loads(runner.run(BIN["layout"], []))
        except (RuntimeError, FileNotFoundError, json.JSONDecodeError) as e:
            errors["layout"] = str(e)
    summaries = {name: rl.summarize(runs) for name, runs in raw.items()
                 if runs and name not in ("peer", "precision")}
    for name in ("peer", "precision"):
        if raw.get(name):  # per model
            summaries[name] = {model: rl.summarize([r[model] for r in raw[name]])
                               for model in raw[name][0] if all(model in r for r in raw[name])}
    moe_md = None  # section 9: its own runs (bench/moe_bench.py), after the others
    if "moe" in only and os.path.exists(BIN["pretrain"]):
        try:
            moe_md = moe_bench.section(BIN["pretrain"], a.quick, repeats)
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            errors["moe"] = str(e)
            print(f"[bench] moe failed: {e}", file=sys.stderr)
    tp_plan_md = None  # section 10: exact arithmetic of the plan tool, no timing, no repeats
    if "tp_plan" in only:
        try:
            tp_plan_md = tp_plan_bench.section(BIN["tp_plan"])
        except (RuntimeError, ValueError, KeyError, OSError, subprocess.TimeoutExpired) as e:
            errors["tp_plan"] = str(e)
            print(f"[bench] tp_plan failed: {e}", file=sys.stderr)
    tp_md = None  # section 11: its own runs (bench/tp_bench.py)
    if "tp" in only and os.path.exists(BIN["pretrain"]) and os.path.exists(BIN["tp_muon"]):
        try:
            tp_md = tp_bench.section(BIN["pretrain"], BIN["tp_muon"], a.quick, repeats)
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            errors["tp"] = str(e)
            print(f"[bench] tp failed: {e}", file=sys.stderr)
    memory_md = None  # section 12: its own runs (bench/memory_bench.py)
    if "memory" in only and os.path.exists(BIN["pretrain"]):
        try:
            memory_md, memory_log = memory_bench.section(BIN["pretrain"], a.quick, repeats)
            runner.log += [("integration/pretrain", x, t, rc) for _, x, t, rc in memory_log]
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            errors["memory"] = str(e)
            print(f"[bench] memory failed: {e}", file=sys.stderr)
    load_end = loadavg()
    finished = datetime.datetime.now(datetime.timezone.utc)

    plots = plot_all(plots_dir, layout_doc, summaries.get("collectives"),
                     summaries.get("optimizers"))
    rel = lambda path: os.path.relpath(path, os.path.dirname(out_path))  # noqa: E731

    flags = (["--quick"] if a.quick else []) + [f"--repeats={repeats}"]
    md = ["# orthoshard benchmarks", "",
          "Generated by `bazel run //bench:report -- " + " ".join(flags) + "`. "
          f"Every figure is the median of {repeats} run(s) of the benchmark process with "
          "[min, max] over them in brackets; every ratio is computed within one run (numerator and baseline measured in the "
          "same process, back to back) and then summarised. The repeats of all benchmarks are "
          "interleaved round-robin so that load drift hits them alike. The machine is shared "
          "(others compile on it): compare ratios, not absolute times.", "",
          "## Machine", "",
          rl.markdown_table(["", ""], [
              ["CPU", info["cpu"]], ["cores", info["cores"]], ["memory", info["memory"]],
              ["kernel", info["kernel"]],
              ["load average (1/5/15 min) at start", load_start],
              ["load average at end", load_end],
              ["started (UTC)", started.strftime("%Y-%m-%d %H:%M:%S")],
              ["finished (UTC)", finished.strftime("%Y-%m-%d %H:%M:%S")],
              ["git commit", info["commit"] + (" (with uncommitted changes)" if info["dirty"] else "")],
              ["device", "cpu"],
              ["mode", "quick (smaller sizes)" if a.quick else "full"]]), ""]

    def failed(name):
        return f"**Not measured: `{name}` failed in this run:** `{errors[name][:300]}`\n"

    # 1. Layout.
    if "layout" in only:
        md += ["## 1. Layout: padding, buckets and Newton–Schulz cost imbalance", "",
               "Exact arithmetic over the plan (layout/metrics.h), no timing, so no spread. Megatron's "
               "default bucket size max(40M, 1M·dp) elements, fp32 grads, summed over every buffer of "
               "the model. *padding %*: (padded − unpadded) / unpadded elements. *NS imbalance*: the "
               "busiest rank's Newton–Schulz cost (max(m,n)·min(m,n)² per matrix, pro rata for a "
               "matrix split by distopt) over the mean: how much longer the optimizer step takes than "
               "a perfectly balanced one. distopt's matrices straddle shards, so its figure is the "
               "pro-rata cost, not a runnable schedule.", "",
               f"Reproduce: `{command_for('layout', [])}` (JSON).", ""]
        if layout_doc:
            for preset, table in rl.layout_tables(layout_doc).items():
                md += [f"### {preset}", "", table, ""]
            for png in ("layout_padding.png", "layout_ns_imbalance.png"):
                if png in plots:
                    md += [f"![{png}]({rel(plots[png])})", ""]
        else:
            md.append(failed("layout"))

    # 2. Optimizer kernels.
    if "optimizers" in only:
        md += ["## 2. Optimizer kernels", "",
               "Muon: one step on a 1024×4096 fp32 matrix next to the time of the at::mm products its "
               "Newton–Schulz iteration contains (5 × [X·Xᵀ, A·A, A·X]), same iteration. AdamW: "
               "bytes/s counting the 7 fp32 passes of an ideal fused step, next to a plain tensor "
               "copy (2 passes) of the same size, same iteration.", "",
               f"Reproduce: `{command_for('optimizers', args['optimizers'])}`", ""]
        if "optimizers" in summaries:
            md += [rl.muon_table(summaries["optimizers"]), "",
                   rl.muon_elementwise_table(summaries["optimizers"]), "",
                   rl.adamw_table(summaries["optimizers"]), "",
                   rl.adamw_fused_table(summaries["optimizers"]), ""]
        else:
            md.append(failed("optimizers"))

    # 3. Distributed step.
    if "distributed" in only:
        md += ["## 3. Distributed step on 2 CPU Gloo ranks", "",
               "### Collectives: bus bandwidth vs size", "",
               "busbw as nccl-tests define it (all-reduce algbw·2(N−1)/N, reduce-scatter and "
               "all-gather algbw·(N−1)/N), so an optimal implementation of each reaches the same "
               "busbw. The Gloo communicator's reduce-scatter and all-gather are rings over Gloo's "
               "send/recv (collectives/internal/ring.h); its all-reduce is Gloo's own.", "",
               f"Reproduce: `{command_for('collectives', args['collectives'])}`", ""]
        if "collectives" in summaries:
            md += [rl.collectives_table(summaries["collectives"]), ""]
            if "collectives_busbw.png" in plots:
                md += [f"![collectives_busbw.png]({rel(plots['collectives_busbw.png'])})", ""]
        else:
            md.append(failed("collectives"))
        md += ["### DDP: overlap of the gradient reduce-scatter with backward", "",
               "Median ms per step of each mode (the benchmark's own median over its steps), then "
               "median [min, max] over the repeats. *exposed comm*: end of backward to end of the grad "
               "sync. *step / off*: step time over overlap-off, same run.", "",
               f"Reproduce: `{command_for('ddp', args['ddp'])}`", ""]
        if "ddp" in summaries:
            s = summaries["ddp"]
            md += [rl.ddp_table(s), ""]
            sm = s.get("summary", {})
            md += ["| figure | value |", "|---|---:|",
                   f"| hidden share of the grad reduce-scatter, 1 − exposed(on)/exposed(off) | "
                   f"{rl.stat_cell(sm, 'hidden_share', 1, 100, '%')} |",
                   f"| net hidden share (backward slowdown counted) | "
                   f"{rl.stat_cell(sm, 'net_hidden_share', 1, 100, '%')} |",
                   f"| logical traffic per step (counters) MB | {rl.stat_cell(sm, 'traffic_MB')} |",
                   f"| grad buffer MB | {rl.stat_cell(sm, 'buffer_MB')} |",
                   f"| ideal wire 2(N−1)/N × buffer MB | {rl.stat_cell(sm, 'ideal_MB')} |",
                   f"| wire sent by rank 0 per step (counters; Gloo's reduce-scatter and all-gather "
                   f"are rings) MB | {rl.stat_cell(sm, 'wire_MB')} |", ""]
        else:
            md.append(failed("ddp"))
        md += ["### Distributed optimizer: layerwise vs distopt vs replicated", ""]
        if "distributed" in summaries:
            md += ["Step + param sync per mode; *vs replicated* is the ratio to the replicated mode "
                   "of the same optimizer (Muon or AdamW) in the same run. Wire bytes per rank are "
                   "ring estimates from the communicator's counters, next to the ideal of an "
                   "all-reduce of the grad buffer. distopt runs AdamW only (`distopt_adamw`): the "
                   "matrices of a byte-level layout straddle shards and cannot be orthogonalised "
                   "from a slice, which is what the layer-wise layout fixes.", "",
                   f"Reproduce: `{command_for('distributed', args['distributed'])}`", "",
                   rl.distributed_table(summaries["distributed"]), ""]
        elif "distributed" in errors:
            md.append(failed("distributed"))
        else:
            md += ["Not measured yet: `//optimizers/distributed:distributed_benchmark` is not in "
                   "this build.", ""]

    # 4. End to end.
    if "pretrain" in only:
        md += ["## 4. End to end: pretrain tokens/s", ""]
        if "pretrain" in summaries:
            md += ["`pretrain` on 2 local CPU Gloo ranks, `small` preset (4 layers, C 256, GQA), "
                   "synthetic corpus; tokens/s as the run's summary line reports it (whole run, "
                   "eval and start-up of the step loop included, so short runs understate "
                   "steady state). *vs replicated Muon*: over the `--optimizer=muon "
                   "--dist=replicated` run of the same repeat. Modes: muon_layerwise = "
                   "`--optimizer=muon --dist=layerwise`, adamw_zero1 = `--optimizer=adamw "
                   "--dist=distopt`.", "",
                   "Reproduce: " + ", ".join(
                       f"`{command_for('pretrain', args['pretrain'] + f)}`"
                       for _, f in PRETRAIN_MODES), "",
                   rl.pretrain_table(summaries["pretrain"]), ""]
        elif "pretrain" in errors:
            md.append(failed("pretrain"))
        else:
            md += ["Not measured yet: `//integration:pretrain` is not in this build.", ""]

    # 5. Parameter sharding.
    if "fsdp" in only:
        md += ["## 5. Parameter sharding (ZeRO-3): `--dist=fsdp` against `--dist=layerwise`", "",
               "`--dist=fsdp` keeps on each rank only its shard of every bucket — params, grads and "
               "optimizer state — and gathers a layer's bucket groups before its forward and again "
               "before its backward, prefetching the next layer's, and reduce-scatters each group's "
               "gradients as soon as they are complete. Muon matrices stay whole inside one rank's "
               "shard (the layer-wise layout), so Muon adds no communication: the gathers and "
               "reduce-scatters are those AdamW needs too. Both modes train bitwise the same params "
               "(`//integration:fsdp_test`).", ""]
        md += ["### Memory per rank", "",
               "The most any rank holds persistently (params + grads + optimizer state, fp32, "
               "Muon for the hidden matrices), from the run's summary, against the ideal: the whole "
               "model's (layerwise at dp 1) divided by dp. *transient peak*: the most gathered "
               "params and full grads a fsdp rank held at once (the whole buffers, params and "
               "grads, are 2× the params column of dp 1).", "",
               "Reproduce: " + ", ".join(
                   f"`{command_for('pretrain', fsdp_memory_args + [f'--dist={d}', f'--nproc_per_node={n}'])}`"
                   for d in ("layerwise", "fsdp") for n in (2,)) + " (and dp 1, 4)", ""]
        if fsdp_memory:
            md += [rl.fsdp_memory_table(fsdp_memory), ""]
        elif "fsdp_memory" in errors:
            md.append(failed("fsdp_memory"))
        md += ["### Step time, communication and overlap (2 ranks, `small`)", "",
               "Step time is the mean over the run's steps (evals excluded). *waited on*: time "
               "rank 0 spent blocked in the waits for param gathers and grad syncs per step (what "
               "overlap did not hide). *logical bytes / ideal*: the communicator's logical bytes "
               "per step (the full tensor of each collective) over 2× the param buffer for "
               "layerwise (reduce-scatter + all-gather) and 3× for fsdp (all-gather for forward, "
               "again for backward, reduce-scatter); the wire bytes of a ring are (N−1)/N of the "
               "logical ones (the Gloo communicator's reduce-scatter and all-gather are such rings).", "",
               "Reproduce: " + ", ".join(f"`{command_for('pretrain', fsdp_step_args + f)}`"
                                         for f in FSDP_MODE_FLAGS.values()), ""]
        if "fsdp" in summaries:
            md += [rl.fsdp_step_table(summaries["fsdp"]), "", rl.fsdp_ratio_table(summaries["fsdp"]),
                   ""]
        elif "fsdp" in errors:
            md.append(failed("fsdp"))
        if fsdp_large:
            md += ["### A run only fsdp can do here", "",
                   "TinyLlama-1.1B's shape (`--model=tinyllama-1.1b`, 1.10B params) with AdamW on 2 "
                   "ranks of this machine: params + grads + AdamW state are 16 bytes per param, "
                   "17.6 GB in all.", "",
                   "Reproduce: " + ", ".join(
                       f"`{command_for('pretrain', FSDP_LARGE + [f'--dist={d}'])}`"
                       for d in ("layerwise", "fsdp")), ""]
            for dist, (code, result) in fsdp_large.items():
                if code == 0:
                    md.append(
                        f"- `--dist={dist}`: trained {result['steps']} steps, loss "
                        f"{result['initial_loss']:.3f} → {result['final_loss']:.3f} (eval "
                        f"{result['initial_eval_loss']:.3f} → {result['eval_loss']:.3f}), "
                        f"{1000 * result['elapsed_s'] / result['steps']:.0f} ms per step; per rank "
                        f"{result['max_persistent_bytes'] / 2**30:.2f} GiB persistent + "
                        f"{result['max_peak_transient_bytes'] / 2**30:.2f} GiB transient peak.")
                else:
                    md.append(f"- `--dist={dist}`: exit {code}: `{result[:400]}`")
            md.append("")

    # 6. Checkpoint.
    if "checkpoint" in only:
        md += ["## 6. Checkpoint: save/load vs plain write/read of the same bytes", "",
               "256 MiB (64 × 4 MiB fp32 tensors) under $TMPDIR. Writes include fsync; reads run "
               "with a warm page cache. Ratio: bytes/s over the baseline's bytes/s in the same run.",
               "", f"Reproduce: `{command_for('checkpoint', args['checkpoint'])}`", ""]
        if "checkpoint" in summaries:
            md += [rl.checkpoint_table(summaries["checkpoint"]), ""]
        else:
            md.append(failed("checkpoint"))

    # 7. PyTorch peer.
    if "peer" in only:
        md += ["## 7. orthoshard against a plain PyTorch peer", "",
               "The same GPT trained by `pretrain` and by `bench/torch_peer.py`, what a PyTorch "
               "user writes for it: nn.Module with separate q/k/v and gate/up Linears (the same "
               "params, FLOPs and Muon matrices as orthoshard's fused ones), "
               "`DistributedDataParallel` over Gloo (default buckets, every rank steps every "
               "param), `torch.optim.Muon` for the hidden matrices + `torch.optim.AdamW` for the "
               "rest (or AdamW for all; torch's default implementation, on CPU its for-loop, or "
               "`fused=True`), `clip_grad_norm_`, pretrain's hyperparameters; orthoshard's "
               "ZeRO-1 AdamW runs in its default slice-invariant order and with `--adamw_fused` "
               "(the same ATen kernel as `fused=True`); layer-wise Muon runs its default "
               "`--muon_ns_form=auto`, which for the fp32 iteration is Newton–Schulz on the Gram "
               "matrix where a matrix is at least twice as long as wide (the same iteration "
               "rearranged, ~30% fewer FLOPs there), and also `_direct` (`--muon_ns_form=direct`: "
               "the peer's own products, bitwise); `_no_overlap`: overlap off, for the "
               "exposed-communication ratio. Both on 2 "
               "local ranks of 1 thread, fp32 Newton–Schulz (torch.optim.Muon's bf16 iteration "
               "swapped for the same one in fp32, as `--muon_ns_dtype=fp32` does in pretrain), "
               "synthetic byte-level text of the same grammar; the two runs of each ratio go back "
               "to back (in reverse order on odd repeats). "
               "*step s*: the median step after the first on both sides (pretrain's summary's "
               "`step_s`; a pretrain without it gives its whole-run tokens/s, first step "
               "included: *step time from* says which). *CPU s per step*: user + sys of every "
               "rank's process over the same steps. *MFU*: model FLOPs per step (PaLM appendix "
               "B: 6 × matmul params + 12·L·H·D·T per token, `bench/gpt_shapes.py`) over the "
               "step time and over what `torch.mm` reaches on the model's own forward GEMM "
               "shapes with every rank running at once (the highest that the peer runs of the "
               "same repeat measured). Each ratio is taken within one repeat, then summarised.",
               "",
               "Step breakdown, per step: *forward* (orthoshard: with its pre-forward hooks' "
               "waits on the param all-gathers), *backward* (compute), *optimizer* (clip + "
               "step), *exposed comm*: communication on the step's critical path, the least "
               "time any rank waited on it (orthoshard: per step, grad syncs after backward + "
               "param gathers, `exposed_comm_s`; the peer: its backward under DDP minus the "
               "same backward under `ddp.no_sync()`, least over ranks), *rank skew*: the most "
               "any rank waited minus the least, time the faster ranks spent waiting for the "
               "slowest (uneven work or a noisy machine: no overlap hides it), *rank 0 waits*: "
               "what rank 0 waited on grad syncs + param gathers (`grad_sync_wait_s` + "
               "`param_gather_wait_s`, over every step), skew included. Means over the steady "
               "steps; forward, backward, optimizer: rank 0's for pretrain, the max over ranks "
               "for the peer.", ""]
        for model, (ours, theirs, batch, seq) in peer_args(a.quick).items():
            cfg = gpt_shapes.preset(model)
            md += [f"### {model}", "",
                   f"{gpt_shapes.param_count(cfg):,} params, {batch} × {seq} tokens per step: "
                   f"{gpt_shapes.model_flops_per_step(cfg, batch * seq, seq) / 1e9:.1f} GFLOP "
                   f"of model per step, and {gpt_shapes.muon_ns_flops(cfg) / 1e9:.1f} GFLOP of "
                   "Newton–Schulz per Muon step (every rank does all of it in the peer; the "
                   "layer-wise mode splits the matrices over the ranks).", "",
                   "Reproduce: " + ", ".join(
                       [f"`{command_for('pretrain', ours + f)}`"
                        for f in PEER_ORTHOSHARD_FLAGS.values()]
                       + [f"`tools/python3 {PEER_SCRIPT} {' '.join(theirs + f)}`"
                          for f in PEER_TORCH_FLAGS.values()]), ""]
            if model in summaries.get("peer", {}):
                s = summaries["peer"][model]
                md += [rl.peer_table(s), "", rl.peer_ratio_table(s), "",
                       rl.peer_breakdown_table(s), ""]
        if "peer" in errors:
            md.append(failed("peer"))
        elif "peer" not in summaries:
            md += ["Not measured: `//integration:pretrain` is not in this build.", ""]

    # 8. Precision.
    if "precision" in only:
        flags_line = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu_flags().items())
        md += ["## 8. bf16 mixed precision against fp32", "",
               "`pretrain --precision=bf16` (bf16 params and activations, fp32 norms' and "
               "attention's accumulation, fp32 loss, fp32 main params, grads and optimizer state) "
               "against `--precision=fp32` on the same model, batch and seed, 2 ranks, layer-wise "
               "Muon with fp32 Newton–Schulz, back to back (reversed on odd repeats). *speed*: "
               "fp32 step s / bf16 step s (> 1: bf16 faster). *CPU*: bf16 CPU s per step / "
               "fp32's. *loss diff*: bf16 − fp32 training loss after the run's steps. bf16 GEMM "
               "speed depends on the CPU: without AVX512-BF16 or AMX, ATen/oneDNN convert bf16 to "
               "fp32 around fp32 arithmetic, so bf16 is slower than fp32.", "",
               f"CPU flags: {flags_line}.", ""]
        for model, args in precision_args(a.quick).items():
            md += [f"### {model}", "", "Reproduce: " + ", ".join(
                f"`{command_for('pretrain', args + [f'--precision={p}'])}`"
                for p in ("fp32", "bf16")), ""]
            s = summaries.get("precision", {}).get(model)
            if s:
                md += [rl.markdown_table(
                    ["precision", "step s", "tokens/s", "CPU s per step", "final loss",
                     "param bytes"],
                    [[p, s[p]["step_s"].format(3), s[p]["tokens_per_s"].format(0),
                      s[p]["cpu_s_per_step"].format(3), s[p]["final_loss"].format(4),
                      s[p]["param_buffer_bytes"].format(0)] for p in ("fp32", "bf16")]), "",
                       rl.markdown_table(["bf16 vs fp32", "speed", "CPU", "loss diff"], [[
                           "ratio", s["bf16_vs_fp32"]["speed"].format(2),
                           s["bf16_vs_fp32"]["cpu"].format(2),
                           s["bf16_vs_fp32"]["loss_diff"].format(4)]]), ""]
            elif "precision" in summaries:
                md += ["Not measured: a run of this model failed or timed out (see the run log).", ""]
        if "precision" in errors:
            md.append(failed("precision"))

    # 9. Mixture of experts.
    if "moe" in only:
        md += ["## 9. Mixture of experts: Muon on whole experts, all-to-all, expert memory", "",
               "Reproduce: `tools/python3 bench/moe_bench.py --pretrain=bazel-bin/integration/"
               "pretrain` (after `bazel build //integration:pretrain`).", ""]
        md += [moe_md, ""] if moe_md else [failed("moe") if "moe" in errors else
                                           "Not measured: `//integration:pretrain` is not built.",
                                           ""]

    # 10. Tensor-parallel Muon planning.
    if "tp_plan" in only:
        md += ["## 10. Tensor-parallel Muon: planning", "",
               "Reproduce: `bazel run //layout:plan -- --preset=llama3_8b_gqa --tp=1,2,4,8 "
               "--dp=8,64,1024` (a text table; `--format=json` for this section's input), or "
               "`tools/python3 bench/tp_plan_bench.py --plan=bazel-bin/layout/plan`.", ""]
        md += [tp_plan_md, ""] if tp_plan_md else [failed("tp_plan"), ""]

    # 11. Tensor parallelism, measured.
    if "tp" in only:
        md += ["## 11. Tensor parallelism: owner-mode Muon, TP vs DP, memory per rank", "",
               "Reproduce: `tools/python3 bench/tp_bench.py --pretrain=bazel-bin/integration/"
               "pretrain --tp_muon=bazel-bin/optimizers/distributed/tp_muon_benchmark` (after "
               "`bazel build //integration:pretrain //optimizers/distributed:tp_muon_benchmark`).",
               ""]
        md += [tp_md, ""] if tp_md else [failed("tp") if "tp" in errors else
                                         "Not measured: a binary is not built.", ""]

    # 12. Memory: activation recompute, fsdp's bounded peak, the longest run.
    if "memory" in only:
        md += ["## 12. Memory: activation recompute, fsdp's peak, long sequences", "",
               "Reproduce: `tools/python3 bench/memory_bench.py --pretrain=bazel-bin/integration/"
               "pretrain` (after `bazel build //integration:pretrain`); every run's command is in "
               "the run log below. Per-rank figures from each run's summary JSON: "
               "`allocator_peak_bytes` is LibTorch's CPU allocator's own count of tensor memory at "
               "its peak, `max_rss_bytes` the process's peak resident memory (the same plus about "
               "160 MB of LibTorch, Gloo and the C heap).", ""]
        md += [memory_md, ""] if memory_md else [failed("memory") if "memory" in errors else
                                                 "Not measured: a binary is not built.", ""]

    md += ["## Run log", "", rl.markdown_table(
        ["binary", "arguments", "wall s", "exit"],
        [[f"`{b}`", " ".join(x) or "–", f"{t:.1f}", rc] for b, x, t, rc in runner.log]), ""]
    text = "\n".join(md)
    if set(only) != set(SECTIONS) and os.path.exists(out_path):
        # A partial run updates its sections of the full report and keeps the others (whose header
        # describes the run that measured them); each updated section says where it came from.
        provenance = (
            f"This section was generated on its own, `bazel run //bench:report -- "
            f"{' '.join(flags + ['--only=' + ','.join(only)])}`, {started.strftime('%Y-%m-%d %H:%M')}"
            f"–{finished.strftime('%H:%M')} UTC, on {info['cpu']} ({info['cores']} cores, "
            f"{info['memory']}), load average {load_start} at the start and {load_end} at the end, "
            f"commit {info['commit'][:7]}{' with uncommitted changes' if info['dirty'] else ''}. "
            f"The other sections are from the runs described above.\n")
        with open(out_path) as f:
            text = rl.merge_sections(f.read(), text, provenance)
    elif os.path.exists(out_path):
        with open(out_path) as f:
            text = rl.carry_summary(f.read(), text)
    with open(out_path, "w") as f:
        f.write(rl.wrap_markdown(text))
    print(f"[bench] wrote {out_path}" + (f" and {len(plots)} plot(s) in {plots_dir}" if plots else ""),
          file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
