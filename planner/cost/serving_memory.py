"""Serving memory per GPU and stage under vLLM semantics, and the checks vLLM enforces.

Legend: t/p tensor/pipeline degrees, L_s layers of stage s, k KV heads, d head dim,
T max_num_batched_tokens of vLLM's profile run. Budget = total * gpu_memory_utilization;
from it go the weights, the profile run's activation peak, non-torch memory (CUDA context,
NCCL buffers) and CUDA graphs; the rest is KV cache in 16-token blocks (B).
Sliding-window models: F_s full and S_s window layers of stage s, W the window, M
max_model_len; vLLM's hybrid KV cache manager keeps a window layer's last W - 1 tokens
(+ the in-flight ones) only (kv_cache_capacity). Hybrid models: A_s attention layers of the
stage hold KV, R_s recurrent layers a state of `state` bytes per running sequence, drawn from
the same pool (kv_tokens_with_state).
Sources: docs/cost-model.md (Serving: memory); vLLM's get_pp_indices (uneven stage
splits), EngineArgs.get_batch_defaults and, at 0.33.0, vllm/v1/core/kv_cache_planning.py
and kv_cache_utils.py (the hybrid KV cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from planner.cost import efficiency as eff
from planner.cost.moe import DEEPEP_NVL_BUFFER_BYTES, deepep_ll_buffer_bytes, moe_layers_of
from planner.cost.params import (
    activation_bytes_per_element,
    attention_shape,
    kv_bytes_per_token_per_layer_by_kind,
    kv_cache_format,
    layer_weight_bytes_per_gpu,
    lm_head_bytes_per_weight,
    moe_layer_excess_bytes_per_gpu,
    num_attention_layers,
    param_counts,
    recurrent_state_bytes_per_sequence,
    tp_head_reasons,
    tp_scale_group_reasons,
)
from planner.cost.speculative import DraftMemory, draft_memory
from planner.engines import (
    BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS,
    VllmRelease,
    v0_chunked_prefill_by_default,
    v0_max_num_batched_tokens,
    vllm_batch_tier,
)
from planner.layout import Layout
from planner.requests import DEFAULT_ALL2ALL_BACKEND, ServeRequest
from planner.specs import ClusterSpec, ModelSpec, computed_once
from planner.units import BYTES_PER_GIB, bytes_to_gib

FP32_BYTES = 4
"""The sampler works in fp32: Sampler.forward casts the logits with logits.to(torch.float32)
(vllm/v1/sample/sampler.py, v0.33.0); the softmax probabilities and the exponential noise are
fp32 too."""
SAMPLER_FP32_COPIES = 3
"""fp32 [S, V] tensors alive together in the warm-up's native path (TopKTopPSampler.forward_native
and random_sample, vllm/v1/sample/ops/topk_topp_sampler.py, v0.33.0): the fp32 logits, the
softmax probabilities and the exponential noise; top-k/top-p masking runs in place."""


@dataclass(frozen=True)
class StageMemory:
    """One GPU of pipeline stage `stage`, bytes."""

    stage: int
    num_layers: int
    weights_bytes: float
    activation_bytes: float
    overhead_bytes: float
    """Non-torch memory (CUDA context, NCCL buffers) and CUDA graphs."""
    kv_cache_bytes: float
    kv_bytes_per_token: int
    """KV of one token in every layer of the stage (what a sequence shorter than the window holds)."""
    kv_cache_tokens: int
    """What vLLM reports as "KV cache size: N tokens": the pool's blocks over 16 tokens; with
    sliding-window layers, max concurrency * max_model_len (kv_cache_capacity)."""
    budget_bytes: float
    num_window_layers: int = 0
    """Of num_layers, the sliding-window layers (they read and keep at most
    sliding_window_tokens of each sequence)."""
    sliding_window_tokens: int | None = None
    """The model's window (None: every layer attends in full)."""
    num_layers_without_kv: int = 0
    """Of num_layers, those without attention (recurrent and MLP-only layers of a hybrid)."""
    state_bytes_per_sequence: int = 0
    """Recurrent state one running sequence holds on one GPU of the stage (its R_s layers)."""
    kv_bytes_per_token_per_window_layer: int | None = None
    """One token in one window layer when it differs from a full layer (Gemma 4: 2*8*256 vs
    2*2*512 elements); None = every attention layer holds as much."""
    kv_cache_dtype: str = "auto"
    """--kv-cache-dtype: "fp8" stores (and, where the GPU has fp8 tensor cores, computes) the
    attention in fp8."""
    draft_weights_bytes: float = 0.0
    """Speculative decoding, last stage: the drafter's weights, within weights_bytes
    (speculative.draft_memory)."""
    draft_kv_bytes_per_token: int = 0
    """The drafter's KV of one token, beside kv_bytes_per_token in the same pool: kv_cache_tokens
    counts tokens that hold both."""
    num_moe_layers: float | None = None
    """Of num_layers, the MoE layers (stage_moe_layer_counts); None: the mean block's share
    (moe.moe_layers_of), what stage_moe_layers then reads."""
    kv_running_tokens: int | None = None
    """Tokens the pool holds as running sequences of the request's mean footprint
    (kv_tokens_per_running_sequence), what the concurrency is counted in (kv_limited_sequences):
    with sliding-window layers kv_running_capacity, below or above kv_cache_tokens (the
    admission count at max_model_len); None: kv_cache_tokens."""

    @property
    def running_tokens(self) -> int:
        """kv_running_tokens, or kv_cache_tokens where the two are the same."""
        return self.kv_cache_tokens if self.kv_running_tokens is None else self.kv_running_tokens

    @property
    def num_attention_layers(self) -> int:
        return self.num_layers - self.num_layers_without_kv

    @property
    def window_kv_bytes_per_token(self) -> int:
        """The part of kv_bytes_per_token on the window layers (every attention layer holds as much)."""
        layers = self.num_attention_layers
        if not layers:
            return 0
        per_layer = self.kv_bytes_per_token_per_window_layer or self.kv_bytes_per_token // layers
        return per_layer * self.num_window_layers

    def sequences_that_fit(self, sequence_tokens: int) -> float:
        """Sequences of sequence_tokens the cache holds at once: kv_cache_tokens / tokens, or
        with a recurrent state kv_cache_bytes / (tokens * kv + state) (each holds its state)."""
        if not self.state_bytes_per_sequence:
            return self.kv_cache_tokens / sequence_tokens
        return self.kv_cache_bytes / (sequence_tokens * (self.kv_bytes_per_token + self.draft_kv_bytes_per_token)
                                      + self.state_bytes_per_sequence)

    @property
    def max_sequence_tokens(self) -> int:
        """The longest sequence the cache holds: kv_cache_tokens, or with a recurrent state
        (kv_cache_bytes - state) / kv in whole blocks (a lone sequence needs its state too)."""
        if not self.state_bytes_per_sequence:
            return self.kv_cache_tokens
        if not self.kv_bytes_per_token:
            return 2**62 if self.kv_cache_bytes >= self.state_bytes_per_sequence else 0
        free = max(self.kv_cache_bytes - self.state_bytes_per_sequence, 0.0)
        per_token = self.kv_bytes_per_token + self.draft_kv_bytes_per_token
        return int(free // (per_token * eff.KV_BLOCK_SIZE_TOKENS)) * eff.KV_BLOCK_SIZE_TOKENS

    @property
    def used_bytes(self) -> float:
        return self.weights_bytes + self.activation_bytes + self.overhead_bytes + self.kv_cache_bytes


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """vLLM get_pp_indices: L // p each; the L % p extra layers go to the stages just
    before the last (counting back from the second-to-last), never to the last."""
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return counts


def stage_moe_layer_counts(model: ModelSpec, layer_counts: list[int]) -> list[float]:
    """MoE layers of each stage: with the dense layers' positions known (dense_layer_indices)
    those of the stage's own layers, else the mean block's share (moe_layers_of). DeepSeek-V3's
    61 layers over 4 stages (15, 15, 16, 15; stage_layer_counts), dense layers 0-2: 12, 15, 16,
    15, where the mean share gives 14.26, 14.26, 15.21, 14.26."""
    indices = model.dense_layer_indices
    if not model.is_moe or indices is None:
        return [moe_layers_of(model, num_layers) for num_layers in layer_counts]
    counts, start = [], 0
    for num_layers in layer_counts:
        end = start + num_layers
        counts.append(float(num_layers - sum(1 for i in indices if start <= i < end)))
        start = end
    return counts


def stage_moe_layers(model: ModelSpec, stage: StageMemory) -> float:
    """The stage's MoE layers: its own count where stage_memory set it, else the mean share."""
    return moe_layers_of(model, stage.num_layers) if stage.num_moe_layers is None else stage.num_moe_layers


def stage_moe_excess(model: ModelSpec, stage: StageMemory) -> float:
    """The stage's MoE layers above their mean share (0 where it holds the mean share)."""
    return stage_moe_layers(model, stage) - moe_layers_of(model, stage.num_layers)


def stage_window_layer_counts(model: ModelSpec, layer_counts: list[int]) -> list[int]:
    """Sliding-window layers of each stage (stage_share_of_layers)."""
    return stage_share_of_layers(model.num_kv_window_layers, model.num_hidden_layers, layer_counts)


def stage_share_of_layers(num_of_kind: int, num_layers: int, layer_counts: list[int]) -> list[int]:
    """Layers of one kind (S of L: window, attention or recurrent layers) on each stage, in
    proportion to the layers before each stage's end, floor(end * S / L) - floor(start * S / L)
    (the published patterns alternate: gpt-oss 1:1, Gemma 3 5:1, Qwen3.5 3:1 linear:full,
    Nemotron-H's Mamba/MLP pairs), so the stages sum to S."""
    out, start = [], 0
    for count in layer_counts:
        out.append((start + count) * num_of_kind // num_layers - start * num_of_kind // num_layers)
        start += count
    return out


def kv_tokens_per_running_sequence(input_len: float, output_len: float,
                                   context_tokens: float | None = None) -> float:
    """A running sequence's mean KV footprint in the steady state: I + O/2 + half a block.
    vLLM V1 allocates KV blocks as a request's tokens are scheduled (KVCacheManager.
    allocate_slots) and, when a running request needs a block and none is free, preempts the
    most recently admitted one (Scheduler.schedule): the cache is shared by sequences at every
    point of their decode, not reserved for each one's full I + O. Its last block is on average
    half full. `context_tokens`: the mean context when it is not I + O/2 (a length mix:
    ServeRequest.decode_context_tokens)."""
    context = input_len + output_len / 2 if context_tokens is None else context_tokens
    return context + eff.KV_BLOCK_SIZE_TOKENS / 2


def kv_bytes_per_sequence(stage: StageMemory, input_len: float, output_len: float,
                          context_tokens: float | None = None) -> float:
    """One running sequence's mean KV bytes on `stage`: its cache's bytes per running token
    (StageMemory.running_tokens) times kv_tokens_per_running_sequence; 0 for a stage with no cache."""
    if stage.running_tokens <= 0:
        return 0.0
    return stage.kv_cache_bytes / stage.running_tokens * kv_tokens_per_running_sequence(
        input_len, output_len, context_tokens)


def kv_limited_sequences(kv_cache_tokens: float, input_len: float, output_len: float,
                         context_tokens: float | None = None) -> int:
    """How many sequences the KV cache runs at once in the steady state: the cache over each
    one's mean footprint (kv_tokens_per_running_sequence), rounded down. Near this count the
    footprints' spread preempts now and then; the recomputation is not priced."""
    return int(kv_cache_tokens // kv_tokens_per_running_sequence(input_len, output_len, context_tokens))


def kv_tokens_with_state(kv_bytes: float, kv_bytes_per_token: int, state_bytes_per_sequence: int,
                         sequence_tokens: float) -> int:
    """KV cache tokens of a stage whose sequences each also hold a recurrent state, for
    sequences of S tokens each on average (kv_tokens_per_running_sequence): n = kv_bytes /
    (S * kv + state) sequences fit, and the cache's tokens are floor(n * S / B) * B, so
    kv_limited_sequences of them is the concurrency with every sequence's state reserved. vLLM draws Mamba / linear-attention state pages from the same
    pool as attention blocks (vllm/v1/kv_cache_interface.py MambaSpec, one state per request;
    v0.33.0); the page-size alignment of the two kinds is not modelled."""
    sequences = kv_bytes / (sequence_tokens * kv_bytes_per_token + state_bytes_per_sequence)
    block = eff.KV_BLOCK_SIZE_TOKENS
    return int(sequences * sequence_tokens // block) * block


def max_in_flight_tokens(layout: Layout, max_num_batched_tokens: int) -> int:
    """Tokens scheduled but not yet freed: (p + 1) batches of T (VllmConfig.max_in_flight_tokens
    and max_concurrent_batches at vLLM 0.33.0: async scheduling and Model Runner V2 are the
    defaults, p + 1 concurrent batches). A window layer keeps their blocks beyond the window."""
    return (layout.pp + 1) * max_num_batched_tokens


def kv_cache_groups(num_full_layers: int, num_window_layers: int) -> tuple[int, int, int]:
    """(layers per group, full groups, window groups) as vLLM 0.33.0 groups one stage's
    layers (kv_cache_planning.py _get_kv_cache_groups_uniform_page_size): one group when all
    layers are of one type; else groups of g = the smaller count (the larger when it is under
    1.5x the smaller), each type padded to whole groups. A block holds one page per layer of
    a group, and every group draws its blocks from one shared pool."""
    if num_full_layers == 0 or num_window_layers == 0:
        return num_full_layers + num_window_layers, int(num_full_layers > 0), int(num_window_layers > 0)
    low, high = sorted((num_full_layers, num_window_layers))
    size = high if high < 1.5 * low else low
    return size, math.ceil(num_full_layers / size), math.ceil(num_window_layers / size)


def kv_page_bytes(full_bytes_per_token: int, window_bytes_per_token: int) -> int:
    """One layer's page of a block, B * max(full, window) bytes per token: vLLM 0.33.0 pads the
    kind with the smaller page to the larger one's (unify_kv_cache_spec_page_size)."""
    return eff.KV_BLOCK_SIZE_TOKENS * max(full_bytes_per_token, window_bytes_per_token)


def kv_block_tokens(kind_bytes_per_token: int, full_bytes_per_token: int, window_bytes_per_token: int) -> int:
    """B_kind: the tokens one page of that kind holds, page / its bytes per token (Gemma 4's
    full layers, half a window layer's bytes per token, get 32-token blocks)."""
    return kv_page_bytes(full_bytes_per_token, window_bytes_per_token) // kind_bytes_per_token


class KvPool(NamedTuple):
    """A stage's hybrid KV pool (kv_hybrid_pool): its blocks, its full and window groups of
    layers (kv_cache_groups), and the tokens one block holds for each kind (kv_block_tokens)."""

    blocks: int
    full_groups: int
    window_groups: int
    full_block_tokens: int
    window_block_tokens: int


def kv_hybrid_pool(num_layers: int, num_window_layers: int, kv_bytes: float, window_bytes_per_token: int,
                   full_bytes_per_token: int | None = None) -> KvPool:
    """The pool of a stage with sliding-window layers: kv_bytes // (g * page) blocks (kv_page_bytes;
    get_kv_cache_config_from_groups at vLLM 0.33.0); full_bytes_per_token None: as a window layer's."""
    full = full_bytes_per_token or window_bytes_per_token
    size, full_groups, window_groups = kv_cache_groups(num_layers - num_window_layers, num_window_layers)
    return KvPool(int(kv_bytes // (size * kv_page_bytes(full, window_bytes_per_token))), full_groups, window_groups,
                  kv_block_tokens(full, full, window_bytes_per_token),
                  kv_block_tokens(window_bytes_per_token, full, window_bytes_per_token))


def kv_running_capacity(model: ModelSpec, num_layers: int, num_window_layers: int, kv_bytes: float,
                        kv_bytes_per_token_per_layer: int, sequence_tokens: float, in_flight_tokens: int = 0,
                        full_kv_bytes_per_token_per_layer: int | None = None) -> int:
    """Tokens a stage's hybrid KV pool holds as running sequences of S tokens on average
    (kv_tokens_per_running_sequence, its last block's half included), n * S with
    n = (blocks - window groups * ceil(in-flight / B_window))
        / (full groups * S / B_full + window groups * min(S, W - 1 + B_window) / B_window):
    the scheduler admits a request while the pool has free blocks for its next tokens
    (KVCacheManager.allocate_slots) and SlidingWindowManager.remove_skipped_blocks frees a window
    layer's blocks that fall wholly before the window, so a sequence keeps the blocks covering
    its last W tokens there, (W - 1) / B + 1 on average (vllm/v1/core/single_type_kv_cache_manager.py
    at 0.33.0); a scheduled prompt chunk's window blocks are all allocated with it and freed at the
    next allocation, so the pool keeps room for the tokens in flight (max_in_flight_tokens, as the
    admission count does per request). Blocks, groups and B_kind as in kv_cache_capacity, the
    admission count at max_model_len, which for a window far below max_model_len counts each
    request's window layers as if spread over M tokens and so is no measure of how many short
    sequences run."""
    pool = kv_hybrid_pool(num_layers, num_window_layers, kv_bytes, kv_bytes_per_token_per_layer,
                          full_kv_bytes_per_token_per_layer)
    window_block = pool.window_block_tokens
    free_blocks = max(pool.blocks - pool.window_groups * math.ceil(in_flight_tokens / window_block), 0)
    blocks_per_sequence = (pool.full_groups * sequence_tokens / pool.full_block_tokens
                           + pool.window_groups * min(sequence_tokens, model.kv_window_tokens - 1 + window_block)
                           / window_block)
    return int(free_blocks / blocks_per_sequence * sequence_tokens)


def kv_cache_capacity(model: ModelSpec, num_layers: int, num_window_layers: int, kv_bytes: float,
                      kv_bytes_per_token_per_layer: int, max_model_len: int, in_flight_tokens: int,
                      full_kv_bytes_per_token_per_layer: int | None = None) -> int:
    """KV cache tokens vLLM 0.33.0 reports for a stage with sliding-window layers
    (kv_cache_utils.py get_kv_cache_capacity: int(max concurrency * M)):
    page          = B * max(window, full bytes per token and layer)
    blocks        = kv_bytes // (g * page)   (get_kv_cache_config_from_groups)
    per request   = full groups * ceil(M / B_full)
                    + window groups * (ceil(min(W - 1 + in-flight, M) / B_window) + 1)
                    (FullAttentionSpec / SlidingWindowSpec.max_memory_usage_bytes)
    concurrency   = blocks / per request   (get_max_concurrency_for_kv_cache_config).
    B_kind = page / that kind's bytes per token: unify_kv_cache_spec_page_size grows the block
    of the layers with the smaller page until the pages match (Gemma 4's full layers, half a
    window layer's bytes per token, get 32-token blocks); B for both when the kinds are alike.
    It is the admission bound: at run time SlidingWindowManager.remove_skipped_blocks frees a
    window layer's blocks before the window, so a running sequence of n tokens holds only
    min(n, W - 1 + B) of them (more sequences than this may run). With p > 1 the stage's own
    layer counts are grouped (vLLM groups the model's layers and projects them per stage)."""
    pool = kv_hybrid_pool(num_layers, num_window_layers, kv_bytes, kv_bytes_per_token_per_layer,
                          full_kv_bytes_per_token_per_layer)
    window_tokens = min(model.kv_window_tokens - 1 + in_flight_tokens, max_model_len)
    blocks_per_request = (pool.full_groups * math.ceil(max_model_len / pool.full_block_tokens)
                          + pool.window_groups * (math.ceil(window_tokens / pool.window_block_tokens) + 1))
    return int(pool.blocks / blocks_per_request * max_model_len)


def structural_reasons(model: ModelSpec, layout: Layout) -> list[str]:
    """The checks vLLM enforces before it loads anything (vllm/config, ModelConfig.verify_with_parallel_config),
    and the quantized weights' shard shapes its kernels check as they create them (tp_scale_group_reasons)."""
    reasons = tp_head_reasons(model, layout.tp) + tp_scale_group_reasons(model, layout.tp, layout.ep)
    if (not model.is_moe or model.num_dense_layers) and model.intermediate_size % layout.tp:
        # a dense MLP's column-parallel up projection: MergedColumnParallelLinear divides each output
        # by tp and asserts it whole (divide, vllm/distributed/utils.py at 0.33.0); routed experts
        # floor it (FusedMoEConfig) and are not checked here
        reasons.append(f"MLP width {model.intermediate_size} not divisible by tp={layout.tp}")
    if layout.pp > model.num_hidden_layers:
        reasons.append(f"pp={layout.pp} exceeds the {model.num_hidden_layers} layers")
    return reasons


def vllm_batch_defaults(cluster: ClusterSpec, release: VllmRelease) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` of this release picks for this
    GPU: EngineArgs.get_batch_defaults, the OpenAI server's values (planner/engines.py has the
    tiers per release; an A100 loses throughput with the larger budget, vLLM PR #17885).
    --max-num-seqs is the concurrency ceiling when --batch is not given."""
    tier = vllm_batch_tier(release, bytes_to_gib(cluster.gpu.memory_bytes), cluster.gpu.name)
    return tier.max_num_batched_tokens, tier.max_num_seqs


def default_max_num_batched_tokens(cluster: ClusterSpec, release: VllmRelease) -> int:
    return vllm_batch_defaults(cluster, release)[0]


def default_max_num_seqs(cluster: ClusterSpec, release: VllmRelease) -> int:
    return vllm_batch_defaults(cluster, release)[1]


def batched_dp_moe(layout: Layout, backend: str) -> bool:
    """vLLM's ParallelConfig.use_batched_dp_moe (vllm/config/parallel.py at 0.33.0): the
    low-latency DeepEP backend with expert parallelism over DP ranks (each EP group is a
    deployment whose data_parallel_size is its d = ep / tp)."""
    return backend == "deepep_low_latency" and layout.ep > 1 and layout.dp_per_ep_group > 1


def max_num_batched_tokens(cluster: ClusterSpec, request: ServeRequest, layout: Layout | None = None,
                           model: ModelSpec | None = None) -> int:
    """The token budget per step the plan assumes: --max-num-batched-tokens, else vLLM's
    default: the release's for the GPU, or under batched DP MoE (batched_dp_moe: DeepEP's
    low-latency kernels dispatch at most this many tokens per rank and size their buffers for
    it) SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP, 256
    (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args, vllm/engine/arg_utils.py).
    The V0 engine's default depends on the model (`model`, required there): 2,048 with chunked
    prefill, else the max model length (v0_budget)."""
    if request.max_num_batched_tokens:
        return request.max_num_batched_tokens
    if layout is not None and batched_dp_moe(layout, request.all2all_backend):
        return BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS
    if not request.engine_versions.vllm_release.v1_engine:
        assert model is not None, "the V0 engine's budget depends on the model"
        return v0_budget(model, request)
    return default_max_num_batched_tokens(cluster, request.engine_versions.vllm_release)


def max_model_len_of(model: ModelSpec, request: ServeRequest) -> int:
    """--max-model-len, else the model's own max_position_embeddings (vLLM's default)."""
    return request.max_model_len or model.max_position_embeddings


def v0_chunked_prefill(model: ModelSpec, request: ServeRequest) -> bool:
    """Whether a V0 server (0.6.6.post1) chunks prompts: with --max-num-batched-tokens below the
    max model length (the planner then emits --enable-chunked-prefill, which V0 needs to accept
    that budget: SchedulerConfig._verify_args), else by its own default
    (engines.v0_chunked_prefill_by_default: a max model length above 32K, no sliding window, no
    speculative decoding)."""
    max_model_len = max_model_len_of(model, request)
    if request.max_num_batched_tokens:
        return request.max_num_batched_tokens < max_model_len
    return v0_chunked_prefill_by_default(max_model_len, model.sliding_window is not None,
                                         request.speculation is not None)


def v0_budget(model: ModelSpec, request: ServeRequest) -> int:
    """V0's default budget for this model and request (engines.v0_max_num_batched_tokens)."""
    return v0_max_num_batched_tokens(max_model_len_of(model, request), v0_chunked_prefill(model, request))


def activation_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """One token through one layer of the profile forward: bytes * (4h residual/norm/attention
    buffers + (a*d + k*(d + d_v))/t QKV + 3f'/t MLP up/act), f' = f * experts_per_token for MoE; with two
    attention shapes (Gemma 4) the wider QKV of the two kinds (vLLM's QKV output keeps a V
    slot on attention_k_eq_v layers too)."""
    h = model.hidden_size
    qkv = max(model.num_attention_heads * d + k * (d + d_v) for k, d, d_v, _ in
              (attention_shape(model, True), attention_shape(model, False))) / tp
    ffn = model.expert_intermediate_size * (model.num_experts_per_tok or 1)
    per_token = 4 * h + qkv + (3 if model.gated_mlp else 2) * ffn / tp
    return activation_bytes_per_element(model) * per_token


def sampler_warmup_bytes(model: ModelSpec, tp: int, num_tokens: int, max_num_seqs: int) -> float:
    """GPUModelRunner.profile_run keeps the T x h hidden states while _dummy_sampler_run runs
    on S = max_num_seqs rows (vllm/v1/worker/gpu_model_runner.py, v0.33.0 and v0.22.0):
    T*h*b + S*V*(b*(1 + 1/t if t > 1) + 3*4): the model-dtype logits (and the V/t shard
    gathered into them under TP), then the fp32 logits, probabilities and noise alive together
    (SAMPLER_FP32_COPIES)."""
    b = activation_bytes_per_element(model)
    logits_bytes_per_element = b * (1 + (1 / tp if tp > 1 else 0)) + SAMPLER_FP32_COPIES * FP32_BYTES
    hidden = num_tokens * model.hidden_size * b
    return hidden + max_num_seqs * model.vocab_size * logits_bytes_per_element


@computed_once
def profile_activation_bytes(model: ModelSpec, tp: int, num_tokens: int, last_stage: bool, max_num_seqs: int) -> float:
    """Transient peak of vLLM's profile run (memory_profiling's peak, vllm/utils/mem_utils.py,
    v0.33.0): the larger of the forward of T tokens through one layer and, on the last stage
    (the only one that samples), the sampler warm-up."""
    forward = num_tokens * activation_bytes_per_token(model, tp)
    sampler = sampler_warmup_bytes(model, tp, num_tokens, max_num_seqs) if last_stage else 0.0
    return max(forward, sampler)


def nccl_buffer_bytes(group_size: int) -> int:
    if group_size <= 1:
        return 0
    return eff.NCCL_BUFFER_BYTES_TWO_GPUS if group_size == 2 else eff.NCCL_BUFFER_BYTES_LARGER


def pre_load_free_bytes(cuda_visible_bytes: int, layout: Layout) -> float:
    """What a GPU has free once the engine's CUDA context and its communicators (NCCL buffers of
    the TP, PP and EP groups) are up, before the weights load: the total SGLang's
    --mem-fraction-static multiplies (model_runner.init_torch_distributed's snapshot,
    total_gpu_memory in profile_max_num_token: rest = free after load - total * (1 - f)).
    H100 (79.1 GiB CUDA-visible) at tp 8: 79.1 GiB - 500 MiB - 688 MB = 77.97 GiB."""
    return (cuda_visible_bytes - eff.CUDA_CONTEXT_BYTES - nccl_buffer_bytes(layout.tp) - nccl_buffer_bytes(layout.pp)
            - nccl_buffer_bytes(layout.ep))


def overhead_bytes(layout: Layout, deepep_bytes: float = 0.0, cuda_graphs_before_kv: bool = True) -> float:
    """CUDA context + NCCL buffers of the TP, PP and EP communicators + CUDA graph pool
    (+ DeepEP's buffers, deepep_buffer_bytes, when the EP exchange runs on DeepEP). The graph
    pool only where the engine sets it aside before sizing the KV cache (V1:
    `cuda_graphs_before_kv`); V0 captures its graphs after, into the memory left over above
    the budget (VllmRelease.v1_engine)."""
    return (
        eff.CUDA_CONTEXT_BYTES
        + nccl_buffer_bytes(layout.tp)
        + nccl_buffer_bytes(layout.pp)
        + nccl_buffer_bytes(layout.ep)
        + (eff.CUDA_GRAPH_BYTES if cuda_graphs_before_kv else 0.0)
        + deepep_bytes
    )


def deepep_buffer_bytes(model: ModelSpec, layout: Layout, backend: str, gpus_per_node: int,
                        max_tokens_per_rank: int) -> float:
    """DeepEP's buffers on every GPU of an EP group spanning DP ranks, as vLLM allocates them
    (vllm/distributed/device_communicators/all2all.py at 0.33.0): an NVLink buffer of
    VLLM_DEEPEP_BUFFER_SIZE_MB (1 GiB) for either mode; the high-throughput mode an RDMA buffer
    of the same size when the group spans nodes (its ranks sit tp * pp GPUs apart, so it spans
    tp * pp * d of them); the low-latency mode DeepEP's own size hint for the step's token
    budget (moe.deepep_ll_buffer_bytes; max_num_batched_tokens, 256 by default there). 0 for
    vLLM's default backend and without such a group."""
    if backend == DEFAULT_ALL2ALL_BACKEND or layout.ep <= 1 or layout.dp_per_ep_group <= 1 or not model.is_moe:
        return 0.0
    if backend == "deepep_low_latency":
        return DEEPEP_NVL_BUFFER_BYTES + deepep_ll_buffer_bytes(model, max_tokens_per_rank)
    spans_nodes = layout.tp * layout.pp * layout.dp_per_ep_group > gpus_per_node
    return DEEPEP_NVL_BUFFER_BYTES * (2 if spans_nodes else 1)


def embedding_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """Vocab-parallel embedding (and learned positions) split over t, in the model dtype."""
    return param_counts(model).embedding * activation_bytes_per_element(model) / tp


def lm_head_bytes_per_gpu(model: ModelSpec, tp: int, pp: int) -> float:
    """The last stage's LM head (V*h/t, in its format: lm_head_bytes_per_weight) and final
    norm; a tied head is shared only when p = 1."""
    counts = param_counts(model)
    head = model.vocab_size * model.hidden_size if (pp > 1 or not model.tie_word_embeddings) else 0
    return head / tp * lm_head_bytes_per_weight(model) + counts.final_norm * activation_bytes_per_element(model)


def stage_memory(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
                 max_num_seqs: int) -> list[StageMemory]:
    budget = cluster.gpu.cuda_visible_memory_bytes * request.gpu_memory_utilization
    tokens = max_num_batched_tokens(cluster, request, layout, model)
    v1_engine = request.engine_versions.vllm_release.v1_engine
    per_layer = layer_weight_bytes_per_gpu(model, layout.tp, layout.ep)
    stages = []
    layer_counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    window_counts = stage_window_layer_counts(model, layer_counts)
    attention_counts = stage_share_of_layers(num_attention_layers(model), model.num_hidden_layers, layer_counts)
    recurrent_counts = stage_share_of_layers(model.num_recurrent_layers, model.num_hidden_layers, layer_counts)
    moe_counts = stage_moe_layer_counts(model, layer_counts)
    moe_excess = moe_layer_excess_bytes_per_gpu(model, layout.tp, layout.ep)
    sequence_tokens = kv_tokens_per_running_sequence(request.input_len, request.output_len,
                                                     request.decode_context_tokens)
    max_model_len = max_model_len_of(model, request)
    draft = (DraftMemory(0.0, 0) if request.speculation is None
             else draft_memory(model, request.speculation, layout.tp, layout.ep, request.kv_cache_dtype, layout.pp))
    embedding = embedding_bytes_per_gpu(model, layout.tp)
    head = lm_head_bytes_per_gpu(model, layout.tp, layout.pp)
    activations = {last: profile_activation_bytes(model, layout.tp, tokens, last, max_num_seqs) for last in (False, True)}
    overhead = overhead_bytes(layout, deepep_buffer_bytes(model, layout, request.all2all_backend,
                                                          cluster.gpus_per_node, tokens), v1_engine)
    full_kv, window_kv = kv_bytes_per_token_per_layer_by_kind(
        model, layout.tp, kv_cache_format(model, cluster.gpu, request.kv_cache_dtype))
    in_flight_tokens = max_in_flight_tokens(layout, tokens)
    def make_up_fields(num_layers: int, moe_count: float, attention: int, window: int, recurrent: int,
                       first: bool, last: bool) -> tuple:
        """StageMemory's fields after `stage` for a stage of this make-up."""
        # the mean block, plus what the stage's MoE layers above their mean share weigh beyond
        # dense ones (0 where the stage holds the mean share)
        weights = num_layers * per_layer + (moe_count - moe_layers_of(model, num_layers)) * moe_excess
        weights += embedding if first else 0
        weights += head if last else 0
        activation = activations[last]
        kv_per_token = (attention - window) * full_kv + window * window_kv
        state = recurrent_state_bytes_per_sequence(model, recurrent, layout.tp)
        drafter = draft if last else DraftMemory(0.0, 0)
        weights += drafter.weights_bytes
        kv_bytes = budget - weights - activation - overhead
        # every token holds the drafter's KV beside the target's: the target's share of the pool
        target_kv_bytes = kv_bytes * kv_per_token / (kv_per_token + drafter.kv_bytes_per_token) if kv_per_token else 0
        kv_tokens = 0
        running_tokens = None
        if kv_bytes > 0 and state > 0:
            kv_tokens = kv_tokens_with_state(kv_bytes, kv_per_token + drafter.kv_bytes_per_token, state,
                                             sequence_tokens)
        elif kv_bytes > 0 and kv_per_token > 0 and window and v1_engine:
            # V1's hybrid KV cache manager; V0 counts plain blocks of every layer (ModelConfig at
            # 0.6.6.post1 caches an interleaved-window model's window layers as full ones, and its
            # block manager recycles a whole-model window's blocks per sequence)
            kv_tokens = kv_cache_capacity(model, attention, window, target_kv_bytes, window_kv, max_model_len,
                                          in_flight_tokens, full_kv)
            running_tokens = kv_running_capacity(model, attention, window, target_kv_bytes, window_kv,
                                                 sequence_tokens, in_flight_tokens, full_kv)
        elif kv_bytes > 0 and kv_per_token > 0:
            blocks = int(kv_bytes // ((kv_per_token + drafter.kv_bytes_per_token) * eff.KV_BLOCK_SIZE_TOKENS))
            kv_tokens = blocks * eff.KV_BLOCK_SIZE_TOKENS
        return (num_layers, weights, activation, overhead, max(kv_bytes, 0.0), kv_per_token, kv_tokens, budget,
                window, model.kv_window_tokens if window else None, num_layers - attention, state,
                window_kv if full_kv != window_kv else None, request.kv_cache_dtype,
                drafter.weights_bytes, drafter.kv_bytes_per_token, moe_count, running_tokens)

    alike: dict[tuple, tuple] = {}  # stages of one make-up (with p stages most are alike) priced once
    for stage, num_layers in enumerate(layer_counts):
        make_up = (num_layers, moe_counts[stage], attention_counts[stage], window_counts[stage],
                   recurrent_counts[stage], stage == 0, stage == layout.pp - 1)
        fields = alike.get(make_up)
        if fields is None:
            fields = alike[make_up] = make_up_fields(*make_up)
        stages.append(StageMemory(stage, *fields))
    return stages


def memory_overshoot_bytes(stages: list[StageMemory], max_model_len: int) -> float:
    """How far the worst stage is from fitting: weights + activations + overhead over the
    usable budget, else the KV cache one max-length sequence still lacks (what the "closest
    misses" of a plan with nothing feasible are ordered by)."""
    short = max(s.weights_bytes + s.activation_bytes + s.overhead_bytes - s.budget_bytes for s in stages)
    if short >= 0:
        return max(short, 1.0)
    return max(max((max_model_len - s.max_sequence_tokens) * s.kv_bytes_per_token for s in stages), 1.0)


def memory_reasons(stages: list[StageMemory], max_model_len: int) -> list[str]:
    reasons = []
    # Name the heaviest stage, so "by X GiB" is the whole shortfall, not the first stage's.
    s = max(stages, key=lambda stage: stage.weights_bytes - stage.budget_bytes)
    if s.weights_bytes > s.budget_bytes:
        reasons.append(
            f"weights exceed memory on stage {s.stage} by "
            f"{(s.weights_bytes - s.budget_bytes) / BYTES_PER_GIB:.1f} GiB "
            f"({s.weights_bytes / BYTES_PER_GIB:.1f} GiB of weights vs {s.budget_bytes / BYTES_PER_GIB:.1f} GiB usable)"
        )
        return reasons
    for s in stages:
        short = s.weights_bytes + s.activation_bytes + s.overhead_bytes - s.budget_bytes
        if short >= 0:
            reasons.append(
                f"no room for the KV cache on stage {s.stage}: weights + activations + overhead "
                f"exceed usable memory by {short / BYTES_PER_GIB:.1f} GiB"
            )
            return reasons
    kv_tokens = min(s.max_sequence_tokens for s in stages)
    if kv_tokens < max_model_len:
        reasons.append(
            f"KV cache holds {kv_tokens:,} tokens, fewer than one max-length sequence "
            f"({max_model_len:,}); the longest that fits is --max-model-len {kv_tokens:,}"
        )
    return reasons
