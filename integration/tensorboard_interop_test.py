"""pretrain's event files read by TensorBoard's own code (tensorboard 2.21, no TensorFlow).

    tensorboard_interop_test.py PRETRAIN

A run logs steps 1-6 but its `latest` is rolled back to step 4 (as a crash after step 6 whose last
committed checkpoint was step 4 leaves it); a resume logs steps 5-8 into the same --log_dir, and a
second run started at once writes its own file beside it. TensorBoard's EventAccumulator, which
purges what earlier files logged at and after a SessionLog.START's step, must then show every train
step once and eval/loss at 0 and 8 only. Every record also parses as tensorboard's Event proto with
the fields pretrain meant (scalars as simple_value, the restart as session_log START).
"""

import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.backend.event_processing import event_file_loader

pretrain = os.path.abspath(sys.argv[1])
work = tempfile.mkdtemp(prefix="tb_interop.", dir=os.environ.get("TEST_TMPDIR"))
ckpt, tb = os.path.join(work, "ckpt"), os.path.join(work, "tb")
os.makedirs(ckpt)
common = [pretrain, "--steps=8", "--eval_every=0", "--check_every=0", "--global_batch=8",
          "--save_every=4", f"--save_dir={ckpt}", f"--log_dir={tb}"]


def run(args):
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, (args, result.stderr)


run(common + ["--stop_after=6"])
with open(os.path.join(ckpt, "latest"), "w") as f:
    f.write("step_000004\n")
run(common + ["--resume"])

files = sorted(os.listdir(tb))
assert len(files) == 2 and all(f.startswith("events.out.tfevents.") for f in files), files
starts = []
for name in files:
    # The raw records (EventFileLoader would migrate scalars to tensors on the way).
    for record in event_file_loader.RawEventFileLoader(os.path.join(tb, name)).Load():
        event = event_pb2.Event.FromString(record)
        if event.HasField("session_log"):
            assert event.session_log.status == event_pb2.SessionLog.START, event
            starts.append((name, event.step))
        for value in event.summary.value:
            assert value.WhichOneof("value") == "simple_value", value
assert starts == [(files[1], 5)], starts

accumulator = EventAccumulator(tb, size_guidance={"scalars": 0})
accumulator.Reload()
train = [e.step for e in accumulator.Scalars("train/loss")]
evals = [e.step for e in accumulator.Scalars("eval/loss")]
assert train == list(range(1, 9)), train
assert evals == [0, 8], evals
assert "train/muon_lr" in accumulator.Tags()["scalars"]
print(f"PASS: TensorBoard reads one curve after a crash and a resume: train/loss steps {train}, "
      f"eval/loss steps {evals}; restart record at step 5 in the second file")
