"""The GPT presets of model/gpt_config.cc as plain dicts, and the arithmetic the benchmarks
need about them: parameter counts, the forward GEMMs of one step, the model FLOPs per step and
Muon's Newton–Schulz FLOPs. Standard library only (report_lib and its test use it; so does
torch_peer.py, which builds the model from these dicts).
"""

# Fields as GptConfig's (model/gpt_config.h); rope_theta, norm_eps and init_std are the
# struct's defaults in every preset.
_COMMON = {"rope_theta": 10000.0, "norm_eps": 1e-5, "init_std": 0.02, "tie_embeddings": True}
PRESETS = {
    "tiny": dict(_COMMON, vocab_size=256, max_seq_len=64, num_layers=2, hidden=64, num_heads=4,
                 num_kv_heads=4, ffn_hidden=192),
    "small": dict(_COMMON, vocab_size=256, max_seq_len=256, num_layers=4, hidden=256,
                  num_heads=8, num_kv_heads=2, ffn_hidden=704),
    "gpt2-124m": dict(_COMMON, vocab_size=50304, max_seq_len=1024, num_layers=12, hidden=768,
                      num_heads=12, num_kv_heads=12, ffn_hidden=2048),
    "tinyllama-1.1b": dict(_COMMON, vocab_size=32000, max_seq_len=2048, num_layers=22,
                           hidden=2048, num_heads=32, num_kv_heads=4, ffn_hidden=5632,
                           tie_embeddings=False),
}


def preset(name):
    """The config dict of preset `name`. Raises ValueError naming the known presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; expected one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def hidden_matrices(cfg):
    """The [rows, cols] of one layer's hidden matrices as separate Linear weights: q, k, v, proj,
    gate, up, fc2 (orthoshard's fused qkv and fc1 split into these same logical blocks for Muon)."""
    C, F = cfg["hidden"], cfg["ffn_hidden"]
    D = C // cfg["num_heads"]
    return {"q": (cfg["num_heads"] * D, C), "k": (cfg["num_kv_heads"] * D, C),
            "v": (cfg["num_kv_heads"] * D, C), "proj": (C, cfg["num_heads"] * D),
            "gate": (F, C), "up": (F, C), "fc2": (C, F)}


def hidden_matrix_params(cfg):
    """Elements of every layer's hidden matrices (GptHiddenMatrixCount): what Muon updates."""
    return cfg["num_layers"] * sum(r * c for r, c in hidden_matrices(cfg).values())


def param_count(cfg):
    """Parameters of the model (GptParamCount, what pretrain's summary reports as num_params)."""
    C, V = cfg["hidden"], cfg["vocab_size"]
    return (V * C + hidden_matrix_params(cfg) + cfg["num_layers"] * 2 * C + C
            + (0 if cfg["tie_embeddings"] else V * C))


def forward_gemms(cfg, rows):
    """The matrix products of one forward over `rows` = batch × seq tokens, as
    {name: (M, K, N, count)}: [M, K] × [K, N], `count` times per forward (the hidden Linears once
    per layer, the output head once). Attention's own products are not GEMMs of weights and are
    left out."""
    out = {name: (rows, c, r, cfg["num_layers"]) for name, (r, c) in hidden_matrices(cfg).items()}
    out["head"] = (rows, cfg["hidden"], cfg["vocab_size"], 1)
    return out


def model_flops_per_step(cfg, tokens_per_step, seq_len):
    """Model FLOPs of one training step (forward + backward) over `tokens_per_step` tokens in
    sequences of `seq_len`, as PaLM defines them (Chowdhery et al. 2022, appendix B):
      per token 6·N + 12·L·H·D·T
    with N the params that enter a matrix product (every hidden matrix plus the V×C output head,
    tied or not; the embedding lookup is no product), 6 = 2 FLOPs per multiply-add × (forward +
    2 × backward), and 12·L·H·D·T the attention scores QKᵀ and the weighted sum AV (2·2·T·H·D
    forward per token and layer, twice that backward; causal masking not discounted, as PaLM).
    Optimizer work (Newton–Schulz) and recomputation are not model FLOPs."""
    n = hidden_matrix_params(cfg) + cfg["vocab_size"] * cfg["hidden"]
    attention = 12 * cfg["num_layers"] * cfg["hidden"] * seq_len
    return tokens_per_step * (6 * n + attention)


def muon_ns_flops(cfg, ns_steps=5):
    """FLOPs of Newton–Schulz over every hidden matrix once (one replicated Muon step; the
    layer-wise mode splits them over the ranks): per [m, n] matrix with s = min(m, n),
    l = max(m, n), each iteration X·Xᵀ (2·s²·l), A·A (2·s³) and B·X (2·s²·l)."""
    total = 0
    for r, c in hidden_matrices(cfg).values():
        s, l = min(r, c), max(r, c)
        total += ns_steps * (4 * s * s * l + 2 * s ** 3)
    return cfg["num_layers"] * total
