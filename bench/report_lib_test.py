"""Tests of report_lib: parsing of canned benchmark output (in the exact formats the binaries
print) and the Markdown tables rendered from it. Runs no benchmark."""

import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_shapes  # noqa: E402
import report_lib as rl  # noqa: E402

# Multi-rank binaries print through the launcher: "[rank N] " before every line.

# Google Benchmark 1.7 --benchmark_out JSON, trimmed (context shortened).
GBENCH = json.dumps({
    "context": {"date": "2026-11-22T03:00:00+00:00", "num_cpus": 2},
    "benchmarks": [
        {"name": "BM_MuonStep/0/0/manual_time", "family_index": 0, "per_family_instance_index": 0,
         "run_name": "BM_MuonStep/0/0/manual_time", "run_type": "iteration", "repetitions": 1,
         "repetition_index": 0, "threads": 1, "iterations": 10, "real_time": 40.0,
         "cpu_time": 80.0, "time_unit": "ms", "mm_fraction": 0.85, "mm_ms": 34.0,
         "muon_ms": 40.0, "ns_ms": 37.0, "mm_over_ns": 0.919, "threads": 2},
        {"name": "BM_MuonStep/1/1/manual_time", "run_name": "BM_MuonStep/1/1/manual_time",
         "run_type": "iteration", "iterations": 5, "real_time": 90.0, "cpu_time": 90.0,
         "time_unit": "ms", "mm_fraction": 0.9, "mm_ms": 81.0, "muon_ms": 90.0, "threads": 1},
        {"name": "BM_AdamWStep/1048576/manual_time", "run_name": "BM_AdamWStep/1048576/manual_time",
         "run_type": "iteration", "iterations": 100, "real_time": 1.5, "cpu_time": 1.5,
         "time_unit": "ms", "adamw_GBps": 19.5, "copy_GBps": 10.0, "ratio": 1.95, "threads": 2},
        {"name": "BM_MuonElementwise/manual_time", "run_name": "BM_MuonElementwise/manual_time",
         "run_type": "iteration", "iterations": 50, "real_time": 4.0, "cpu_time": 8.0,
         "time_unit": "ms", "aten_ms": 6.0, "fused_ms": 4.0, "speedup": 1.5, "threads": 2},
        {"name": "BM_AdamWFused/1048576/manual_time", "run_name": "BM_AdamWFused/1048576/manual_time",
         "run_type": "iteration", "iterations": 100, "real_time": 1.5, "cpu_time": 3.0,
         "time_unit": "ms", "aten_ms": 3.0, "fused_ms": 1.5, "speedup": 2.0, "aten_fused_ms": 2.0,
         "aten_fused_speedup": 1.5, "threads": 2},
        {"name": "BM_AdamWStep/1048576/manual_time_mean", "run_name": "BM_AdamWStep/1048576/manual_time",
         "run_type": "aggregate", "aggregate_name": "mean", "real_time": 1.5, "ratio": 99.0},
    ],
})

CHECKPOINT = json.dumps({"benchmarks": [
    {"name": "BM_PlainWrite/iterations:5/real_time", "run_name": "BM_PlainWrite/iterations:5/real_time",
     "run_type": "iteration", "real_time": 200.0, "bytes_per_second": 1.0e9},
    {"name": "BM_CheckpointSave/iterations:5/real_time",
     "run_name": "BM_CheckpointSave/iterations:5/real_time", "run_type": "iteration",
     "real_time": 250.0, "bytes_per_second": 8.0e8},
    {"name": "BM_PlainRead/iterations:10/real_time", "run_name": "BM_PlainRead/iterations:10/real_time",
     "run_type": "iteration", "real_time": 50.0, "bytes_per_second": 4.0e9},
    {"name": "BM_SafetensorsRead/iterations:10/real_time",
     "run_name": "BM_SafetensorsRead/iterations:10/real_time", "run_type": "iteration",
     "real_time": 100.0, "bytes_per_second": 2.0e9},
]})

COLLECTIVES = """[rank 0] gloo, 2 ranks, fp32, median of N timed runs after 1 warm-up
[rank 0]  size_MB    N    allreduce  reduce_scat   all_gather      rs/ar      ag/ar
[rank 0]              busbw_GB/s   busbw_GB/s   busbw_GB/s      busbw      busbw
[rank 0]        1   20        1.500        0.750        1.200      0.500      0.800
[rank 0]        2   20        2.000        1.100        1.800      0.550      0.900
[rank 0] logical traffic launched by rank 0: all_reduce 63.0 MB in 42 calls, reduce_scatter 42.0 MB, all_gather 42.0 MB
[rank 1]        1   20        9.000        9.000        9.000      9.000      9.000
"""

DDP = """[rank 0] DDP step at 2 Gloo ranks: 8 layers of [1024, 1024] + bias, batch 64, 2 buckets, 16 steps per mode (median, ms)
[rank 0] mode                     forward  backward  exposed comm  param sync      step    step/off
[rank 0] overlap off                 5.10     12.00          8.00        0.00     25.00       1.000
[rank 0] overlap_grad_reduce         5.20     13.00          2.00        0.00     20.00       0.800
[rank 0] overlap grad + param        5.30     13.50          2.10        0.50     19.00       0.760
[rank 0] hidden share of grad reduce-scatter time: 75.0% (1 - exposed(on) / exposed(off))
[rank 0] net hidden share (backward slowdown counted): 62.5% (1 - (backward(on) + exposed(on) - backward(off)) / exposed(off))
[rank 0] traffic per step: 67.18 MB logical (counters: reduce-scatter + all-gather), buffer 33.59 MB; ideal wire 2(N-1)/N x buffer = 33.59 MB; wire sent by rank 0 (counters) = 33.59 MB
"""

DISTRIBUTED = """[rank 0] 2 ranks, 10 iterations, model 8 x [512, 512] Muon + norms + [2048, 512] embedding
[rank 0] mode              step+sync ms    ratio grad sync ms      RS MB      AG MB      AR MB  wire MB/rank     ideal MB
[rank 0] replicated               40.00    1.000         5.00       0.00       0.00      12.00         12.00        12.00
[rank 0] layerwise                25.00    0.625         4.00      12.00       6.00       0.00          9.00        12.00
[rank 0] ratio: step+sync time / the replicated mode of the same optimizer, same run
"""

LAYOUT = {"rows": [
    {"preset": "gpt8b", "dp": 2, "strategy": "layerwise", "buckets": 3, "padding_fraction": 0.00012,
     "ns_cost_imbalance": 1.0123},
    {"preset": "gpt8b", "dp": 2, "strategy": "megatron_lpt", "buckets": 3, "padding_fraction": 0.5,
     "ns_cost_imbalance": 1.25},
    {"preset": "gpt8b", "dp": 2, "strategy": "distopt", "buckets": 2, "padding_fraction": 0.0,
     "ns_cost_imbalance": 1.0},
]}


class StatTest(unittest.TestCase):
    def test_median_and_range(self):
        s = rl.Stat([3.0, 1.0, 2.0])
        self.assertEqual(s.median, 2.0)
        self.assertEqual(s.format(1), "2.0 [1.0, 3.0]")
        self.assertEqual(s.format(0, 100, "%"), "200% [100, 300]")

    def test_single_value_has_no_range(self):
        self.assertEqual(rl.Stat([0.5]).format(3), "0.500")

    def test_summarize_keeps_rows_present_in_every_run(self):
        runs = [{"a": {"x": 1.0}, "b": {"x": 5.0}}, {"a": {"x": 3.0}}]
        s = rl.summarize(runs)
        self.assertEqual(list(s), ["a"])
        self.assertEqual(s["a"]["x"].values, [1.0, 3.0])
        self.assertEqual(s["a"]["x"].median, 2.0)


class ParseTest(unittest.TestCase):
    def test_gbench_json_skips_aggregates(self):
        rows = rl.parse_gbench_json(GBENCH)
        self.assertEqual(sorted(rows), ["BM_AdamWFused/1048576/manual_time",
                                        "BM_AdamWStep/1048576/manual_time",
                                        "BM_MuonElementwise/manual_time",
                                        "BM_MuonStep/0/0/manual_time",
                                        "BM_MuonStep/1/1/manual_time"])
        self.assertEqual(rows["BM_AdamWStep/1048576/manual_time"]["ratio"], 1.95)
        self.assertEqual(rows["BM_MuonStep/0/0/manual_time"]["threads"], 2)

    def test_gbench_error_is_reported(self):
        doc = json.dumps({"benchmarks": [{"name": "BM_X", "run_type": "iteration",
                                          "error_occurred": True, "error_message": "planning failed"}]})
        with self.assertRaisesRegex(rl.ParseError, "BM_X: planning failed"):
            rl.parse_gbench_json(doc)

    def test_gbench_rejects_non_json(self):
        with self.assertRaisesRegex(rl.ParseError, "benchmark JSON"):
            rl.parse_gbench_json("not json")

    def test_collectives(self):
        rows = rl.parse_collectives(COLLECTIVES)
        self.assertEqual(list(rows), [1, 2])
        self.assertEqual(rows[2], {"allreduce": 2.0, "reduce_scatter": 1.1, "all_gather": 1.8,
                                   "rs_over_ar": 0.55, "ag_over_ar": 0.9})

    def test_collectives_without_rows_fails(self):
        with self.assertRaisesRegex(rl.ParseError, "no size rows"):
            rl.parse_collectives("gloo, 2 ranks\n")

    def test_ddp(self):
        rows = rl.parse_ddp(DDP)
        self.assertEqual(rows["overlap_grad_reduce"]["exposed"], 2.0)
        self.assertEqual(rows["overlap grad + param"]["param_sync"], 0.5)
        self.assertEqual(rows["summary"], {"hidden_share": 0.75, "net_hidden_share": 0.625,
                                           "traffic_MB": 67.18, "buffer_MB": 33.59,
                                           "ideal_MB": 33.59, "wire_MB": 33.59})

    def test_distributed(self):
        rows = rl.parse_distributed(DISTRIBUTED)
        self.assertEqual(list(rows), ["replicated", "layerwise"])
        self.assertEqual(rows["layerwise"]["ratio"], 0.625)
        self.assertEqual(rows["layerwise"]["wire_MB"], 9.0)

    def test_checkpoint_ratios_against_same_run_baseline(self):
        rows = rl.parse_checkpoint(rl.parse_gbench_json(CHECKPOINT))
        self.assertAlmostEqual(rows["BM_CheckpointSave"]["vs_baseline"], 0.8)
        self.assertAlmostEqual(rows["BM_SafetensorsRead"]["vs_baseline"], 0.5)
        self.assertAlmostEqual(rows["BM_PlainRead"]["MBps"], 4000.0)

    def test_pretrain_last_line_json(self):
        self.assertEqual(rl.parse_pretrain("step 1\n{\"tokens_per_s\": 123.5}\n\n"),
                         {"tokens_per_s": 123.5})
        with self.assertRaisesRegex(rl.ParseError, "last line is not JSON"):
            rl.parse_pretrain("step 1\n")


class RenderTest(unittest.TestCase):
    def test_muon_and_adamw_tables_over_two_runs(self):
        run1 = rl.parse_gbench_json(GBENCH)
        run2 = json.loads(GBENCH)
        run2["benchmarks"][0]["muon_ms"] = 50.0
        run2["benchmarks"][0]["mm_fraction"] = 0.65
        run2["benchmarks"][2]["ratio"] = 2.05
        s = rl.summarize([run1, rl.parse_gbench_json(json.dumps(run2))])
        self.assertEqual(rl.muon_table(s).splitlines(), [
            "| Muon step 1024×4096 | step ms | its at::mm ms | mm / step | NS alone ms | mm / NS |",
            "|---|---:|---:|---:|---:|---:|",
            "| bf16 NS, default threads (2) | 45.00 [40.00, 50.00] | 34.00 [34.00, 34.00] "
            "| 0.750 [0.650, 0.850] | 37.00 [37.00, 37.00] | 0.919 [0.919, 0.919] |",
            "| fp32 NS, 1 threads (1) | 90.00 [90.00, 90.00] | 81.00 [81.00, 81.00] "
            "| 0.900 [0.900, 0.900] | - | - |",
        ])
        self.assertEqual(rl.adamw_fused_table(s).splitlines()[2],
                         "| 1,048,576 fp32 (4 MiB) | 3.000 [3.000, 3.000] | 1.500 [1.500, 1.500] "
                         "| 2.00 [2.00, 2.00] | 2.000 [2.000, 2.000] | 1.50 [1.50, 1.50] |")
        self.assertEqual(rl.muon_elementwise_table(s).splitlines()[2],
                         "| 1024×4096 fp32, bf16 update | 6.00 [6.00, 6.00] | 4.00 [4.00, 4.00] "
                         "| 1.50 [1.50, 1.50] |")
        self.assertEqual(rl.adamw_table(s).splitlines()[2],
                         "| 1,048,576 fp32 (4 MiB) | 19.50 [19.50, 19.50] | 10.00 [10.00, 10.00] "
                         "| 2.000 [1.950, 2.050] |")

    def test_ddp_table(self):
        s = rl.summarize([rl.parse_ddp(DDP)])
        self.assertEqual(rl.ddp_table(s).splitlines()[2:], [
            "| overlap off | 5.10 | 12.00 | 8.00 | 0.00 | 25.00 | 1.000 |",
            "| overlap_grad_reduce | 5.20 | 13.00 | 2.00 | 0.00 | 20.00 | 0.800 |",
            "| overlap grad + param | 5.30 | 13.50 | 2.10 | 0.50 | 19.00 | 0.760 |",
        ])
        self.assertEqual(rl.stat_cell(s["summary"], "hidden_share", 1, 100, "%"), "75.0%")

    def test_distributed_table_wire_over_ideal(self):
        s = rl.summarize([rl.parse_distributed(DISTRIBUTED)])
        self.assertEqual(rl.distributed_table(s).splitlines()[3],
                         "| layerwise | 25.00 | 0.625 | 4.00 | 9.00 | 12.00 | 0.750 |")

    def test_collectives_and_checkpoint_tables(self):
        s = rl.summarize([rl.parse_collectives(COLLECTIVES)])
        self.assertEqual(rl.collectives_table(s).splitlines()[2],
                         "| 1 | 1.500 | 0.750 | 1.200 | 0.500 | 0.800 |")
        c = rl.summarize([rl.parse_checkpoint(rl.parse_gbench_json(CHECKPOINT))])
        self.assertEqual(rl.checkpoint_table(c).splitlines()[2:], [
            "| PlainWrite | 1000 | 1.000 | plain write |",
            "| CheckpointSave | 800 | 0.800 | plain write |",
            "| PlainRead | 4000 | 1.000 | plain read |",
            "| SafetensorsRead | 2000 | 0.500 | plain read |",
        ])

    def test_pretrain_ratios_and_table(self):
        run = rl.pretrain_rows({
            "muon_layerwise": rl.parse_pretrain('step 5\n{"tokens_per_s": 3000, "final_loss": 4.5}'),
            "muon_replicated": rl.parse_pretrain('{"tokens_per_s": 2000, "final_loss": 4.25}'),
        })
        self.assertEqual(run["muon_layerwise"]["vs_replicated"], 1.5)
        self.assertEqual(rl.pretrain_table(rl.summarize([run])).splitlines()[2:], [
            "| muon_layerwise | 3000 | 1.500 | 4.500 |",
            "| muon_replicated | 2000 | 1.000 | 4.250 |",
        ])
        with self.assertRaisesRegex(rl.ParseError, "no muon_replicated run"):
            rl.pretrain_rows({"muon_layerwise": {"tokens_per_s": 1.0}})

    def test_fsdp_rows_and_tables(self):
        def doc(elapsed, gather, per_step):
            return {"steps": 10, "elapsed_s": elapsed, "param_gather_wait_s": gather,
                    "grad_sync_wait_s": 0.01, "comm_bytes_per_step": per_step,
                    "param_buffer_bytes": 1 << 20}
        run = rl.fsdp_rows({
            "muon_layerwise": doc(6.0, 0.02, 2 << 20),
            "adamw_layerwise": doc(5.0, 0.02, 2 << 20),
            "muon_fsdp": doc(5.5, 0.025, 3 << 20),
            "adamw_fsdp": doc(5.0, 0.02, 3 << 20),
            "muon_fsdp_no_prefetch": doc(6.0, 0.1, 3 << 20),
        })
        self.assertAlmostEqual(run["muon_fsdp"]["step_ms"], 550.0)
        self.assertAlmostEqual(run["muon_fsdp"]["comm_vs_ideal"], 1.0)
        self.assertAlmostEqual(run["muon_layerwise"]["comm_vs_ideal"], 1.0)
        ratios = run["ratios"]
        self.assertAlmostEqual(ratios["muon_over_adamw_fsdp"], 1.1)
        self.assertAlmostEqual(ratios["muon_over_adamw_layerwise"], 1.2)
        self.assertAlmostEqual(ratios["fsdp_over_layerwise_adamw"], 1.0)
        self.assertAlmostEqual(ratios["gather_hidden_share"], 0.75)
        summary = rl.summarize([run])
        self.assertIn("| muon_fsdp | 550 | 25.0 | 10.0 | 3.0 | 1.000 |",
                      rl.fsdp_step_table(summary).splitlines())
        self.assertIn("| share of param-gather time hidden by prefetching, 1 − waited(prefetch) / "
                      "waited(no prefetch) | 75.0% |", rl.fsdp_ratio_table(summary).splitlines())
        with self.assertRaisesRegex(rl.ParseError, "no adamw_layerwise run"):
            rl.fsdp_rows({"muon_layerwise": doc(1, 0, 1)})

        def mem(persistent, transient):
            return {"max_persistent_bytes": persistent, "max_peak_transient_bytes": transient}
        rows = rl.fsdp_memory_rows({("layerwise", 1): mem(12 << 20, 0), ("fsdp", 1): mem(12 << 20, 1 << 20),
                                    ("layerwise", 2): mem(10 << 20, 0), ("fsdp", 2): mem(6 << 20, 1 << 20)})
        self.assertAlmostEqual(rows[2]["ideal_MB"], 6.0)
        self.assertAlmostEqual(rows[2]["fsdp_over_ideal"], 1.0)
        self.assertEqual(rl.fsdp_memory_table(rl.summarize([rows])).splitlines()[3],
                         "| 2 | 10.0 | 6.0 | 6.0 | 1.000 | 1.67 | 1.0 |")
        with self.assertRaisesRegex(rl.ParseError, "no layerwise run at dp 1"):
            rl.fsdp_memory_rows({("fsdp", 1): mem(1, 1)})

    def test_peer_rows_and_tables(self):
        def ours(step_s=None, tokens_per_s=2000.0, waits=(0.02, 0.01), critical=(0.005, 0.04)):
            doc = {"tokens_per_s": tokens_per_s, "final_loss": 3.5, "grad_sync_wait_s": waits[0],
                   "param_gather_wait_s": waits[1], "exposed_comm_s": critical[0],
                   "rank_skew_s": critical[1]}
            if step_s is not None:
                doc.update(step_s=step_s, cpu_s_per_step=1.0, forward_s=0.2, backward_s=0.4,
                           optimizer_s=0.3)
            return doc

        def theirs(step_s, gemm):
            return {"step_s": step_s, "tokens_per_s": 1024 / step_s, "cpu_s_per_step": 2.0,
                    "forward_s": 0.25, "backward_s": 0.5, "exposed_comm_s": 0.1, "rank_skew_s": 0.05,
                    "optimizer_s": 0.4, "final_loss": 3.75, "gemm_flops_per_s": gemm}
        run = rl.peer_rows({"orthoshard_muon_layerwise": ours(step_s=0.5),
                            "orthoshard_adamw_distopt": ours(tokens_per_s=1280.0),
                            "orthoshard_muon_layerwise_no_overlap": ours(0.6, waits=(0.1, 0.05),
                                                                          critical=(0.025, 0.03)),
                            "orthoshard_adamw_distopt_fused": ours(step_s=0.4),
                            "orthoshard_muon_layerwise_direct": ours(step_s=0.25),
                            "torch_muon": theirs(1.0, 4e9), "torch_adamw": theirs(0.8, 1e9),
                            "torch_adamw_fused": theirs(0.64, 2e9)},
                           tokens_per_step=1024, model_flops_per_step=1e9)
        muon = run["orthoshard_muon_layerwise"]
        self.assertEqual((muon["tokens_per_s"], muon["steady"], muon["exposed_comm_s"],
                          muon["rank_skew_s"]), (2048.0, 1.0, 0.005, 0.04))
        self.assertAlmostEqual(muon["rank0_wait_s"], 0.03)  # grad sync 0.02 + param gather 0.01
        self.assertAlmostEqual(muon["mfu"], 0.5)  # 1e9 FLOP / 0.5 s / 4e9 FLOP/s (the highest)
        # No step_s: the whole run's tokens/s, and no breakdown.
        adamw = run["orthoshard_adamw_distopt"]
        self.assertEqual((adamw["step_s"], adamw["steady"], adamw["forward_s"]), (0.8, 0.0, None))
        self.assertEqual((run["torch_adamw"]["rank0_wait_s"], run["torch_adamw"]["rank_skew_s"]),
                         (None, 0.05))
        exposed = run["ratios"].pop("exposed_comm_overlap")
        self.assertAlmostEqual(exposed, 0.2)  # critical path: 0.005 / 0.025
        rank0 = run["ratios"].pop("rank0_wait_overlap")
        self.assertAlmostEqual(rank0, 0.2)  # rank 0: (0.02 + 0.01) / (0.1 + 0.05)
        self.assertEqual(run["ratios"], {"muon": 2.0, "cpu_muon": 0.5, "muon_direct": 4.0,
                                         "cpu_muon_direct": 0.5, "adamw_vs_fused": 0.8,
                                         "cpu_adamw_vs_fused": None, "adamw_vs_default": 1.0,
                                         "cpu_adamw_vs_default": None,
                                         "adamw_fused_vs_fused": 1.6,  # 0.64 s / 0.4 s
                                         "cpu_adamw_fused_vs_fused": 0.5})
        run["ratios"]["exposed_comm_overlap"] = exposed
        run["ratios"]["rank0_wait_overlap"] = rank0
        summary = rl.summarize([run])
        self.assertEqual(rl.peer_table(summary).splitlines()[2:4], [
            "| orthoshard_muon_layerwise | 2048 | 0.500 | 1.000 | 50.0% | 3.500 | steady median |",
            "| orthoshard_adamw_distopt | 1280 | 0.800 | – | 31.2% | 3.500 | whole run |"])
        ratios = rl.peer_ratio_table(summary).splitlines()
        self.assertIn("| tokens/s, orthoshard layerwise Muon / torch Muon | 2.000 |", ratios)
        self.assertIn("| CPU s per step, orthoshard ZeRO-1 AdamW / torch AdamW(fused=True) | – |",
                      ratios)
        self.assertIn("GFLOP/s (the MFU denominator) | 4.0 |", ratios[-1])
        self.assertEqual(rl.peer_breakdown_table(summary).splitlines()[2:5], [
            "| orthoshard_muon_layerwise | 200 | 400 | 300 | 5 | 40 | 30 | 500 |",
            "| orthoshard_adamw_distopt | – | – | – | 5 | 40 | 30 | 800 |",
            "| orthoshard_muon_layerwise_no_overlap | 200 | 400 | 300 | 25 | 30 | 150 | 600 |"])
        self.assertIn("| torch_muon | 250 | 500 | 400 | 100 | 50 | – | 1000 |",
                      rl.peer_breakdown_table(summary).splitlines())
        # A ratio is taken within each repeat, then summarised.
        slower = rl.peer_rows({"orthoshard_muon_layerwise": ours(step_s=1.0),
                               "orthoshard_adamw_distopt": ours(tokens_per_s=1280.0),
                               "orthoshard_muon_layerwise_no_overlap": ours(step_s=1.0),
                               "orthoshard_adamw_distopt_fused": ours(step_s=1.0),
                               "orthoshard_muon_layerwise_direct": ours(step_s=1.0),
                               "torch_muon": theirs(1.0, 2e9), "torch_adamw": theirs(0.8, 2e9),
                               "torch_adamw_fused": theirs(0.64, 2e9)}, 1024, 1e9)
        two = rl.summarize([run, slower])
        self.assertEqual(two["ratios"]["muon"].format(3), "1.500 [1.000, 2.000]")
        with self.assertRaisesRegex(rl.ParseError, "no torch_adamw_fused run"):
            rl.peer_rows({m: theirs(1.0, 1e9) for m in rl.PEER_ORTHOSHARD_MODES + ["torch_muon",
                                                                                  "torch_adamw"]},
                         1024, 1e9)

    def test_layout_table(self):
        tables = rl.layout_tables(LAYOUT)
        self.assertEqual(list(tables), ["gpt8b"])
        self.assertEqual(tables["gpt8b"].splitlines()[2],
                         "| 2 | 0.0120 | 50.0000 | 0.0000 | 3 | 3 | 2 | 1.012 | 1.250 | 1.000 |")


class GptShapesTest(unittest.TestCase):
    def test_param_counts_are_pretrains(self):
        # num_params of pretrain's summary (small) and GptParamCount (model_test.cc: tinyllama).
        self.assertEqual(gpt_shapes.param_count(gpt_shapes.preset("small")), 2_885_888)
        self.assertEqual(gpt_shapes.param_count(gpt_shapes.preset("gpt2-124m")), 123_587_328)
        self.assertEqual(gpt_shapes.param_count(gpt_shapes.preset("tinyllama-1.1b")),
                         1_100_048_384)
        with self.assertRaisesRegex(ValueError, "unknown model preset 'gpt3'; expected one of"):
            gpt_shapes.preset("gpt3")

    def test_flops(self):
        cfg = gpt_shapes.preset("tiny")  # C 64, F 192, V 256, L 2, H = KV = 4
        matmul = 2 * (3 * 64 * 64 + 64 * 64 + 3 * 192 * 64) + 256 * 64
        self.assertEqual(gpt_shapes.model_flops_per_step(cfg, 1000, 50),
                         1000 * (6 * matmul + 12 * 2 * 64 * 50))
        gemms = gpt_shapes.forward_gemms(cfg, 10)
        self.assertEqual((gemms["gate"], gemms["head"]), ((10, 64, 192, 2), (10, 64, 256, 1)))
        # A [192, 64] matrix: s = 64, l = 192; 5 iterations of 4·s²·l + 2·s³.
        self.assertEqual(gpt_shapes.muon_ns_flops({**cfg, "num_layers": 1, "num_heads": 1,
                                                   "num_kv_heads": 1, "hidden": 64}),
                         5 * (4 * 64 ** 3 + 2 * 64 ** 3) * 4 + 5 * (4 * 64 * 64 * 192
                                                                    + 2 * 64 ** 3) * 3)


class MergeSectionsTest(unittest.TestCase):
    OLD = ("# orthoshard benchmarks\n\nheader\n\n## Machine\n\nold machine\n\n"
           "## 1. Layout\n\nold one\n\n## 7. Peer\n\nold seven\n\n## Run log\n\nold log\n")
    NEW = ("# orthoshard benchmarks\n\nnew header\n\n## Machine\n\nnew machine\n\n"
           "## 7. Peer\n\nnew seven\n\n## 3. Distributed\n\nnew three\n\n"
           "## 9. Later\n\nnew nine\n\n## Run log\n\nnew log\n")

    def test_replaces_inserts_and_keeps_the_rest(self):
        merged = rl.merge_sections(self.OLD, self.NEW, "(measured separately)")
        self.assertIn("header\n\n## Machine\n\nold machine", merged)
        self.assertNotIn("new header", merged)
        self.assertNotIn("new machine", merged)
        self.assertNotIn("old seven", merged)
        self.assertIn("## 7. Peer\n\n(measured separately)\n\nnew seven", merged)
        self.assertIn("old log", merged)
        self.assertNotIn("new log", merged)
        order = [merged.index(s) for s in ("## 1.", "## 3.", "## 7.", "## 9.", "## Run log")]
        self.assertEqual(order, sorted(order))
        self.assertIn("## 1. Layout\n\nold one", merged)  # untouched: no provenance line

    def test_without_an_old_report_the_new_one(self):
        self.assertEqual(rl.merge_sections("", self.NEW, "x"), self.NEW)


class CarrySummaryTest(unittest.TestCase):
    OLD = "# b\n\nold header\n\n## Summary\n\n| what | figure |\n\n## 1. Layout\n\nold one\n"
    NEW = "# b\n\nnew header\n\n## Machine\n\nm\n\n## 1. Layout\n\nnew one\n"

    def test_a_full_run_keeps_the_summary_before_its_sections(self):
        carried = rl.carry_summary(self.OLD, self.NEW)
        self.assertIn("new header\n\n## Summary\n\n| what | figure |\n\n## Machine", carried)
        self.assertIn("new one", carried)
        self.assertNotIn("old one", carried)

    def test_nothing_to_carry(self):
        self.assertEqual(rl.carry_summary("# b\n\n## 1. Layout\n", self.NEW), self.NEW)
        self.assertEqual(rl.carry_summary(self.OLD, self.OLD), self.OLD)


class WrapMarkdownTest(unittest.TestCase):
    def test_wraps_prose_and_list_items_only(self):
        prose = " ".join(["word"] * 60)
        item = "- " + " ".join(["item"] * 60)
        table = "| " + " | ".join(["cell"] * 60) + " |"
        text = "\n".join(["## " + prose, prose, item, table, "```", prose, "```", "short"])
        lines = rl.wrap_markdown(text, width=40).split("\n")
        self.assertEqual(lines[0], "## " + prose)
        self.assertIn(table, lines)
        self.assertEqual(lines[-4:], ["```", prose, "```", "short"])
        body = lines[1:lines.index(table)]
        self.assertTrue(all(len(line) <= 40 for line in body))
        prose_lines = [line for line in body if line.startswith("word")]
        item_lines = body[len(prose_lines):]
        self.assertEqual(" ".join(prose_lines), prose)
        self.assertTrue(item_lines[0].startswith("- item"))
        self.assertTrue(all(line.startswith("  item") for line in item_lines[1:]))
        self.assertEqual(" ".join(line.strip() for line in item_lines), item)

    def test_never_starts_a_line_with_markdown_syntax(self):
        text = "x" * 38 + " - a " + "y" * 38 + " 1. b " + "z" * 38 + " # c"
        for line in rl.wrap_markdown(text, width=40).split("\n"):
            self.assertFalse(re.match(r"^(-|#|1\.) ", line), line)

    def test_idempotent_and_keeps_long_words(self):
        text = "a " + "b" * 80 + " c " + " ".join(["d"] * 50)
        once = rl.wrap_markdown(text, width=40)
        self.assertIn("b" * 80, once.split("\n"))
        self.assertEqual(rl.wrap_markdown(once, width=40), once)


if __name__ == "__main__":
    unittest.main()
