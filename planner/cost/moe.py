"""Per-MoE-layer quantities shared by serving and training (pure; SI units).

Legend: E routed experts, e experts per token (top-k), h hidden size, t tensor-parallel
degree, ep expert-parallel degree, P_expert one routed expert's parameters.
Sources: docs/cost-model.md (Expert parallelism); DeepSeek-V3 technical report sec. 3.2;
Megatron-Core's alltoall token dispatcher (megatron/core/transformer/moe/token_dispatcher.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from planner.cost import comm, efficiency
from planner.cost.params import activation_bytes_per_element, expert_params, experts_per_gpu
from planner.engines import BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS
from planner.layout import GroupTopology, Layout
from planner.specs import ClusterSpec, ModelSpec
from planner.units import BYTES_PER_GIB


def moe_layers_of(model: ModelSpec, num_layers: float) -> float:
    """MoE layers among num_layers consecutive ones (the mean block's share)."""
    return num_layers * model.num_moe_layers / model.num_hidden_layers if model.is_moe else 0.0


def routed_expert_flops(model: ModelSpec, num_layers: float, num_tokens: float) -> float:
    """2 * e * P_expert * tokens over the MoE layers among num_layers: the routed experts'
    share of the stage's forward FLOPs (all of its GPUs together)."""
    if not model.is_moe:
        return 0.0
    per_token = 2 * model.num_experts_per_tok * expert_params(model)
    return moe_layers_of(model, num_layers) * per_token * num_tokens


def training_permutation_bytes(model: ModelSpec, num_tokens: float, tp: int, ep: int) -> float:
    """Forward HBM traffic of Megatron-Core's token permutation in one MoE layer, per GPU (the
    backward's gradients pass the same copies in reverse: as much again).

    The alltoall dispatcher (token_dispatcher.py core_v0.19.0): permutation 1 gathers each of
    the GPU's N tokens into e copies ordered by expert (read N*h, write N*e*h); with EP and more
    than one local expert, permutation 2 sorts the received copies by local expert
    (sort_chunks_by_idxs: read and write N*e*h, the all-to-all delivering e*N copies on
    average), and the combine sorts them back (as much again); the unpermutation reads the
    e*N expert outputs and writes the N weighted sums. N = s*b/t with EP (the
    sequence-parallel tokens), s*b without (the allgather dispatcher gathers the TP group's
    tokens). Bytes: b_a*h*N*(2 + 2e + 4e [EP, > 1 local expert]), b_a the activation bytes.
    Qwen3-235B-A22B (h 4,096, e 8), 4,096 tokens, ep 8 (16 experts each), bf16:
    2 * 4,096 * 4,096 * (2 + 16 + 32) = 1,677,721,600 B."""
    if not model.is_moe:
        return 0.0
    k, h = model.num_experts_per_tok, model.hidden_size
    tokens = num_tokens / tp if ep > 1 else num_tokens
    sorts = 4 * k if ep > 1 and experts_per_gpu(model, ep) > 1 else 0
    return activation_bytes_per_element(model) * h * tokens * (2 + 2 * k + sorts)


def expert_load_factor(layout: Layout, imbalance: float, model: ModelSpec | None = None) -> float:
    """The busiest GPU's routed work over the mean: `imbalance` when whole experts sit on
    GPUs (EP: some experts are more popular than others), 1 when every expert is TP-split
    over the group (each GPU does 1/t of every expert). At most what one GPU can get: every
    token routes at most min(k, E/ep) of its k choices to the E/ep experts one GPU holds, against
    the mean k/ep, so min(ep, E/k) (max_expert_load_factor; --expert-imbalance 20 at ep 8 had
    priced a GPU 20 times the mean: a CLI read)."""
    return busiest_gpu_load_factor(layout.ep, imbalance, model)


def busiest_gpu_load_factor(ep: int, imbalance: float, model: ModelSpec | None = None) -> float:
    """expert_load_factor at an EP degree: 1 without EP, else `imbalance` capped at
    max_expert_load_factor."""
    return 1.0 if ep <= 1 else min(imbalance, max_expert_load_factor(ep, model))


def max_expert_load_factor(ep: int, model: ModelSpec | None = None) -> float:
    """min(ep, E/k): the busiest of ep GPUs taking all it can (expert_load_factor); ep alone
    where the model is not given."""
    if model is None or not model.is_moe:
        return float(ep)
    return min(float(ep), most_expert_load_factor(model))


def most_expert_load_factor(model: ModelSpec) -> float:
    """E/k: the most any GPU's routed load can exceed the mean by, at any EP degree (each token
    picks k of E experts; a GPU holding them all gets each token's k against the mean k/ep)."""
    return model.num_local_experts / model.num_experts_per_tok


def ep_alltoall_message_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """S, what one GPU sends in one dispatch (and gets back in one combine): its share of the
    step's tokens (1/t of its replica's), each to e experts, h values each in the activation
    dtype: tokens / t * e * h * bytes."""
    return num_tokens / layout.tp * model.num_experts_per_tok * model.hidden_size * activation_bytes_per_element(model)


def sequence_parallel_moe(layout: Layout) -> bool:
    """vLLM's use_sequence_parallel_moe (vllm/config/parallel.py at 0.33.0, default
    all2all_backend): EP over the TP ranks of several DP ranks (t > 1 and d > 1). Each TP
    rank then takes 1/t of its replica's tokens into the MoE layer (sequence_parallel_chunk)
    and the layer's output is all-gathered over TP instead of all-reduced."""
    return layout.ep > 1 and layout.tp > 1 and layout.dp_per_ep_group > 1


def ep_dispatch_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """S of vLLM's dispatch (AgRsAll2AllManager.dispatch_router_logits,
    vllm/distributed/device_communicators/all2all.py at 0.33.0): the all-gathered buffer over
    the EP group, every token's hidden state and its E router logits:
    ep * N/t * (h + E) * bytes (_ep_group_buffer_bytes)."""
    return _ep_group_buffer_bytes(model, layout, num_tokens, model.hidden_size + model.num_local_experts)


def ep_combine_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """S of vLLM's combine (AgRsAll2AllManager.combine): the reduce-scattered buffer, the
    partial outputs, h values per token: ep * N/t * h * bytes (_ep_group_buffer_bytes)."""
    return _ep_group_buffer_bytes(model, layout, num_tokens, model.hidden_size)


def _ep_group_buffer_bytes(model: ModelSpec, layout: Layout, num_tokens: float, values_per_token: int) -> float:
    """A buffer of `values_per_token` activation-dtype values for each of the EP group's
    ep * N/t tokens (ep ranks, N/t each; t = 1: a rank's own N). 0 when the EP group is one
    replica's TP group (d = 1): its tokens are already on every rank, and the MLP's TP
    all-reduce sums the experts' outputs."""
    if layout.ep <= 1 or layout.dp_per_ep_group <= 1 or not model.is_moe:
        return 0.0
    return layout.ep * num_tokens / layout.tp * values_per_token * activation_bytes_per_element(model)


DEEPEP_NVL_BUFFER_BYTES = BYTES_PER_GIB
"""DeepEP's NVLink buffer per GPU in either mode: VLLM_DEEPEP_BUFFER_SIZE_MB, 1024 by default
(vllm/envs.py; DeepEPHTAll2AllManager and DeepEPLLAll2AllManager._make_all2all_kwargs in
vllm/distributed/device_communicators/all2all.py at 0.33.0; the high-throughput mode's RDMA
buffer, across nodes, is as large)."""
DEEPEP_MESSAGE_HEADER_BYTES = 16
"""The int4 control word before every low-latency dispatch message (DeepEP
csrc/legacy/config.hpp LowLatencyLayout, commit dd758ca)."""
DEEPEP_SCALE_BLOCK = 128
"""fp8 dispatch carries one fp32 scale per 128 channels (DeepEP LowLatencyLayout num_scales)."""


def deepep_fp8_dispatch(model: ModelSpec) -> bool:
    """vLLM dispatches fp8 through DeepEP when the experts are 128-block fp8
    (all2all_utils.maybe_make_prepare_finalize: use_fp8_dispatch for DEEPEP_QUANT_BLOCK_SHAPE),
    which is how fp8 MoE checkpoints come (DeepSeek-V3, Qwen3 FP8: 128 x 128 blocks); else the
    activations go in their 16-bit dtype."""
    return model.quantization == "fp8"


def deepep_dispatch_message_bytes(model: ModelSpec) -> float:
    """One token's dispatch message to one destination: fp8 values and their per-128 fp32
    scales, or 16-bit values, plus the control word (DeepEP LowLatencyLayout's message)."""
    h = model.hidden_size
    values = h + 4 * h / DEEPEP_SCALE_BLOCK if deepep_fp8_dispatch(model) else h * activation_bytes_per_element(model)
    return DEEPEP_MESSAGE_HEADER_BYTES + values


def deepep_combine_message_bytes(model: ModelSpec) -> float:
    """One token's combine message from one expert rank: its partial output in bf16."""
    return model.hidden_size * activation_bytes_per_element(model)


def expected_parts_hit(model: ModelSpec, parts: int) -> float:
    """Of `parts` equal shares of the E experts (EP ranks, or nodes), how many a token's e
    experts fall in, routed uniformly: parts * (1 - C(E - E/parts, e) / C(E, e)) (the chance a
    share holds none of the e is the ratio of the binomials).

    Group-limited routing (ModelSpec.num_expert_groups N_g, expert_groups_per_token G; DeepSeek-V3
    report sec. 3.2.2): a token picks G of the N_g groups of S = E/N_g consecutive experts, then
    its e experts uniformly among those G*S; each share's chance is _share_hit's. A share inside
    one group (E/parts <= S) is hit with chance G/N_g * (1 - C(G*S - E/parts, e)/C(G*S, e)); a
    share of j whole groups with sum_i H(i) (1 - C(G*S - i*S, e)/C(G*S, e)), H(i) the
    hypergeometric chance that i of its j groups are among the G picked. Shares that line up with
    the groups all have the same chance. DeepSeek-V3 (E 256, e 8, 8 groups of 32, G 4) over 8
    nodes: each node one group, 8 * 1/2 * (1 - C(96, 8)/C(128, 8)) = 3.64 nodes per token (5.30
    routed uniformly)."""
    experts, k = model.num_local_experts, model.num_experts_per_tok
    local = experts / parts
    groups = model.num_expert_groups
    if not groups:
        return parts * (1 - _miss_chance(experts, local, k))
    size, picked = experts / groups, model.expert_groups_per_token
    if size % local == 0 if local <= size else local % size == 0:  # every share alike
        return parts * _share_hit(0.0, local, size, groups, picked, k)
    return sum(_share_hit(j * local, (j + 1) * local, size, groups, picked, k) for j in range(parts))


def _share_hit(low: float, high: float, size: float, groups: int, picked: int, k: int) -> float:
    """The chance a token's experts hit the share [low, high) of the experts under group-limited
    routing (expected_parts_hit), groups of `size`: the m groups the share overlaps are whole ones
    and at most two partial ones at its edges; the chance that exactly a given t of them are among
    the `picked` is C(groups - m, picked - t)/C(groups, picked), and then the share holds the
    overlaps of those t."""
    overlaps = []
    for group in range(int(low // size), math.ceil(high / size)):
        overlap = min(high, (group + 1) * size) - max(low, group * size)
        if overlap > 0:
            overlaps.append(overlap)
    whole = sum(1 for overlap in overlaps if overlap == size)
    partial = [overlap for overlap in overlaps if overlap != size]
    pool, touched, total = picked * size, len(overlaps), math.comb(groups, picked)
    miss = 0.0
    for i in range(whole + 1):
        for mask in range(1 << len(partial)):
            chosen = [overlap for bit, overlap in enumerate(partial) if mask >> bit & 1]
            t = i + len(chosen)
            if t > picked or picked - t > groups - touched:
                continue
            chance = math.comb(whole, i) * math.comb(groups - touched, picked - t) / total
            miss += chance * _miss_chance(pool, i * size + sum(chosen), k)
    return 1 - miss


def _miss_chance(pool: float, covered: float, k: int) -> float:
    """C(pool - covered, k) / C(pool, k) = prod_i (pool - covered - i) / (pool - i): the chance
    that none of k distinct picks among `pool` falls in `covered` of them."""
    miss = 1.0
    for i in range(k):
        miss *= max(0.0, pool - covered - i) / (pool - i)
    return miss


def deepep_traffic(model: ModelSpec, layout: Layout, tokens_per_rank: float, backend: str, phase: str,
                   ranks_per_node: int, num_nodes: int, message_bytes: float | None = None) -> tuple[float, float]:
    """(NVLink bytes, RDMA bytes) one GPU sends in one DeepEP dispatch or combine of its
    tokens over an EP group of n = ep ranks, g per node on num_nodes nodes:
    low latency   a message per (token, expert) pair, each to its expert's rank: of the N*e
                  messages (g-1)/n go to the node's other GPUs, (n-g)/n leave the node;
    high throughput  a message per (token, rank): the token leaves the node once for each other
                  node holding one of its experts (DeepEP's internode kernels send it to one GPU
                  there, which forwards it over NVLink), N * (nodes hit - P(own node hit));
                  inside the node one per other rank hit, N * ranks hit * (g-1)/n.
    Messages: `message_bytes`, else vLLM's deepep_dispatch_message_bytes /
    deepep_combine_message_bytes. Uniform routing (expected_parts_hit); DeepEP csrc/legacy
    (internode_ll.cu, internode.cu), commit dd758ca."""
    n, g = layout.ep, ranks_per_node
    message = message_bytes if message_bytes is not None else (
        deepep_dispatch_message_bytes(model) if phase == "dispatch" else deepep_combine_message_bytes(model))
    if backend == "deepep_low_latency":
        sent = tokens_per_rank * model.num_experts_per_tok * message
        return sent * (g - 1) / n, sent * (n - g) / n
    ranks = expected_parts_hit(model, n)
    nodes_hit = expected_parts_hit(model, num_nodes) if num_nodes > 1 else 1.0
    own_node = nodes_hit / num_nodes  # the chance the token's own node holds one of its experts
    return (tokens_per_rank * ranks * message * (g - 1) / n,
            tokens_per_rank * (nodes_hit - own_node) * message)


def deepep_transfers(model: ModelSpec, layout: Layout, group: GroupTopology, tokens_per_rank: float, backend: str,
                     message_bytes: Callable[[str], float] | None = None) -> tuple[tuple[float, float, float], ...]:
    """(NVLink bytes, RDMA bytes, seconds) of DeepEP's dispatch, then its combine, of one GPU's
    tokens over the EP group: deepep_traffic priced by comm.deepep_seconds with DeepEP's measured
    fixed cost for `backend` over the group's nodes (efficiency.deepep_fixed_seconds).
    `message_bytes(phase)`: each message's bytes, else vLLM's (deepep_traffic). Serving's
    exchange (serving_time.ep_exchange_ops) and training's flex dispatcher
    (training_time.deepep_alltoall_seconds) both price DeepEP here."""
    fixed = efficiency.deepep_fixed_seconds(backend, group.num_nodes)
    transfers = []
    for phase in ("dispatch", "combine"):
        nvlink, rdma = deepep_traffic(model, layout, tokens_per_rank, backend, phase, group.ranks_per_node,
                                      group.num_nodes, None if message_bytes is None else message_bytes(phase))
        transfers.append((nvlink, rdma, comm.deepep_seconds(nvlink, rdma, group, fixed)))
    return tuple(transfers)


def deepep_ll_buffer_bytes(model: ModelSpec, max_tokens_per_rank: int = BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS) -> int:
    """DeepEP's low-latency RDMA buffer as vLLM sizes it (get_low_latency_rdma_size_hint with
    the step's token budget N, BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS by default): two send and two receive buffers of the larger message
    for the dispatch (N messages sent, E * N received) and the combine (E * N each way),
    and two signalling words per expert, rounded up to 128 B (DeepEP csrc/legacy/config.hpp
    LowLatencyLayout, commit dd758ca)."""
    h, experts, n = model.hidden_size, model.num_local_experts, max_tokens_per_rank
    scales = h // DEEPEP_SCALE_BLOCK
    dispatch_message = DEEPEP_MESSAGE_HEADER_BYTES + max(2 * h, h + 4 * scales)
    combine_message = 4 * scales + 2 * h
    send = max(n * dispatch_message, experts * n * combine_message)
    receive = experts * n * max(dispatch_message, combine_message)
    signalling = -(-experts * 4 // 128) * 128
    total = 2 * send + 2 * receive + 2 * signalling
    return (total + 128) // 128 * 128


# Megatron-Core's flex token dispatcher on DeepEP (training): megatron/core/transformer/moe/
# token_dispatcher.py (MoEFlexTokenDispatcher, _DeepepManager) and fused_a2a.py (get_buffer),
# core_v0.14.0 and core_v0.19.0; DeepEP's normal (high-throughput) kernels, commit dd758ca.

DEEPEP_SM90 = 9.0
"""The compute capability of DeepEP's full build (Hopper, or SM90 PTX): below it only the
intranode normal kernels (deepep_ampere_refusal)."""
DEEPEP_AMPERE_BUILD = ("its pre-Hopper build, DISABLE_SM90_FEATURES in setup.py at v1.2.1, leaves out NVSHMEM and "
                       "with it the internode and low-latency kernels; the current line builds for SM90 only")
"""Why DeepEP on an Ampere GPU runs its intranode normal kernels only (deepseek-ai/DeepEP setup.py:
v1.2.1 asserts disable_nvshmem under DISABLE_SM90_FEATURES; at dd758ca that build is "Not
implemented" and the README lists Hopper only)."""


def deepep_ampere_refusal(cluster: ClusterSpec, backend: str, ep_spans_nodes: bool) -> str | None:
    """Why DeepEP cannot run this exchange on the cluster's GPU, in words (None: it can): below
    compute capability 9.0 (Ampere) only inside one node and only its normal (high-throughput)
    kernels (DEEPEP_AMPERE_BUILD). `backend`: deepep_low_latency, or any other name for the normal
    kernels (Megatron's flex dispatcher, vLLM's deepep_high_throughput)."""
    gpu = cluster.gpu
    if gpu.compute_capability is None or gpu.compute_capability >= DEEPEP_SM90:
        return None
    if backend == "deepep_low_latency":
        return f"DeepEP's low-latency kernels need SM90 features, which {gpu.name} lacks ({DEEPEP_AMPERE_BUILD})"
    if ep_spans_nodes:
        return (f"DeepEP on {gpu.name} runs inside one node only ({DEEPEP_AMPERE_BUILD}); this EP group spans "
                f"nodes")
    return None


def deepep_serving_refusal(cluster: ClusterSpec, backend: str | None = None) -> str | None:
    """Why vLLM cannot exchange tokens over DeepEP on this cluster (None: it can): DeepEP's
    kernels are CUDA kernels for NVIDIA GPUs of compute capability 8.0 and up (deepseek-ai/DeepEP
    README at v1.2.1: Ampere and later; vLLM's dual-batch overlap runs on CUDA only, vllm/config/vllm.py at
    0.33.0), moving tokens inside a node over NVLink (its intranode buffers are NVLink peer
    memory); `backend` deepep_low_latency: SM90 (deepep_ampere_refusal). Training's Megatron flex
    dispatcher has its own, narrower list (train.deepep_cluster_refusal)."""
    gpu = cluster.gpu
    if gpu.compute_capability is None or gpu.compute_capability < 8.0:
        return f"DeepEP runs on NVIDIA GPUs of compute capability 8.0 and later, not {gpu.name}"
    if cluster.intra_node is None or cluster.intra_node.kind != "nvlink":
        kind = "no GPU-to-GPU link" if cluster.intra_node is None else cluster.intra_node.kind
        return f"DeepEP moves tokens inside a node over NVLink (this node has {kind})"
    if backend == "deepep_low_latency":
        return deepep_ampere_refusal(cluster, backend, False)
    return None


DEEPEP_NUM_SMS = 20
"""SMs DeepEP's normal kernels run on in Megatron: --moe-deepep-num-sms' default (core_v0.14.0;
core_v0.19.0 leaves moe_flex_dispatcher_num_sms None and DeepEP's Buffer.num_sms, 20, stands).
Two SMs per channel: 10 channels."""
DEEPEP_NVL_PEERS = 8
"""LEGACY_NUM_MAX_NVL_PEERS: DeepEP's internode kernels pair each GPU with exactly 8 NVLink
peers (csrc/kernels/legacy/compiled.cuh); a group of more than 8 ranks must be whole 8-GPU nodes."""
DEEPEP_RECV_TOKENS = {2: (256, 0), 4: (256, 0), 8: (256, 0), 16: (288, 140), 24: (288, 128), 32: (288, 128),
                      48: (288, 128), 64: (288, 128), 96: (480, 132), 128: (560, 132), 144: (720, 132),
                      160: (720, 132)}
"""EP group sizes DeepEP has configurations for (Buffer.get_dispatch_config / get_combine_config
in deep_ep/buffers/legacy.py; any other size asserts "Unsupported number of EP ranks"), each
with the larger of the two configurations' NVLink receive chunk (tokens) and RDMA receive chunk
(rounded up to a multiple of its send chunk by Config's constructor, csrc/legacy/config.hpp):
what sizes the buffers Megatron's get_buffer allocates."""
DEEPEP_MAX_TOPK = 128
"""kNumMaxTopK and kNumMaxScales of DeepEP's buffer size hints: every buffered token reserves
128 top-k indices (int64), 128 weights and 128 scales (fp32) whatever the model's top-k."""
DEEPEP_SOURCE_META_BYTES = 8
"""sizeof(internode::SourceMeta): two ints per buffered token (csrc/kernels/legacy/internode.cu)."""


def deepep_training_message_bytes(model: ModelSpec, phase: str) -> float:
    """One token's message in one of DeepEP's normal-mode transfers as Megatron sends it: the
    16-bit hidden state (fused_a2a.get_hidden_bytes: h * max(element size, 2); Megatron does not
    dispatch in fp8), plus on the dispatch the source metadata and the top-k indices and weights
    (int32 and fp32 each), rounded up to 16 bytes (internode.cu get_num_bytes_per_token).
    DeepSeek-V3 (h 7,168, e 8): dispatch 14,336 + 8 + 64 = 14,408 -> 14,416 B; combine 14,336 B."""
    hidden = 2 * model.hidden_size
    if phase != "dispatch":
        return float(hidden)
    raw = hidden + DEEPEP_SOURCE_META_BYTES + 8 * model.num_experts_per_tok
    return float(-(-raw // 16) * 16)


def deepep_training_refusal(ep: int, ranks_per_node: int, num_nodes: int = 1) -> str | None:
    """Why DeepEP cannot run an EP group of `ep` ranks, `ranks_per_node` of them on each of
    `num_nodes` nodes, in words (None: it can): DeepEP has configurations for
    DEEPEP_RECV_TOKENS' sizes only; a group of at most 8 ranks runs its intranode kernels only,
    inside one NVLink node (Buffer: RDMA ranks = ranks / 8, NVLink rank = rank % 8); a larger one
    must hold 8 GPUs of each node (DEEPEP_NVL_PEERS)."""
    if ep not in DEEPEP_RECV_TOKENS:
        return f"DeepEP has no configuration for {ep} EP ranks ({', '.join(map(str, DEEPEP_RECV_TOKENS))})"
    if ep <= DEEPEP_NVL_PEERS and num_nodes > 1:
        return f"DeepEP runs a group of 8 or fewer EP ranks inside one node (this one spans {num_nodes})"
    if ep > DEEPEP_NVL_PEERS and ranks_per_node != DEEPEP_NVL_PEERS:
        return f"DeepEP spans nodes only with 8 EP ranks on each node (this group has {ranks_per_node})"
    return None


def deepep_training_buffer_bytes(model: ModelSpec, ep: int) -> float:
    """DeepEP's NVLink and RDMA buffers on every GPU of the EP group, as Megatron's get_buffer sizes
    them (the larger of Config.get_nvl_buffer_size_hint and get_rdma_buffer_size_hint over the
    dispatch and combine configurations, csrc/legacy/config.hpp), C = DEEPEP_NUM_SMS / 2 channels,
    R_n = min(ep, 8) NVLink ranks, R_r = ep / 8 RDMA ranks (0 within a node), T_n and T_r the
    receive chunks (DEEPEP_RECV_TOKENS), H = 2h:
    NVLink  C R_n (2 max(R_r, 1) + 3) 4 + C R_n T_n (H + 8 + 128*8 + 128*4 + 128*4)
    RDMA    C R_r (8*2 + 2) 2*4 + C R_r T_r 2 (H + 8 + 128*8 + 128*4 + 128*4 + 16)
    each rounded up to 128 B. DeepSeek-V3 (h 7,168) at ep 32: NVLink 10*8*11*4 + 10*8*288*16,392
    = 377,675,200 -> 377,675,264 B, RDMA 10*4*18*8 + 10*4*128*2*16,408 = 168,023,680 B: 545,698,944 B."""
    if ep <= 1 or ep not in DEEPEP_RECV_TOKENS:
        return 0.0
    channels = DEEPEP_NUM_SMS // 2
    hidden = 2 * model.hidden_size
    nvl_ranks, rdma_ranks = min(ep, DEEPEP_NVL_PEERS), (ep // DEEPEP_NVL_PEERS if ep > DEEPEP_NVL_PEERS else 0)
    nvl_tokens, rdma_tokens = DEEPEP_RECV_TOKENS[ep]
    per_token = hidden + DEEPEP_SOURCE_META_BYTES + DEEPEP_MAX_TOPK * (8 + 4 + 4)
    nvl = (channels * nvl_ranks * (2 * max(rdma_ranks, 1) + 3) * 4
           + channels * nvl_ranks * nvl_tokens * per_token)
    rdma = (channels * rdma_ranks * (2 * DEEPEP_NVL_PEERS + 2) * 2 * 4
            + channels * rdma_ranks * rdma_tokens * 2 * (per_token + 16)) if rdma_ranks else 0
    return float(-(-nvl // 128) * 128 + -(-rdma // 128) * 128)
