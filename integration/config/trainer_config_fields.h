// Every TrainerConfig field, defined once: X(type, name, default, help). Expanded into the struct
// (trainer_config.h), the text-format config (ApplyConfigText: PretrainConfig's fields of the same
// names, which trainer_config_test checks against this list), pretrain's command-line flags and
// their --help, and the config fuzzer. A new field is one entry here plus its proto field. A
// fixed-choice field has a choices.h type (its flag and proto field are strings, parsed with the
// type's table).
#ifndef ORTHOSHARD_INTEGRATION_CONFIG_TRAINER_CONFIG_FIELDS_H_
#define ORTHOSHARD_INTEGRATION_CONFIG_TRAINER_CONFIG_FIELDS_H_

// clang-format off
#define ORTHOSHARD_TRAINER_CONFIG_FIELDS(X) \
  X(std::string, model, "tiny", \
    "model preset: tiny, small, gpt2-124m, tinyllama-1.1b, or mixture of experts: moe-tiny " \
    "(Mixtral's shape), moe-tiny-shared (with a shared expert: Qwen2-MoE's), moe-small") \
  X(int64_t, tp, 1, \
    "tensor parallel size (Megatron's layout, tp innermost: ranks 0..tp-1 form the first tp " \
    "group): attention heads, KV groups, the SwiGLU width and the vocabulary split over tp " \
    "ranks, the params data parallel over dp = world / tp. Divides the world size, the heads, " \
    "the KV groups, the FFN width and the vocabulary (no padding); dense models only") \
  X(int64_t, ep, 1, \
    "expert parallel size (MoE presets): the experts of each layer split evenly over ep ranks, " \
    "tokens reach them by all-to-all; dense params stay data parallel over the world, expert " \
    "params over expt_dp = world / ep. Divides the world size and the expert count") \
  X(int64_t, moe_top_k, 0, \
    "MoE: experts per token; 0 = the preset's (2). At most the expert count") \
  X(double, moe_aux_loss_coeff, -1, \
    "MoE: weight of the load-balancing loss (Switch Transformer: E x sum_e f_e P_e per layer, " \
    "added to the loss that backward runs on), in [0, 2^32] (beyond it its gradients' squares can " \
    "overflow fp32 in the clip's norm and every step is skipped); -1 = 0.01") \
  X(double, moe_z_loss_coeff, -1, \
    "MoE: weight of the router z-loss (ST-MoE: mean logsumexp(logits)^2 per layer), in [0, " \
    "2^32] as --moe_aux_loss_coeff; -1 = 0.001") \
  X(std::string, data, "synthetic", \
    "dataset: synthetic[:TOKENS] | text:PATH | nanogpt:PATH | megatron:PREFIX | prepared:DIR " \
    "(tools/prepare_data.py's output: tokens, vocabulary, EOD, val split)") \
  X(int64_t, vocab_size, 0, \
    "model vocabulary; 0 = the data's (a prepared dataset's tokenizer), else the preset's") \
  X(std::string, eval_data, "", \
    "held-out dataset (same forms as --data); empty = the data's val split (prepared:DIR), " \
    "else the last --eval_fraction of --data") \
  X(int64_t, eod_token, -1, \
    "end-of-document token id; -1 = the data's (prepared:DIR records it), else none") \
  X(bool, reset_attention_mask, true, \
    "attention and rotary positions restart after every EOD token and at every document end " \
    "a Megatron .idx records, so no token attends across a document boundary (Megatron-LM's " \
    "--reset-attention-mask and --reset-position-ids); without either the data is one stream") \
  X(bool, eod_mask_loss, false, \
    "drop the loss of the token predicted from an EOD (the next document's first token) " \
    "(Megatron-LM's --eod-mask-loss); the loss is then the mean over the counted tokens of " \
    "the whole step") \
  X(::orthoshard::integration::SampleOrder, sample_order, \
    ::orthoshard::integration::SampleOrder::kWindows, \
    "which samples each epoch trains on: windows (the data's stream cut into seq_len windows, " \
    "permuted per epoch) | documents (Megatron's sample index: the documents shuffled per " \
    "epoch, samples cut from that stream, then permuted; needs EOD tokens or a document index)") \
  X(OptimizerChoice, optimizer, OptimizerChoice::kMuon, \
    "muon (Muon for hidden matrices, AdamW for the rest) or adamw (AdamW for all)") \
  X(DistMode, dist, DistMode::kLayerwise, \
    "distribution: replicated (grads all-reduced, every rank steps every param), layerwise " \
    "(DDP reduce-scatter + layer-wise Muon + ZeRO-1 AdamW, params all-gathered per layer " \
    "before forward), distopt (ZeRO-1 for every param; needs --optimizer=adamw) or fsdp " \
    "(layerwise with sharded params, ZeRO-3: each rank keeps only its shard of params, grads " \
    "and state; each layer's params are gathered before its forward and its backward)") \
  X(Device, device, Device::kCpu, \
    "cpu (Gloo) or cuda (NCCL, one GPU per rank: cuda:LOCAL_RANK; needs a build with bazel " \
    "build --config=cuda)") \
  X(Precision, precision, Precision::kFp32, \
    "fp32, or bf16 mixed precision: bf16 params and activations (norms, attention softmax and " \
    "loss computed in fp32), fp32 main params and optimizer state for what each rank updates, " \
    "gradients accumulated and reduced in fp32 unless --grad_reduce_in_fp32=false. fp32 is the " \
    "default because CPUs without bf16 arithmetic (AVX2-only) run bf16 GEMMs slower") \
  X(bool, grad_reduce_in_fp32, true, \
    "--precision=bf16: accumulate and reduce gradients in fp32 buffers; false keeps them bf16 " \
    "(half the gradient memory and wire bytes, bf16 rounding in every accumulation and sum)") \
  X(RecomputeMode, recompute, RecomputeMode::kNone, \
    "activation recompute (Megatron-LM's granularities): none, full (keep only each block's " \
    "input; backward runs the block's forward again: about one more forward per step) or " \
    "selective (recompute only the attention core, scaled_dot_product_attention of q, k, v). " \
    "Bitwise the same training as none") \
  X(int64_t, recompute_layers, -1, \
    "with --recompute: recompute only the first N blocks (Megatron's --recompute-method=block), " \
    "N in [1, the model's layers]; -1 = every block") \
  X(int64_t, steps, 300, \
    "optimizer steps") \
  X(int64_t, global_batch, 32, \
    "samples per step over all ranks (divisible by ranks x micro_batches)") \
  X(int64_t, micro_batches, 1, \
    "gradient-accumulation micro-batches per step on each rank") \
  X(int64_t, seq_len, 0, \
    "tokens per sample; 0 = the model's max_seq_len") \
  X(double, lr, 3e-3, \
    "AdamW base learning rate (all params with --optimizer=adamw), > 0 and at most 2^64; lr x " \
    "--weight_decay <= 2 and lr / (1 - --adam_beta1) <= 2^64") \
  X(double, muon_lr, 0.02, \
    "Muon base learning rate, > 0 and at most 2^39; muon_lr x --muon_weight_decay <= 2 and " \
    "muon_lr x the scale rule's factor (1, 0.2 or --muon_extra_scale) <= 2^39") \
  X(double, weight_decay, 0.01, \
    "AdamW weight decay of 2-D params, >= 0") \
  X(bool, adamw_fused, false, \
    "AdamW by ATen's fused kernel, bitwise torch.optim.AdamW(fused=True): 3-4x faster on CPU, " \
    "but a ZeRO-1 slice of a param no longer updates bitwise as the whole param would") \
  X(double, muon_weight_decay, 0.01, \
    "Muon weight decay, >= 0") \
  X(double, muon_momentum, 0.95, \
    "Muon momentum mu, in [0, 1)") \
  X(bool, muon_nesterov, true, \
    "Muon: Nesterov momentum (the update is g + mu (B - g)); false uses the buffer B") \
  X(optimizers::MuonTpMode, muon_tp_mode, optimizers::MuonTpMode::kOwner, \
    "Muon on tensor-parallel matrices (--tp > 1): owner (each matrix gathered to one home in " \
    "its tp group, orthogonalised once there, slices returned: 1/tp of duplicated's " \
    "Newton-Schulz work, the same update bit for bit), duplicated (Megatron's default: every tp " \
    "rank gathers and orthogonalises every matrix) or blockwise (each rank its own slice: no " \
    "communication, but the update changes with tp); refused when given at --tp 1 or with " \
    "--optimizer=adamw") \
  X(optimizers::MuonScaleRule, muon_scale_rule, optimizers::MuonScaleRule::kOriginal, \
    "Muon lr scale per matrix shape: original (sqrt(max(1, rows/cols)), torch.optim.Muon), " \
    "match_rms_adamw (0.2 sqrt(max(rows, cols)), Moonshot) or spectral (--muon_extra_scale x " \
    "sqrt(max(rows, cols)), Megatron-LM)") \
  X(double, muon_extra_scale, 1.0, \
    "the factor of --muon_scale_rule=spectral, in (0, 2^64]; refused when given with another " \
    "rule") \
  X(int, muon_ns_steps, 5, \
    "Newton-Schulz iterations, in [1, 100)") \
  X(std::string, muon_ns_coefficients, "simple", \
    "Newton-Schulz coefficient schedule: simple (3.4445, -4.7750, 2.0315 every iteration), " \
    "polar_express (the 5 per-iteration quintics of arXiv:2505.16932, as modded-nanogpt; the " \
    "last repeats), Megatron-LM's quintic (5 triples) or aol (4 triples; fitted for AOL-scaled " \
    "inputs, it flips singular values above 0.88 of the Frobenius norm), both cycled as NVIDIA " \
    "Emerging-Optimizers runs them, so --muon_ns_steps must be a multiple of 5 or 4; or " \
    "a,b,c[;a,b,c...] (a triple per iteration; the last repeats; coefficients within +-1024 that " \
    "keep singular values within [0, 16] over --muon_ns_steps)") \
  X(optimizers::NsDType, muon_ns_dtype, optimizers::NsDType::kBFloat16, \
    "dtype of Muon's Newton-Schulz iteration: bf16 (as torch.optim.Muon) or fp32 (faster on " \
    "CPUs without bf16 arithmetic, such as AVX2-only ones)") \
  X(double, adam_beta1, 0.9, \
    "AdamW first-moment decay, in [0, 1)") \
  X(double, adam_beta2, 0.95, \
    "AdamW second-moment decay, in [0, 1)") \
  X(double, adam_eps, 1e-8, \
    "AdamW epsilon (added to the bias-corrected root), in [0, 2^64]") \
  X(std::string, route, "", \
    "comma-separated GLOB=OPTIMIZER routing overrides (muon or adamw), checked in order before " \
    "the default rules (2-D hidden matrices to Muon; embeddings, head, norms, biases, MoE " \
    "routers and gates to AdamW), e.g. '*experts*=adamw' (AdamW on experts, as Megatron-LM's " \
    "layer-wise optimizer does) or '*router*=muon'; only 2-D params can go to Muon, and every " \
    "entry must match a param of the model (checked before launch); refused with " \
    "--optimizer=adamw (every param goes to AdamW)") \
  X(std::string, no_weight_decay, "", \
    "comma-separated globs of param names never weight-decayed, by either optimizer (e.g. " \
    "'embedding*,output_layer*'); norm weights and other non-matrix params never are") \
  X(double, max_grad_norm, 1.0, \
    "global-norm clip (finite); <= 0 disables") \
  X(optimizers::ClipMode, clip_mode, optimizers::ClipMode::kAllBeforeMomentum, \
    "all: one global norm over every gradient clips all of them, Muon's before its momentum " \
    "(Megatron-LM); exclude_muon: the norm and clip cover AdamW's params only (Newton-Schulz " \
    "normalises Muon's update anyway)") \
  X(double, qk_clip_threshold, 0.0, \
    "QK-clip (MuonClip, Kimi K2) threshold tau: after each step, the query and key rows of every " \
    "KV group whose largest attention logit (q.k/sqrt(d) after rotary, over the step's attended " \
    "pairs on all ranks) exceeded tau are scaled by sqrt(tau / that logit), whichever optimizer " \
    "owns the qkv weights (Kimi K2 used 100); in [0, FLT_MAX] (an fp32 logit never exceeds it); " \
    "0 = off (no logits are measured)") \
  X(optimizers::ScheduleKind, schedule, optimizers::ScheduleKind::kWarmupCosine, \
    "lr schedule: constant, cosine, linear, wsd") \
  X(int64_t, warmup_steps, 20, \
    "linear warmup steps (capped at --steps)") \
  X(double, min_lr_ratio, 0.1, \
    "floor of the lr decay, fraction of lr") \
  X(int64_t, decay_steps, 0, \
    "wsd: final decay steps; 0 = steps / 5") \
  X(int64_t, eval_every, 100, \
    "eval every N steps (always before the first and after the last); 0 = end only") \
  X(int64_t, eval_batches, 4, \
    "eval micro-batches per rank") \
  X(double, eval_fraction, 0.05, \
    "tail of the data held out for eval") \
  X(int64_t, bucket_elems, 0, \
    "soft minimum grad bucket size (elements); 0 = auto: 65536 (grown by --target_buckets) " \
    "for replicated, layerwise and distopt; for fsdp half the model's largest block, so that " \
    "each layer spans >= 2 bucket groups where whole Muon matrices allow it " \
    "(--target_buckets unused)") \
  X(int64_t, target_buckets, 4, \
    "grow each buffer's soft minimum bucket size to its elements / target_buckets, up to " \
    "--max_bucket_elems: about this many buckets for a small model, fewer and larger " \
    "collectives; 0 = --bucket_elems alone") \
  X(int64_t, max_bucket_elems, int64_t{25} << 18, \
    "the most --target_buckets grows a bucket to (elements; 25 MiB of fp32, DDP's default " \
    "bucket_cap_mb)") \
  X(double, bucket_padding, 0.001, \
    "layerwise: padding (fraction of a bucket) at which the layout closes a bucket; higher " \
    "gives more, smaller buckets (more overlap) for models whose matrices pack unevenly") \
  X(int64_t, min_buckets, 4, \
    "layerwise: the fewest buckets a Muon buffer should get, so that its reduce-scatters and " \
    "all-gathers overlap compute even in a small model: below it, the padding tolerance is " \
    "doubled from --bucket_padding up to --max_bucket_padding until the layout has this many " \
    "(else the most it found); 0 = off") \
  X(double, max_bucket_padding, 0.05, \
    "layerwise: the highest padding tolerance --min_buckets may raise to") \
  X(bool, muon_batched_ns, false, \
    "orthogonalise a rank's same-shape Muon matrices as one batched Newton-Schulz (bmm): " \
    "several times faster on a GPU, about even on a CPU; equal to the per-matrix iteration " \
    "within its rounding") \
  X(NsForm, muon_ns_form, NsForm::kAuto, \
    "how Newton-Schulz is evaluated for Muon matrices whose long side is at least twice the " \
    "short one (an MLP's): direct (torch.optim.Muon's products), gram (on the Gram matrix: the " \
    "same iteration rearranged, ~30% fewer FLOPs for [4h, h] at 5 steps; fp32 iteration only; " \
    "it rounds more: per call 14-94x the direct form's fp32 error on decaying spectra such as " \
    "momentum's, 1.6e-5-1.0e-4 against 0.5-2.9e-6, ~1x on a Gaussian matrix, still far below " \
    "bf16's; measured by bench/ns_rounding.py) or auto (gram for the fp32 iteration, direct for " \
    "bf16)") \
  X(bool, overlap_grad_reduce, true, \
    "launch each bucket group's gradient reduce-scatter (all-reduce when replicated) during " \
    "backward as soon as its gradients are in; false launches them all after backward") \
  X(bool, overlap_param_gather, true, \
    "layerwise/distopt: start each bucket group's param all-gather as soon as this rank's " \
    "part of it is updated and wait on it just before the first layer reading it; false " \
    "gathers everything after the optimizer step and waits before the next forward") \
  X(bool, reshard_after_forward, true, \
    "fsdp: free a layer's gathered params after its forward and gather them again for its " \
    "backward (least memory); false keeps them from forward to backward (one gather per " \
    "micro-batch instead of two, the whole model's params held meanwhile)") \
  X(bool, prefetch_params, true, \
    "fsdp: gather the next layer's params while the current one computes (forward and " \
    "backward); false gathers each when its layer starts (to measure what prefetching hides)") \
  X(int64_t, fsdp_grad_syncs_in_flight, 1, \
    "fsdp: the most gradient reduce-scatters left in flight when another bucket group's full " \
    "grads are created (older ones are waited on first); 0 = least memory (a layer's " \
    "reduce-scatter overlaps only the next layer's backward up to its first weight gradient), " \
    "higher = more overlap and more full grads held; >= 0") \
  X(FsdpGradAccum, fsdp_grad_accum, FsdpGradAccum::kFull, \
    "fsdp with --micro_batches > 1: full (accumulate each rank's full gradients over the " \
    "micro-batches, reduce-scatter once: the whole grad buffer held meanwhile; bitwise the " \
    "other modes' sum) or sharded (reduce-scatter every micro-batch and add it into this " \
    "rank's grad shard: no full grads across micro-batches, the same terms summed in another " \
    "order, so equal to full within a few fp32 roundings, bitwise at one micro-batch)") \
  X(int64_t, profile_step_start, 0, \
    "record an operator-level profile (LibTorch's Kineto, as torch.profiler) from this step to " \
    "--profile_step_end on every rank, one Chrome trace per rank in --profile_dir; 0 = off") \
  X(int64_t, profile_step_end, 0, \
    "last profiled step (inclusive); 0 = --profile_step_start") \
  X(std::string, profile_dir, "", \
    "directory of the profile traces; empty = --log_dir") \
  X(int64_t, check_every, 100, \
    "compare a param checksum across ranks every N steps (and at the end); 0 = end only") \
  X(bool, log_params_norm, false, \
    "compute the L2 norm of all params entering each step (one more pass over what each rank " \
    "updates, carried by the step's statistics all-reduce): log line, TensorBoard " \
    "train/params_norm, summary JSON") \
  X(bool, log_num_zeros_in_grad, false, \
    "count the gradient elements that are exactly zero each step (as --log_params_norm): log " \
    "line, TensorBoard train/num_zeros_in_grad, summary JSON") \
  X(int64_t, log_every, 10, \
    "without a terminal: a progress line every N steps") \
  X(std::string, log_dir, "", \
    "TensorBoard event files (rank 0); empty = none") \
  X(std::string, save_dir, "", \
    "checkpoint root (layerwise/distopt): step_NNNNNN/ dirs + `latest`; saved at the end") \
  X(int64_t, save_every, 0, \
    "also save a checkpoint every N steps (needs --save_dir); 0 = at the end only") \
  X(ResumeMode, resume, ResumeMode::kFalse, \
    "true (or bare --resume): continue from --save_dir's latest checkpoint (any saved rank " \
    "count); exit 2 if it is missing, corrupt or from another model/optimizer/data setup. auto: " \
    "the same when --save_dir has a `latest`, else start afresh (one command for a first " \
    "start and every requeue or elastic restart). false: start afresh") \
  X(int64_t, stop_after, 0, \
    "stop after this step; the lr schedule still spans --steps (for a later --resume); 0 = " \
    "run to --steps") \
  X(int, keep_checkpoints, 3, \
    "complete checkpoints kept in --save_dir; 0 = all") \
  X(int64_t, max_consecutive_skips, 10, \
    "stop (exit 1) after this many consecutive steps skipped for non-finite gradients, saving" \
    " a final checkpoint when --save_dir is set; 0 = never") \
  X(SaveFailurePolicy, on_save_failure, SaveFailurePolicy::kStop, \
    "a checkpoint save that fails (disk full, I/O error): stop (exit non-zero naming the " \
    "file) or continue (report it on every rank, count it in the JSON's failed_saves, save " \
    "again at the next --save_every; a failed final save still exits non-zero)") \
  X(int64_t, max_consecutive_failed_saves, 3, \
    "with --on_save_failure=continue: stop after this many saves in a row failed; 0 = never") \
  X(uint64_t, seed, 1234, \
    "seed of model init, data order and synthetic corpus") \
  X(int, num_threads, 1, \
    "intra-op threads per rank (at::set_num_threads); 0 = LibTorch's default") \
  X(bool, retain_freed_memory, true, \
    "keep memory that tensors free in the process for the next step (glibc malloc: blocks up " \
    "to 32 MiB from the heap, trimmed only beyond 1 GiB free) instead of returning it to the " \
    "kernel and faulting in zeroed pages again every step") \
  X(int64_t, distributed_timeout_s, 60, \
    "seconds any wait on another rank may take (a collective, the rendezvous) before the job " \
    "fails naming the rank")
// clang-format on

#endif  // ORTHOSHARD_INTEGRATION_CONFIG_TRAINER_CONFIG_FIELDS_H_
