"""The GPT of orthoshard's `pretrain`, trained as a PyTorch user trains it, and measured as
bench/report.py measures `pretrain` (issue 19): nn.Module, DistributedDataParallel over Gloo on
local ranks, torch.optim.Muon + torch.optim.AdamW, clip_grad_norm_.

  tools/python3 bench/torch_peer.py --model=small --optimizer=muon --steps=10 [--nproc=2]

Model: model/model.h's decoder with separate q/k/v and gate/up Linears where orthoshard
fuses qkv and fc1: the same shapes, params and FLOPs, and the same matrices for Muon (orthoshard
orthogonalises its fused weights per logical block: Q, K, V; gate, up). Init as Gpt's (normal
init_std, proj and fc2 init_std/sqrt(2L), norms ones), drawn from torch's generator, so not the
same values.
Training: pretrain's defaults (integration/config/trainer_config_fields.h and trainer.cc): Muon lr 0.02,
weight decay 0.01, momentum 0.95, Nesterov, the "original" lr scale; AdamW lr 3e-3, betas
(0.9, 0.95), eps 1e-8, weight decay 0.01 on matrices and 0 on norms; warmup-cosine schedule (20
steps, floor 0.1); global-norm clip 1.0. Every rank steps every param (plain replicated DDP).
torch.optim.Muon runs Newton–Schulz in bf16; --muon_ns_dtype=fp32 swaps in the same iteration in
fp32, as pretrain's flag of that name does (CPUs without bf16 arithmetic run bf16 GEMMs ~25x
slower than fp32).
Data: pretrain's default corpus is synthetic text (data/dataset.cc: 1M bytes of sentences
over 8 names and 48 words chained by 4 successors with p .5/.25/.15/.10); this draws text of the
same grammar with Python's RNG (not the same bytes), byte tokens, 5% held out as pretrain does,
non-overlapping windows of seq_len + 1 in a seeded order, each rank its slice of the global batch.
Measurement: steps after the first --timing_warmup (1, as pretrain: the first step pays one-time
costs) are steady. step_s: rank 0's median steady
step (forward, backward with DDP's all-reduce, clip, optimizer step, the loss all-reduce);
cpu_s_per_step: user + sys CPU seconds per steady step of every rank's process, summed over ranks;
forward_s, backward_s, optimizer_s (clip + step + zero_grad): means per steady step, max over
ranks. backward_s is compute only: the backward with DDP's sync minus the rank's sync time, which
is that backward's mean minus the mean of as many backwards under ddp.no_sync() run after training
(DDP waits for its last all-reduce inside backward, so what the no-sync backward lacks is the
communication that compute did not hide, plus, on a rank that finished its compute early, the wait
for the slowest rank). exposed_comm_s is the least sync time over the ranks (the slowest rank
waits only for communication: the critical path, as pretrain's exposed_comm_s), rank_skew_s the
most minus the least. gemm_flops_per_s: torch.mm over the forward GEMM shapes
of one step (bench/gpt_shapes.py), every rank at once with the same threads, summed over ranks;
mfu = model_flops_per_step / step_s / gemm_flops_per_s. One JSON line on stdout from rank 0.
"""

import argparse
import ctypes
import datetime
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim._muon as torch_muon
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_shapes  # noqa: E402


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, H, KV, D = c["hidden"], c["num_heads"], c["num_kv_heads"], c["hidden"] // c["num_heads"]
        self.heads, self.kv_heads, self.head_dim = H, KV, D
        self.attn_norm, self.mlp_norm = nn.RMSNorm(C, c["norm_eps"]), nn.RMSNorm(C, c["norm_eps"])
        for name, (rows, cols) in gpt_shapes.hidden_matrices(c).items():
            setattr(self, name, nn.Linear(cols, rows, bias=False))

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = rotary(self.q(h).view(B, T, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = rotary(self.k(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads < self.heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, -1))
        m = self.mlp_norm(x)
        return x + self.fc2(F.silu(self.gate(m)) * self.up(m))


def rotary(x, cos, sin):
    """Rotate-half rotary embedding of x [B, N, T, D] (RoFormer eq. 15, model.h's ApplyRotary)."""
    T, half = x.size(-2), x.size(-1) // 2
    x1, x2, c, s = x[..., :half], x[..., half:], cos[:T], sin[:T]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, V, L = c["hidden"], c["vocab_size"], c["num_layers"]
        self.embedding = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(c) for _ in range(L))
        self.final_norm = nn.RMSNorm(C, c["norm_eps"])
        self.head = nn.Linear(C, V, bias=False)
        if c["tie_embeddings"]:
            self.head.weight = self.embedding.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual = name.endswith(("proj.weight", "fc2.weight"))
                nn.init.normal_(p, 0.0, c["init_std"] / (math.sqrt(2 * L) if residual else 1))
        D, f64 = C // c["num_heads"], torch.float64
        angles = torch.outer(torch.arange(c["max_seq_len"], dtype=f64),
                             c["rope_theta"] ** (-2.0 * torch.arange(D // 2, dtype=f64) / D))
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.head(self.final_norm(x))


def _newton_schulz_fp32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz with fp32 in place of bf16."""
    a, b, c = ns_coefficients
    x = grad.float()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x


def synthetic_text(num_bytes, seed):
    """Sentences "Name w1 ... wn, Name.\\n" of dataset.cc's grammar (see the module comment)."""
    rng = random.Random(seed)
    word = lambda lo, hi: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")  # noqa: E731
                                  for _ in range(rng.randint(lo, hi)))
    names = list(dict.fromkeys(word(3, 5).capitalize() for _ in range(64)))[:8]
    words = list(dict.fromkeys(word(2, 7) for _ in range(256)))[:48]  # distinct, as dataset.cc's
    successors = [rng.sample(range(48), 4) for _ in words]
    out, size = [], 0
    while size < num_bytes:
        name, w = rng.choice(names), rng.randrange(48)
        line = [name, words[w]]
        for _ in range(rng.randint(3, 10) - 1):
            w = successors[w][rng.choices(range(4), weights=(0.5, 0.25, 0.15, 0.10))[0]]
            line.append(words[w])
        out.append(" ".join(line) + f", {name}.\n")
        size += len(out[-1])
    return "".join(out).encode()[:num_bytes]


def make_optimizers(model, a):
    hidden = [p for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2]
    ids = {id(p) for p in hidden} if a.optimizer == "muon" else set()
    rest = [p for p in model.parameters() if id(p) not in ids]
    adamw = torch.optim.AdamW(
        [{"params": [p for p in rest if p.dim() == 2], "weight_decay": a.weight_decay},
         {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=a.adamw_fused or None)
    if a.optimizer == "adamw":
        return [adamw]
    return [torch.optim.Muon(hidden, lr=a.muon_lr, weight_decay=a.muon_weight_decay,
                             momentum=0.95, nesterov=True), adamw]


def lr_multiplier(step, steps, warmup=20, floor=0.1):
    """optimizers/schedule.cc's warmup-cosine (SGDR, Loshchilov & Hutter) for 0-based `step`."""
    warmup = min(warmup, steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (steps - warmup)) if steps > warmup else 1.0
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def gemm_flops_per_s(cfg, rows, passes=5):
    """This rank's FLOP/s of torch.mm over one forward's GEMM shapes (x @ W.t() as nn.Linear), each
    shape's time weighted by its count: the median of `passes` passes after one warm-up."""
    shapes = [(torch.randn(M, K), torch.randn(N, K), count)
              for M, K, N, count in gpt_shapes.forward_gemms(cfg, rows).values()]
    flops = sum(count * 2 * x.size(0) * x.size(1) * w.size(0) for x, w, count in shapes)
    seconds = []
    for _ in range(passes + 1):
        total = 0.0
        for x, w, count in shapes:
            start = time.perf_counter()
            torch.mm(x, w.t())
            total += count * (time.perf_counter() - start)
        seconds.append(total)
    return flops / statistics.median(seconds[1:])


def worker(rank, a, init_file):
    # PR_SET_PDEATHSIG: a rank dies with its launcher (killed on a timeout) instead of training on.
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    torch.set_num_threads(a.num_threads)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=a.nproc, timeout=datetime.timedelta(seconds=a.timeout_s))
    cfg = gpt_shapes.preset(a.model)
    T, B, V = a.seq_len or cfg["max_seq_len"], a.global_batch // a.nproc, cfg["vocab_size"]
    if a.muon_ns_dtype == "fp32":
        torch_muon._zeropower_via_newtonschulz = _newton_schulz_fp32
    torch.manual_seed(a.seed)  # the same init on every rank (DDP would broadcast rank 0's anyway)
    model = Gpt(cfg)
    num_params = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model)
    opts = make_optimizers(model, a)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: lr_multiplier(s, a.steps))
              for o in opts]
    text = torch.frombuffer(bytearray(synthetic_text(1 << 20, a.seed)), dtype=torch.uint8).long()
    train = text[:len(text) - math.ceil(0.05 * len(text))]
    windows = (len(train) - 1) // T
    order = torch.randperm(windows, generator=torch.Generator().manual_seed(a.seed))

    def batch(step):
        w = order[(step * a.global_batch + rank * B + torch.arange(B)) % windows]
        idx = w[:, None] * T + torch.arange(T + 1)
        return train[idx[:, :-1]], train[idx[:, 1:]]

    def forward(step):
        x, y = batch(step)
        return F.cross_entropy(ddp(x).view(-1, V), y.reshape(-1))

    # --profile_step_start: the same Kineto trace, names and step phases as pretrain's, for
    # bench/trace_ops.py to compare op by op.
    profiler = None
    profile_end = a.profile_step_end or a.profile_step_start
    times, losses = [], []  # per step: seconds of [step, forward, backward, optimizer, CPU]
    for step in range(a.steps):
        if step + 1 == a.profile_step_start:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                              record_shapes=True)
            profiler.__enter__()
        start, cpu = time.perf_counter(), time.process_time()
        with torch.profiler.record_function("step/forward"):
            loss = forward(step)
        t1 = time.perf_counter()
        with torch.profiler.record_function("step/backward"):
            loss.backward()
        t2 = time.perf_counter()
        with torch.profiler.record_function("step/optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)
            for s in scheds:
                s.step()
        t3 = time.perf_counter()
        if profiler is not None and step + 1 == profile_end:
            profiler.__exit__(None, None, None)
            os.makedirs(a.profile_dir, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(
                a.profile_dir, f"rank{rank}.steps{a.profile_step_start}-{profile_end}.pt.trace.json"))
            profiler = None
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / a.nproc)
        times.append([time.perf_counter() - start, t1 - start, t2 - t1, t3 - t2,
                      time.process_time() - cpu])
        if rank == 0:
            print(f"step {step + 1}/{a.steps} loss {losses[-1]:.4f} {times[-1][0]:.3f} s",
                  file=sys.stderr, flush=True)
    steady = times[min(a.timing_warmup, a.steps - 1):]
    no_sync = []
    for step in range(min(3, len(steady))):
        with ddp.no_sync():
            loss = forward(step)
            start = time.perf_counter()
            loss.backward()
            no_sync.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    mean = lambda i: statistics.mean(t[i] for t in steady)  # noqa: E731
    exposed = max(0.0, mean(2) - statistics.mean(no_sync))
    dist.barrier()
    figures = torch.tensor([mean(1), mean(2) - exposed, mean(2), exposed, mean(3),
                            mean(4), gemm_flops_per_s(cfg, B * T)], dtype=torch.float64)
    worst = figures.clone()
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    least = figures.clone()
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    dist.all_reduce(figures)
    if rank == 0:
        step_s = statistics.median(t[0] for t in steady)
        tokens = a.global_batch * T
        flops = gpt_shapes.model_flops_per_step(cfg, tokens, T)
        print(json.dumps({
            "model": a.model, "optimizer": a.optimizer, "adamw_fused": a.adamw_fused,
            "muon_ns_dtype": a.muon_ns_dtype, "world_size": a.nproc, "num_threads": a.num_threads,
            "num_params": num_params, "seq_len": T, "tokens_per_step": tokens, "steps": a.steps,
            "timing_warmup": len(times) - len(steady), "step_s": step_s,
            "tokens_per_s": tokens / step_s, "cpu_s_per_step": figures[5].item(),
            "forward_s": worst[0].item(), "backward_s": worst[1].item(),
            "backward_with_sync_s": worst[2].item(), "exposed_comm_s": least[3].item(),
            "rank_skew_s": worst[3].item() - least[3].item(),
            "optimizer_s": worst[4].item(), "initial_loss": losses[0], "final_loss": losses[-1],
            "gemm_flops_per_s": figures[6].item(), "model_flops_per_step": flops,
            "mfu": flops / step_s / figures[6].item()}), flush=True)
    # Every rank done with every collective before any tears its Gloo pairs down: a rank that
    # exits first made the other one's Gloo thread abort ("terminate called without an active
    # exception", SIGABRT) in one of the section's runs.
    dist.barrier()
    dist.destroy_process_group()
    # Leave without running static destructors: after a profiled step Kineto keeps a thread whose
    # destruction at exit aborts the process ("terminate called without an active exception",
    # SIGABRT) in about one run of four here, after all the work and output are done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="small", choices=list(gpt_shapes.PRESETS))
    p.add_argument("--optimizer", default="muon", choices=["muon", "adamw"])
    p.add_argument("--adamw_fused", action="store_true",
                   help="AdamW(fused=True); else torch's default (on CPU its for-loop)")
    p.add_argument("--muon_ns_dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--nproc", type=int, default=2, help="local Gloo ranks")
    p.add_argument("--num_threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--global_batch", type=int, default=32, help="sequences per step, all ranks")
    p.add_argument("--seq_len", type=int, default=0, help="0: the preset's max_seq_len")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timing_warmup", type=int, default=1, help="first steps left out of timing")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--muon_lr", type=float, default=0.02)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--muon_weight_decay", type=float, default=0.01)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout_s", type=int, default=60, help="rendezvous and collective timeout")
    p.add_argument("--profile_step_start", type=int, default=0,
                   help="Kineto trace of steps [start, end] per rank in --profile_dir (as pretrain)")
    p.add_argument("--profile_step_end", type=int, default=0, help="0: --profile_step_start")
    p.add_argument("--profile_dir", default="", help="directory of the profile traces")
    a = p.parse_args()
    if a.nproc < 1 or a.global_batch % a.nproc or a.steps < 2:
        p.error(f"need --nproc >= 1 dividing --global_batch ({a.global_batch}) and --steps >= 2")
    if a.profile_step_start and not a.profile_dir:
        p.error("--profile_step_start needs --profile_dir")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(a, os.path.join(tmp, "rendezvous")), nprocs=a.nproc)


if __name__ == "__main__":
    main()
