"""bench/tp_bench.py on canned measurements: the optimizer benchmark's lines parsed, the memory
rows' arithmetic, and the section's rendering (no benchmark runs)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_bench  # noqa: E402

TP_MUON = """tp 2 x dp 1 (2 Gloo ranks, 1 thread each), gpt2-124m matrices x 12 layers, bf16 Newton-Schulz, 5 interleaved repetitions
[rank 0] owner      step median    5734.1 ms (min    5600.0, max    6000.0), rank 0 thread CPU median    5134.0 ms, ns_cost rank 0 3.262e+10 rank 1 3.262e+10  owner/duplicated 0.535 (min 0.531, CPU 0.499)
duplicated step median   10727.0 ms (min   10550.0, max   11000.0), rank 0 thread CPU median   10286.0 ms, ns_cost rank 0 6.524e+10 rank 1 6.524e+10
blockwise  step median    4282.0 ms (min    4200.0, max    4400.0), rank 0 thread CPU median    4169.0 ms, ns_cost rank 0 2.72e+10 rank 1 2.72e+10
"""


def memory(params, grads, state):
    return [{"rank": r, "params_bytes": params, "grads_bytes": grads,
             "optimizer_state_bytes": state} for r in range(2)]


def main():
    modes = tp_bench.parse_tp_muon(TP_MUON)
    assert modes["owner"]["median_ms"] == 5734.1, modes
    assert modes["duplicated"]["min_ms"] == 10550.0, modes
    assert modes["blockwise"]["cpu_ms"] == 4169.0, modes
    assert modes["owner"]["ns_cost"] == [3.262e10, 3.262e10], modes
    try:
        tp_bench.parse_tp_muon(TP_MUON.replace("blockwise ", "other "))
        raise AssertionError("a missing mode must be refused")
    except ValueError as e:
        assert "blockwise" in str(e), e

    # 1000 params: dp 2 holds whole params and grads (4000 bytes) and half the state each; tp 2
    # about half of everything.
    summaries = {"dp2": {"memory": memory(4000, 4000, 3000), "num_params": 1000, "steps": 6},
                 "tp2": {"memory": memory(2100, 2100, 3100), "num_params": 1000, "steps": 6}}
    rows = tp_bench.memory_rows(summaries, 1000)
    assert rows == [("params", 2100, 4000, 4000), ("grads", 2100, 4000, 4000),
                    ("optimizer state", 3100, 3000, 6000)], rows

    ratios = {"tp/dp": [1.5, 1.7, 1.6], "optimizer owner/duplicated": [0.6, 0.55, 0.58]}
    md = tp_bench.render(modes, 5, (ratios, summaries), 3, "small", 8, 6, 1000)
    assert "owner / duplicated: **0.535** on the medians, 0.531 on the minimums, 0.499" in md, md
    assert "| owner | 5734 (5600–6000) | 5134 | 3.26e+10 / 3.26e+10 |" in md, md
    assert "| step time, tp 2 × dp 1 / tp 1 × dp 2 | 1.600 (1.500–1.700) |" in md, md
    assert "| optimizer time at tp 2, owner / duplicated | 0.580 (0.550–0.600) |" in md, md
    assert "| params | 2,100 | 4,000 | 4,000 | 1.050 |" in md, md
    assert "| optimizer state | 3,100 | 3,000 | 6,000 | 1.033 |" in md, md
    assert "8 samples × 256 tokens per step" in md, md
    print("PASS: tp_bench parsing, memory rows and rendering")


if __name__ == "__main__":
    main()
