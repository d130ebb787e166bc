"""Tests of bench/moe_bench.py without running pretrain: the all-to-all ideal's arithmetic, the eval
curve parsed from pretrain's log lines, and the section rendered from canned measurements."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_bench  # noqa: E402


class MoeBenchTest(unittest.TestCase):

    def test_uniform_ideal_bytes(self):
        # 2 ranks, ep 2, 8 x 256 tokens: 1024 tokens per rank, 2 copies each, half of them remote,
        # 4 crossings, 4 layers, 256 fp32 values per row: 4 * 4 * 1024 * 2 * 0.5 * 256 * 4.
        self.assertEqual(moe_bench.uniform_ideal_bytes(2, 2, 8, 256), 16777216)
        # ep 1: nothing leaves the rank.
        self.assertEqual(moe_bench.uniform_ideal_bytes(2, 1, 8, 256), 0)
        # 4 ranks as ep 2 x expt_dp 2: half the tokens per rank.
        self.assertEqual(moe_bench.uniform_ideal_bytes(4, 2, 8, 256), 8388608)

    def test_expert_bytes_whole(self):
        # 4 layers x 8 experts x (2 x 352 x 256 + 256 x 352) fp32.
        self.assertEqual(moe_bench.expert_bytes_whole(), 4 * 8 * 3 * 352 * 256 * 4)

    def test_eval_curve(self):
        log = ("[rank 0] step 25/50 | loss 2.1 | ...\n[rank 0] eval step 25: loss 2.0249\n"
               "[rank 0] eval step 50: loss 0.7310\n")
        self.assertEqual(moe_bench.eval_curve(log), [(25, 2.0249), (50, 0.731)])

    def test_render(self):
        rows = [{"grid": "2 ranks = ep 2 × expt_dp 1, batch 8", "ratio": [1.7, 1.9, 1.66],
                 "muon_step_s": 0.885, "adamw_step_s": 0.51, "a2a_wire_MB": 16.81,
                 "a2a_ideal_MB": 16.78, "a2a_logical_MB": 33.6, "expert_params": 1.0,
                 "expert_grads": 1.0, "expert_state": 1.0, "ns_balance": 1.0, "load": (0.0, 3.97)}]
        curves = {"small": ([(25, 2.0249), (50, 0.731)], {"eval_loss": 0.731, "num_params": 10,
                                                          "step_s": 0.4}),
                  "moe-small": ([(25, 2.1035)], {"eval_loss": 0.85, "num_params": 30,
                                                 "step_s": 0.8})}
        md = moe_bench.render(rows, ["--steps=6"], curves, ["--steps=50"], 3)
        self.assertIn("| 2 ranks = ep 2 × expt_dp 1, batch 8 | 1.700 (1.660–1.900) | 0.885 | "
                      "0.510 | 16.81 (16.78) | 1.000 / 1.000 / 1.000 | 1.000 | 0.00–3.97 |", md)
        self.assertIn("| 25 | 2.0249 | 2.1035 |", md)
        self.assertIn("| 50 | 0.7310 | — |", md)  # a step the MoE run did not evaluate
        self.assertIn("Final eval loss: small 0.7310, moe-small 0.8500", md)


if __name__ == "__main__":
    unittest.main()
