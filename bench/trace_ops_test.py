"""bench/trace_ops.py: self times of nested ops, and real traces of pretrain and of the PyTorch
peer (both --profile_step_start) read into the same phases."""

import glob
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_ops  # noqa: E402


def op(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid}


class SelfTimes(unittest.TestCase):
    def test_nesting_phases_and_threads(self):
        events = [
            op("step/backward", 0, 100),
            op("aten::mm", 10, 40),       # 40 - 10 (its child) = 30 self
            op("aten::copy_", 20, 10),    # nested in mm
            op("aten::mm", 60, 20),       # 20 self
            op("step/optimizer", 100, 50),
            op("aten::add_", 100, 50),    # starts with its phase: still inside it
            op("gloo:all_gather", 5, 30, tid=2),  # another thread, started in backward's range
            op("gloo:all_reduce", 160, 5, tid=2),  # after every range: outside
        ]
        # A GPU kernel launched by the backward's mm (correlation 7) counts in backward, whole;
        # one whose launch is not in the trace, outside.
        events[1]["args"] = {"correlation": 7}
        events += [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 15, "dur": 8, "tid": 99,
                    "args": {"correlation": 7}},
                   {"ph": "X", "cat": "kernel", "name": "orphan", "ts": 30, "dur": 4, "tid": 99,
                    "args": {"correlation": 8}}]
        got = trace_ops.self_times(events, steps=2)  # per step: halved
        self.assertEqual(dict(got["backward"]), {"aten::mm": 25.0, "aten::copy_": 5.0, "gemm": 4.0,
                                                 "gloo:all_gather": 15.0})
        self.assertEqual(dict(got["optimizer"]), {"aten::add_": 25.0})
        self.assertEqual(dict(got["(outside)"]), {"gloo:all_reduce": 2.5, "orphan": 2.0})
        self.assertEqual(dict(trace_ops.phase_totals(events, 2)),
                         {"backward": 50.0, "optimizer": 25.0})


class RealTraces(unittest.TestCase):
    """pretrain's and torch_peer's traces of steps 2-3 of the tiny model, 2 ranks each."""

    def test_pretrain_and_peer(self):
        with tempfile.TemporaryDirectory() as tmp:
            common = ["--model=tiny", "--global_batch=4", "--steps=4", "--profile_step_start=2",
                      "--profile_step_end=3"]
            subprocess.run(["integration/pretrain", "--nproc_per_node=2", "--eval_every=0",
                            "--eval_batches=1", f"--profile_dir={tmp}/ours"] + common,
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run([sys.executable, "bench/torch_peer.py", "--nproc=2",
                            f"--profile_dir={tmp}/peer"] + common,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for who in ("ours", "peer"):
                names = sorted(os.path.basename(p) for p in glob.glob(f"{tmp}/{who}/*"))
                self.assertEqual(names, ["rank0.steps2-3.pt.trace.json",
                                         "rank1.steps2-3.pt.trace.json"], who)
                events = trace_ops.load(f"{tmp}/{who}/rank1.steps2-3.pt.trace.json")
                phases = trace_ops.self_times(events, steps=2)
                for phase in ("forward", "backward", "optimizer"):
                    self.assertGreater(phases[phase].get("aten::mm", 0)
                                       + phases[phase].get("aten::addmm", 0), 0, (who, phase))
            out = subprocess.run([sys.executable, "bench/trace_ops.py",
                                  f"{tmp}/ours/rank0.steps2-3.pt.trace.json",
                                  f"{tmp}/peer/rank0.steps2-3.pt.trace.json"],
                                 check=True, capture_output=True, text=True).stdout
            self.assertIn("== backward:", out)
            self.assertIn("aten::mm", out)


if __name__ == "__main__":
    unittest.main()
