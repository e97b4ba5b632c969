"""Training FLOPs: the published GPT formulas and the per-layer matmul counts behind them.

Legend: B global batch (sequences), b micro-batch, s sequence length, L layers,
h hidden size, a heads, k KV heads, d head dim, f FFN size, V vocab, t tensor-parallel
degree. A multiply-add is 2 FLOP. Results are FLOP (float).
Sources: Narayanan et al. 2021 (SC21) sec. 5.1 eq. (3); Korthikanti et al. 2022 appendix A
eqs. (7), (8); docs/cost-model.md#training-flops.
Pure and uncached: the training estimate memoises what a search asks for repeatedly.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.params import (
    attention_shape,
    expert_params,
    experts_per_gpu,
    kv_heads_per_gpu,
    latent_projection_params,
    num_attention_layers,
    recurrent_projection_widths,
    shared_expert_size,
)
from planner.specs import ModelSpec


def megatron_flops_per_step(B: int, s: int, L: int, h: int, V: int) -> float:
    """F = 96*B*s*L*h^2 * (1 + s/(6h) + V/(16*L*h)), with full recomputation.

    Narayanan et al. 2021, eq. 3; Megatron's reported teraFLOP/s per GPU is
    F / (step time * GPUs). Assumes a GPT block (4h MLP, MHA).
    """
    return 96.0 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def model_flops_per_step(B: int, s: int, L: int, h: int, V: int) -> float:
    """Model FLOPs, no recomputation: 72*B*L*s*h^2 * (1 + s/(6h) + V/(12*h*L)).

    Korthikanti et al. 2022, eq. 7 (the numerator of MFU).
    """
    return 72.0 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


def selective_recompute_flops_per_step(B: int, s: int, L: int, h: int, V: int) -> float:
    """Hardware FLOPs with selective recomputation: 72*B*L*s*h^2 * (1 + s/(3h) + V/(12*h*L)).

    Korthikanti et al. 2022, eq. 8, as published (it counts the attention term twice;
    the per-layer count below adds one forward of the attention core instead).
    """
    return 72.0 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * h * L))


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply per GPU, C[M,N] = A[M,K] @ B[K,N], repeated `count` times."""

    m: int
    n: int
    k: int
    count: float = 1
    """How many times per layer; a fraction for the mean block of a hybrid model (the share
    of its layers that have this GEMM)."""

    @property
    def flops(self) -> float:
        """2*M*N*K per product."""
        return 2.0 * self.m * self.n * self.k * self.count


QUERY_GEMM = 0
"""layer_gemms_forward's positions. 0: the QKV projection (MLA: the query up-projection)."""
OUTPUT_GEMM = 1
"""The attention output projection (row-parallel)."""
MLP_UP_GEMM = 2
"""The dense MLP's up (and gate) projection (column-parallel); its count is the MLP-bearing share."""
MLP_DOWN_GEMM = 3
"""The dense MLP's down projection (row-parallel)."""
CORE_GEMMS = slice(4, 6)
"""The attention core's per-head scores and context GEMMs."""
EXTRA_GEMMS = slice(6, None)
"""After the core: MLA's KV up-projection (MLA_KV_UP_GEMM) and down-projections, or a hybrid's
recurrent projections."""
MLA_KV_UP_GEMM = 6
"""MLA's key and value up-projection (column-parallel)."""


def window_pairs_fraction(model: ModelSpec, sequence_tokens: int) -> float:
    """The attention layers' mean share of a full causal mask's query-key pairs that a
    flash kernel computes when some layers attend within a sliding window W (the kernels skip
    the blocks wholly outside it): a window layer over S tokens keeps the pairs of each query
    with itself and the W - 1 before it, S*W - W*(W - 1)/2 for S >= W, of the full layer's
    S*(S + 1)/2 (all of them for S <= W). gpt-oss-120b at S = 4,096, W = 128: a window layer
    keeps (4,096*128 - 128*127/2) / (4,096*4,097/2) = 516,160 / 8,390,656 = 6.15%; 18 of its
    36 layers do, so the mean is (18 + 18*0.0615) / 36 = 53.1%. 1 without a window."""
    windows = model.num_window_layers
    attending = model.num_hidden_layers - model.num_recurrent_layers
    if not windows or attending <= 0 or model.sliding_window >= sequence_tokens:
        return 1.0
    w, s = model.sliding_window, sequence_tokens
    kept = (s * w - w * (w - 1) / 2) / (s * (s + 1) / 2)
    return (attending - windows + windows * kept) / attending


def layer_gemms_forward(model: ModelSpec, micro_batch: int, s: int, tp: int) -> tuple[Gemm, ...]:
    """The forward matmuls of one transformer block on one GPU of a TP group (Megatron).

    QKV column-parallel [bs, h] x [h, a/t*d + max(1, k/t)*(d + d_v)]; output projection
    row-parallel [bs, a*d_v/t] x [a*d_v/t, h] (d_v = d unless v_head_dim says otherwise); MLP up [bs, h] x [h, f/t] (x2 gated), down
    [bs, f/t] x [f/t, h]; attention core per head: scores [s, d] x [d, s] and context
    [s, s] x [s, d], b*a/t of each (no causal-mask saving: Megatron's 2021 kernels).
    Hybrid models, the mean block: the attention GEMMs count L_a/L, the MLP's (L - mixer-only)/L,
    and a recurrent mixer's in and out projections [bs, h] x [h, W_in/t], [bs, W_out/t] x
    [W_out/t, h] (recurrent_projection_widths) count R/L: 2 FLOP per parameter per token; the
    scan itself (linear in s) is not counted.
    """
    if model.is_mla:
        return _mla_layer_gemms_forward(model, micro_batch, s, tp)
    h, a, d, f = model.hidden_size, model.num_attention_heads, model.head_dim, model.intermediate_size
    d_v = attention_shape(model, False).value_dim  # v_head_dim where values are narrower (MiMo-V2)
    tokens = micro_batch * s
    heads_per_gpu = a // tp
    q_width = (2 if model.attention_output_gate else 1) * heads_per_gpu
    qkv_width = q_width * d + kv_heads_per_gpu(model, tp) * (d + d_v)
    num_up = 2 if model.gated_mlp else 1
    layers = model.num_hidden_layers
    attention, mlp = num_attention_layers(model) / layers, 1 - model.num_mixer_only_layers / layers
    gemms = (
        Gemm(tokens, qkv_width, h, attention),
        Gemm(tokens, h, heads_per_gpu * d_v, attention),
        Gemm(tokens, num_up * f // tp, h, mlp),
        Gemm(tokens, h, f // tp, mlp),
        Gemm(s, s, d, count=micro_batch * heads_per_gpu * attention),
        Gemm(s, d_v, s, count=micro_batch * heads_per_gpu * attention),
    )
    if not model.num_recurrent_layers:
        return gemms
    width_in, width_out = recurrent_projection_widths(model)
    recurrent = model.num_recurrent_layers / layers
    return gemms + (Gemm(tokens, width_in // tp, h, recurrent), Gemm(tokens, h, width_out // tp, recurrent))


def _mla_layer_gemms_forward(model: ModelSpec, micro_batch: int, s: int, tp: int) -> tuple[Gemm, ...]:
    """layer_gemms_forward for MLA as Megatron-Core trains it (multi_latent_attention.py,
    core_v0.19.0): the down-projections duplicated on every TP rank, [bs, h] x [h, r_q] and
    [bs, h] x [h, r_kv + d_rope]; the up-projections column-parallel, queries [bs, r_q] x
    [r_q, a/t*(d_nope + d_rope)] (or [h, ...] without q_lora_rank) and keys and values
    [bs, r_kv] x [r_kv, a/t*(d_nope + d_v)]; the output row-parallel [bs, a/t*d_v] x
    [a/t*d_v, h]; the core per head scores [s, d_nope + d_rope] x [.., s] and context
    [s, s] x [s, d_v]. Positions as layer_gemms_forward's: 0 the query up-projection, 1 the
    output, 2-3 the MLP, 4-5 the core, then the KV up-projection and the down-projections.
    DeepSeek-V3's attention then costs its 187.1M weights' 2 FLOP per token plus
    4 * s * 128 * 160 per token for the core, where the GQA formula at head dim
    7,168 / 128 = 56 counted 4 * s * 128 * 56."""
    h, a, f = model.hidden_size, model.num_attention_heads, model.intermediate_size
    r_q, r_kv, d_rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    d_qk, d_v = model.qk_nope_head_dim + d_rope, model.v_head_dim
    tokens = micro_batch * s
    heads = a // tp
    num_up = 2 if model.gated_mlp else 1
    gemms = (
        Gemm(tokens, heads * d_qk, r_q or h),
        Gemm(tokens, h, heads * d_v),
        Gemm(tokens, num_up * f // tp, h),
        Gemm(tokens, h, f // tp),
        Gemm(s, s, d_qk, count=micro_batch * heads),
        Gemm(s, d_v, s, count=micro_batch * heads),
        Gemm(tokens, heads * (model.qk_nope_head_dim + d_v), r_kv),
        Gemm(tokens, r_kv + d_rope, h),
    )
    return gemms + ((Gemm(tokens, r_q, h),) if r_q else ())


def moe_mlp_gemms_forward(model: ModelSpec, micro_batch: int, s: int, tp: int, ep: int = 1,
                          dp_per_ep_group: int = 1) -> tuple[Gemm, ...]:
    """The forward matmuls of one MoE layer's MLP on one GPU (Megatron-Core, grouped GEMM).

    Shared experts (f_s = their summed FFN size) as a TP-split MLP: [bs, h] x [h, c*f_s/t],
    [bs, f_s/t] x [f_s/t, h]. Routed: each of the GPU's E_g experts sees
    n_x = b*s*d_ep*k/E rows (uniform routing; d_ep the data-parallel ranks of the EP group,
    1 without EP: the TP group's tokens), up [n_x, h] x [h, c*f_x/t_x] and down
    [n_x, f_x/t_x] x [f_x/t_x, h], E_g = E and t_x = t without EP (every expert TP-split),
    E_g = ceil(E/ep) and t_x = 1 with it (--expert-tensor-parallel-size 1). c = 2 gated.
    Per GPU the routed FLOPs are 2*b*s*k*c'*h*f_x/t either way (c' = 3 gated); EP changes
    the GEMM shapes (more rows, unsplit columns), which the shape rule prices."""
    h, k, num_experts = model.hidden_size, model.num_experts_per_tok, model.num_local_experts
    num_up = 2 if model.gated_mlp else 1
    tokens = micro_batch * s
    gemms = []
    shared = model.num_shared_experts * shared_expert_size(model)
    if shared:
        gemms += [Gemm(tokens, num_up * shared // tp, h), Gemm(tokens, h, shared // tp)]
    split = tp if ep <= 1 else 1
    rows = max(1, round(tokens * dp_per_ep_group * k / num_experts))
    f = model.expert_intermediate_size // split
    count = experts_per_gpu(model, ep)
    return (*gemms, Gemm(rows, num_up * f, h, count), Gemm(rows, h, f, count))


def attention_core_gemms(gemms: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """The two per-head GEMMs (what selective recomputation runs again)."""
    return gemms[CORE_GEMMS]


def linear_gemms(gemms: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """The weight GEMMs of layer_gemms_forward: QKV, output, MLP up and down, and a hybrid's
    recurrent projections."""
    return gemms[:CORE_GEMMS.start] + gemms[EXTRA_GEMMS]


def logits_gemm(model: ModelSpec, micro_batch: int, s: int, tp: int) -> Gemm:
    """Output layer, vocab-parallel: [bs, h] x [h, V/t] (2*b*s*h*V/t FLOP)."""
    return Gemm(micro_batch * s, -(-model.vocab_size // tp), model.hidden_size)


def model_flops_per_sequence(model: ModelSpec, s: int, causal: bool = False) -> float:
    """Forward + backward (3x forward) matmul FLOPs of one sequence, whole model.

    3 * (L * (2*s*W_layer + 4*s^2*a*d) + 2*s*h*V), W_layer the block's matmul weights.
    For a GPT block (W_layer = 12h^2, a*d = h) this is eq. 7 divided by B. `causal`: the
    attention core counts only the pairs a causal mask keeps, 4*s^2*a*d / 2, as Megatron-LM
    core_v0.19.0 reports it (training.py num_floating_point_operations: "causal mask (only
    half of the mask is non-zero)") and flash kernels compute it; the 2021 count (eq. 7) keeps
    the whole square. Multi-token-prediction modules (model.num_mtp_layers) add their blocks
    and heads (_mtp_flops).
    """
    logits = logits_gemm(model, 1, s, 1).flops
    return 3.0 * (model.num_hidden_layers * _layer_flops(model, s, causal) + logits + sum(_mtp_flops(model, s, causal)))


def megatron_flops_per_sequence(model: ModelSpec, s: int, causal: bool = False) -> float:
    """Megatron's full-recompute count per sequence: 4 layer passes, 3 logits passes
    (`causal` as in model_flops_per_sequence; MTP blocks as layers, their heads as logits).

    For a GPT block this is eq. 3 divided by B.
    """
    logits = logits_gemm(model, 1, s, 1).flops
    mtp_blocks, mtp_heads = _mtp_flops(model, s, causal)
    return 4.0 * (model.num_hidden_layers * _layer_flops(model, s, causal) + mtp_blocks) + 3.0 * (logits + mtp_heads)


def _mtp_flops(model: ModelSpec, s: int, causal: bool) -> tuple[float, float]:
    """The multi-token-prediction modules' forward FLOPs for one sequence as (blocks, heads):
    each a block of the last layer's kind (an MoE layer for an MoE model), and its head:
    eh_proj 2*s*2h*h and its own pass of the output layer 2*s*h*V, as Megatron-LM counts them
    (training.py num_floating_point_operations, core_v0.14.0: the MTP layers among the layers,
    "MTP eh proj", logits x (mtp_num_layers + 1); its norms' 3h are left out here as the
    blocks' are). (0, 0) without MTP."""
    if not model.num_mtp_layers:
        return 0.0, 0.0
    h, n = model.hidden_size, model.num_mtp_layers
    block = _layer_flops(model, s, causal, moe_share=1.0 if model.is_moe else None)
    return n * block, n * (2.0 * s * 2 * h * h + logits_gemm(model, 1, s, 1).flops)


def _layer_flops(model: ModelSpec, s: int, causal: bool, moe_share: float | None = None) -> float:
    """One layer's forward FLOPs for one sequence (the mean layer; `moe_share` 1: an MoE layer);
    the attention core halved when causal. MoE: the MoE layers' MLP is the experts a token visits, 2*s*k*P_expert, plus
    the shared experts, in place of the dense FFN (which the dense layers keep): Mixtral's two
    experts per token, not one; Megatron-LM core_v0.19.0 training.py
    num_floating_point_operations counts the same (moe_ffn_hidden_size x num_experts_routed_to,
    plus the shared experts)."""
    gemms = layer_gemms_forward(model, 1, s, 1)
    core = sum(g.flops for g in attention_core_gemms(gemms))
    total = sum(g.flops for g in gemms) - (core / 2 if causal else 0.0)
    if not model.is_moe:
        return total
    dense_mlp = gemms[MLP_UP_GEMM].flops + gemms[MLP_DOWN_GEMM].flops
    shared = sum(g.flops for g in moe_mlp_gemms_forward(model, 1, s, 1)[:-2]) if model.num_shared_experts else 0.0
    routed = model.num_experts_per_tok * expert_params(model) + latent_projection_params(model)
    moe_mlp = shared + 2.0 * s * routed
    share = model.num_moe_layers / model.num_hidden_layers if moe_share is None else moe_share
    return total + share * (moe_mlp - dense_mlp)
