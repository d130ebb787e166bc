"""pretrain's JSON summary line is strict JSON, also when training diverged.

    summary_json_test.py PRETRAIN

Python's json.loads accepts NaN and Infinity by default; parse_constant is made to raise, so the
line must be RFC 8259 JSON. A diverging run (AdamW with beta1 0 at lr 1e19, no clipping: every
param moves by 1e19 at the first step, the next steps' gradients overflow fp32 and are skipped to
the end, --max_consecutive_skips=0) has a params norm (--log_params_norm) beyond fp32's range: it
must be null and named in "non_finite", as must any other number that is not finite. A healthy
run has no "non_finite" member and a number for every double.
"""

import json
import os
import subprocess
import sys

pretrain = os.path.abspath(sys.argv[1])
DOUBLES = ["initial_loss", "final_loss", "initial_eval_loss", "eval_loss", "unigram_entropy",
           "tokens_per_s", "elapsed_s", "param_checksum", "param_gather_wait_s",
           "grad_sync_wait_s", "exposed_comm_s", "rank_skew_s", "step_s", "forward_s",
           "backward_s", "optimizer_s", "cpu_s_per_step", "params_norm"]


def refuse(constant):
    raise ValueError(f"not JSON: {constant}")


def summary(*flags):
    args = [pretrain, "--nproc_per_node=2", "--steps=4", "--global_batch=8", "--eval_every=0",
            "--eval_batches=1", "--check_every=0", "--log_params_norm", *flags]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    line = result.stdout.strip().splitlines()[-1]
    try:
        return json.loads(line, parse_constant=refuse)
    except ValueError as e:
        sys.exit(f"FAIL: the summary line is not strict JSON ({e}):\n{line}")


healthy = summary()
assert "non_finite" not in healthy, healthy
for key in DOUBLES:
    assert isinstance(healthy[key], (int, float)), (key, healthy[key])

diverged = summary("--optimizer=adamw", "--lr=1e19", "--adam_beta1=0", "--weight_decay=0",
                   "--max_grad_norm=0", "--max_consecutive_skips=0")
assert diverged["skipped_steps"] >= 1, diverged
assert diverged["params_norm"] is None, diverged
assert "params_norm" in diverged["non_finite"], diverged
for key in DOUBLES:
    value = diverged[key]
    assert (value is None) == (key in diverged["non_finite"]), (key, value, diverged["non_finite"])
print("OK: healthy and diverged summaries are strict JSON; diverged nulls:",
      diverged["non_finite"])
