"""Tests of bench/tp_plan_bench.py without running the plan tool: the section rendered from canned
plan JSON (the headline at each preset's largest accepted TP, the refusals, the per-preset tables)
and the number formats."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_plan_bench  # noqa: E402


def plan(tp, dp, owner, duplicated, blockwise, owner_bytes, dup_bytes, dp_bytes):
    def mode(flops, imbalance, tp_bytes):
        return {"total_ns_flops": flops * tp * dp, "max_ns_flops": flops,
                "mean_ns_flops": flops / imbalance, "ns_imbalance": imbalance,
                "max_tp_bytes": tp_bytes, "mean_tp_bytes": tp_bytes}
    return {"tp": tp, "dp": dp, "ranks": tp * dp, "tp_split_matrices": 4,
            "replicated_matrices": 0, "dp_bytes": dp_bytes,
            "modes": {"owner": mode(*owner, owner_bytes),
                      "duplicated": mode(*duplicated, dup_bytes),
                      "blockwise": mode(*blockwise, 0)}}


# A model the tool takes at TP 1 and 8, and one it refuses at TP 8 (so its headline is TP 2).
RESULTS = {
    "llama3_8b_gqa": {"plans": [
        plan(1, 8, (83236.5e9, 1.0), (83236.5e9, 1.0), (83236.5e9, 1.0), 0, 0, 42158.9e6),
        plan(8, 8, (10995.1e9, 1.057), (83236.5e9, 1.0), (4040.8e9, 1.0), 788.5e6, 3053.5e6,
             5271.1e6)], "refused": {}},
    "gpt2-124m": {"plans": [
        plan(2, 64, (57.4e9, 4.36), (57.4e9, 2.18), (33.2e9, 2.9), 6.3e6, 6.3e6, 709e6)],
        "refused": {8: "preset 'gpt2-124m' at --tp=8: the KV groups (attention query groups) 12 "
                       "does not split over 8 tp ranks; expected tp to divide 12"}},
}


class TpPlanBenchTest(unittest.TestCase):

    def test_formats(self):
        self.assertEqual(tp_plan_bench.gflop(83236.5e9), "83,236")
        self.assertEqual(tp_plan_bench.gflop(57.4e9), "57.4")
        self.assertEqual(tp_plan_bench.mb(3053.5e6), "3,054")
        self.assertEqual(tp_plan_bench.mb(6.3e6), "6.3")

    def test_headline_is_the_largest_tp(self):
        rows = tp_plan_bench.headline_rows(RESULTS)
        self.assertEqual([r[:3] for r in rows], [["`llama3_8b_gqa`", 8, 8], ["`gpt2-124m`", 2, 64]])
        # owner / duplicated of the busiest ranks: 10995.1 / 83236.5.
        self.assertEqual(rows[0][6], "0.132")

    def test_render(self):
        md = tp_plan_bench.render(RESULTS)
        self.assertIn("| `llama3_8b_gqa` | 8 | 8 | 64 | 10,995 (1.06) | 83,236 (1.00) | 0.132 | "
                      "4,041 (1.00) | 788 / 3,054 | 5,271 |", md)
        self.assertIn("| `gpt2-124m` | 2 | 64 | 128 | 57.4 (4.36) | 57.4 (2.18) | 1.000 | "
                      "33.2 (2.90) | 6.3 / 6.3 | 709 |", md)
        self.assertIn("- `gpt2-124m` at TP 8: preset 'gpt2-124m' at --tp=8: the KV groups", md)
        self.assertIn("### llama3_8b_gqa", md)
        # The TP 1 row is in the preset's table, not in the headline.
        self.assertEqual(md.count("| `llama3_8b_gqa` | 1 | 8 | 8 |"), 1)
        self.assertLess(md.index("### Owner vs duplicated"), md.index("### llama3_8b_gqa"))


if __name__ == "__main__":
    unittest.main()
