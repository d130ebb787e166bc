"""bench/memory_bench.py on canned summaries: the rows taken from a run's summary, the bound's
arithmetic and the section's rendering (no benchmark runs)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_bench  # noqa: E402


def summary(peak, rss, persistent, transient, step_s=1.0):
    """Two ranks; rank 1 holds 1 MB less of everything but the transient peak."""
    mem = []
    for r in range(2):
        less = r * 1_000_000
        mem.append({"rank": r, "params_bytes": persistent // 2 - less, "grads_bytes": persistent // 4,
                    "optimizer_state_bytes": persistent - persistent // 2 - persistent // 4,
                    "peak_transient_bytes": transient, "max_rss_bytes": rss - less,
                    "allocator_peak_bytes": peak - less})
    return {"memory": mem, "step_s": step_s, "initial_loss": 10.0, "final_loss": 9.0}


def main():
    row = memory_bench.row_of(summary(500_000_000, 700_000_000, 300_000_000, 40_000_000, 2.5))
    assert row == {"allocator_peak": 500_000_000, "rss": 700_000_000, "persistent": 300_000_000,
                   "transient": 40_000_000, "step_s": 2.5}, row

    # gpt2-124m: V x C = 50304 x 768, a block = qkv 3 C^2 + proj C^2 + fc1 2 F C + fc2 F C + 2 C
    # (F = 2048), and the final norm's C: fp32 params and grads, 8 bytes each.
    C, V, F = 768, 50304, 2048
    block = 4 * C * C + 3 * F * C + 2 * C
    assert memory_bench.layer_bytes("gpt2-124m") == 8 * (V * C + C + block)

    grid = {("layerwise", "none", 256): memory_bench.row_of(
                summary(900_000_000, 1_100_000_000, 600_000_000, 0)),
            ("fsdp", "none", 256): memory_bench.row_of(
                summary(800_000_000, 1_000_000_000, 300_000_000, 200_000_000)),
            ("layerwise", "full", 256): {"failed": "exit 2: no"}}
    peak, bound = memory_bench.fsdp_bound(grid, "gpt2-124m", 256, "none")
    assert peak == 800_000_000
    assert bound == 300_000_000 + memory_bench.layer_bytes("gpt2-124m") + 300_000_000, bound
    assert memory_bench.fsdp_bound(grid, "gpt2-124m", 256, "full") is None

    md = "\n".join(memory_bench.render_grid("gpt2-124m", grid, [256], 3))
    assert "| 256 | layerwise | full | exit 2: no |" in md, md
    assert "| 256 | layerwise | none | 900.0 | 1100.0 | 600.0 | 0.0 |  | 1.00 |  |" in md, md
    layers = 200_000_000 / memory_bench.layer_bytes("gpt2-124m")
    assert (f"| 256 | fsdp | none | 800.0 | 1000.0 | 300.0 | 200.0 | {layers:.3f} | 1.00 | "
            f"{800_000_000 / bound:.3f} |") in md, md
    # layerwise rows first, then fsdp; none before selective before full.
    assert md.index("| layerwise | none") < md.index("| layerwise | full") < md.index("| fsdp |")

    versus = {"small": {"layerwise": row, "fsdp": row}}
    text = memory_bench.render({"selective": [1.1, 1.2, 1.0], "full": [1.3]}, 3, versus,
                               {"gpt2-124m": (grid, [256], 3)}, "a note")
    assert "| selective | 1.100 (1.000–1.200) |" in text, text
    assert "| full | 1.300 |" in text, text
    assert "| small | fsdp | 500.0 | 700.0 | 300.0 | 40.0 |" in text, text
    assert text.rstrip().endswith("a note"), text
    print("PASS: memory_bench rows, bound and rendering")


if __name__ == "__main__":
    main()
