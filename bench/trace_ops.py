#!/usr/bin/env python3
"""Where a step's time goes, op by op, from Chrome traces of Kineto (torch.profiler's format).

Reads traces written by `pretrain --profile_step_start` and by `bench/torch_peer.py
--profile_step_start` (both name the phases of a step `step/forward`, `step/backward`,
`step/grad_sync_wait`, `step/optimizer`), computes every op's *self* time (its duration less
that of the ops nested in it on the same thread), and prints per phase the ops that take the most
of it, per profiled step. With two traces it prints them side by side with the difference, which
is how a gap between orthoshard and its PyTorch peer is found:

    bench/trace_ops.py /tmp/prof/rank0.steps3-5.pt.trace.json /tmp/peer/rank0.steps3-5.pt.trace.json
"""

import argparse
import collections
import json
import sys

PHASE_PREFIX = "step/"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path):
    with open(path) as f:
        trace = json.load(f)
    return [e for e in trace["traceEvents"]
            if e.get("ph") == "X" and "dur" in e and e.get("cat") != "Trace"]


def self_times(events, steps):
    """{phase: {op name: self microseconds per step}} over the phases of a step.

    An op belongs to the innermost `step/...` range enclosing it on its thread; an op outside every
    such range on its thread belongs to the range of any thread that was open when it started (the
    autograd engine runs a GPU's backward on its own thread, the step's ranges are the main
    thread's); the rest are counted under `(outside)`. Self time is an op's duration less its direct
    children's on the same thread (events on one thread nest properly in Kineto's traces). A GPU
    kernel, copy or set (on a stream, not a thread) belongs to the phase of the CPU call that
    launched it (Kineto gives both the same `correlation` id), its self time is its duration.
    """
    by_thread = collections.defaultdict(list)
    device = []
    for e in events:
        (device if e.get("cat") in DEVICE_CATEGORIES else by_thread[e["tid"]]).append(e)
    out = collections.defaultdict(lambda: collections.defaultdict(float))
    launch_phase = {}  # correlation id -> phase of the CPU event that launched it
    ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"][len(PHASE_PREFIX):])
                    for e in events if e["name"].startswith(PHASE_PREFIX))

    def phase_at(ts):
        for begin, end, name in ranges:  # few ranges: a scan is enough
            if begin <= ts < end:
                return name
        return "(outside)"
    for evs in by_thread.values():
        # Parents first: earlier start, then the longer of two that start together.
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, children's duration, phase]
        def close(item):
            e, children, phase = item
            if not e["name"].startswith(PHASE_PREFIX):
                out[phase][e["name"]] += max(0.0, e["dur"] - children) / steps
        for e in evs:
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
                close(stack.pop())
            phase = stack[-1][2] if stack else phase_at(e["ts"])
            if e["name"].startswith(PHASE_PREFIX):
                phase = e["name"][len(PHASE_PREFIX):]
                out[phase]  # a phase with no ops still shows
            correlation = e.get("args", {}).get("correlation")
            if correlation is not None:
                launch_phase[correlation] = phase
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0, phase])
        while stack:
            close(stack.pop())
    for e in device:
        phase = launch_phase.get(e.get("args", {}).get("correlation"), "(outside)")
        out[phase][e["name"]] += e["dur"] / steps
    return out


def phase_totals(events, steps):
    totals = collections.defaultdict(float)
    for e in events:
        if e["name"].startswith(PHASE_PREFIX):
            totals[e["name"][len(PHASE_PREFIX):]] += e["dur"] / steps
    return totals


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="one or two Chrome trace files")
    parser.add_argument("--steps", type=int, default=0,
                        help="profiled steps in each trace; 0 = read from the name "
                             "(rankR.stepsA-B.pt.trace.json)")
    parser.add_argument("--top", type=int, default=15, help="ops shown per phase")
    args = parser.parse_args(argv)
    if len(args.traces) > 2:
        parser.error("one or two traces")
    tables = []
    for path in args.traces:
        steps = args.steps
        if steps <= 0:
            try:
                first, last = path.rsplit(".steps", 1)[1].split(".")[0].split("-")
                steps = int(last) - int(first) + 1
            except (IndexError, ValueError):
                parser.error(f"{path}: cannot read the step range from the name; give --steps")
        events = load(path)
        tables.append((phase_totals(events, steps), self_times(events, steps)))
    phases = sorted({p for _, t in tables for p in t},
                    key=lambda p: -max(tab[0].get(p, 0.0) for tab in tables))
    ms = lambda us: f"{us / 1000:9.2f}"
    for phase in phases:
        head = "  ".join(f"{ms(tot.get(phase, 0.0))} ms" for tot, _ in tables)
        print(f"\n== {phase}: {head} per step (self time of its ops below, ms per step)")
        names = collections.Counter()
        for _, t in tables:
            for name, us in t.get(phase, {}).items():
                names[name] = max(names[name], us)
        if len(tables) == 2:
            key = lambda n: -abs(tables[0][1][phase].get(n, 0) - tables[1][1][phase].get(n, 0))
            print(f"{'a':>9} {'b':>9} {'a-b':>9}  op")
        else:
            key = lambda n: -names[n]
        for name in sorted(names, key=key)[:args.top]:
            vals = [t[1][phase].get(name, 0.0) for t in tables]
            cols = " ".join(ms(v) for v in vals)
            if len(vals) == 2:
                cols += " " + ms(vals[0] - vals[1])
            print(f"{cols}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
