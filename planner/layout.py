"""Layouts and where they land on the cluster.

TP is innermost in every engine: a TP group is tp consecutive ranks, node = r // gpus_per_node.
vLLM (serving) orders the rest DP x PP x TP: global rank r = (dp_index * pp + stage) * tp +
tp_rank, and a pipeline boundary joins rank r to rank r + tp. Megatron-Core orders its groups
tp-cp-ep-dp-pp (RankGenerator, parallel_state.py, core_v0.19.0) and torchtitan its device mesh
pp, dp_replicate, dp_shard, cp, tp, outermost first (distributed/parallel_dims.py), so in training r = ((stage * dp + dp_index) * cp + cp_rank)
* tp + tp_rank: a CP group is cp ranks at stride tp, a DP group dp*cp ranks at stride tp inside
a stage's tp*cp*dp block, and a pipeline boundary steps over that whole block
(`pp_outermost`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from planner import units
from planner.cost.efficiency import HOST_STAGED_BANDWIDTH_FRACTION, HOST_STAGED_STEP_LATENCY_SECONDS
from planner.specs import ClusterSpec


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    ep: int = 1
    """Expert parallelism (MoE only): each MoE layer's routed experts are spread over ep GPUs
    of one pipeline stage, one expert per GPU unsplit (expert TP 1), instead of TP-split
    inside each replica. ep = tp * d: the TP groups of d data-parallel ranks form one EP
    group, as vLLM's --enable-expert-parallel (EP = TP x DP) and Megatron's
    --expert-model-parallel-size with --expert-tensor-parallel-size 1 place it. With CP
    (training) d counts the CP ranks first: Megatron lays the experts over a stage's
    tp*cp*dp ranks (etp-ep-edp, parallel_state.py core_v0.19.0), so an EP group is ep
    consecutive ranks, the TP groups of its CP ranks, then of the next DP rank's. 1 = none."""
    cp: int = 1
    """Context parallelism (training only, never searched for serving): each sequence split
    over cp ranks at stride tp (Megatron's --context-parallel-size). 1 = none."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def dp_per_ep_group(self) -> int:
        """Data-parallel (with CP: context- and data-parallel) ranks whose TP groups share one
        EP group (1 without EP)."""
        return max(1, self.ep // self.tp)

    @property
    def num_ep_groups(self) -> int:
        """Independent EP groups per pipeline stage (dp * cp without EP)."""
        return self.dp * self.cp // self.dp_per_ep_group

    def __str__(self) -> str:
        text = f"tp={self.tp}" + (f" cp={self.cp}" if self.cp > 1 else "") + f" pp={self.pp} dp={self.dp}"
        return text if self.ep == 1 else f"{text} ep={self.ep}"


@dataclass(frozen=True)
class TrainConfig:
    """One point of the training search space (Megatron flags in brackets)."""

    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    schedule: str
    """gpipe | 1f1b | interleaved."""
    virtual_stages: int
    """Model chunks per device (1 unless interleaved)."""
    recompute: str
    """none | outputs (MoE and MLA models: Megatron's output-discarding checkpoints) | selective | full."""
    sequence_parallel: bool
    zero_stage: int
    """0 none, 1 distributed optimizer, 2 + gradients, 3 + weights (pure DP)."""
    first_last_layers: tuple[int, int] | None = None
    """Layers on the first and last stage [--decoder-first/last-pipeline-num-layers], the
    rest even over the middle stages; None = L/p on every stage. The training estimate
    fills it in when p does not divide L."""
    attention: str = "flash"
    """flash | materialized [--attention-backend auto | unfused]: not searched, the
    request's choice (docs/cost-model.md#training-attention)."""
    attention_kernel: str = "auto"
    """auto | fa2, with flash [--attention-backend auto | flash --flash-attention-version 2]:
    which kernel's rate the flash attention runs at; the request's choice, filled in by the
    training estimate."""
    precision: str = "bf16"
    """bf16 | fp8 [--fp8-format hybrid, Transformer Engine]: not searched, the request's
    choice; the training estimate fills it in from the request (docs/cost-model.md#training-fp8)."""
    fp8_recipe: str | None = None
    """delayed | tensorwise | mxfp8 | blockwise [--fp8-recipe] with fp8, None with bf16: the request's
    (TrainRequest.resolved_fp8_recipe), filled in by the training estimate."""

    ep: int = 1
    """Expert-parallel degree over the tp x dp ranks of a stage (Layout.ep)."""
    cp: int = 1
    """Context-parallel degree [--context-parallel-size]: each rank holds s/cp tokens of
    every sequence; tp*cp*pp*dp = GPUs (docs/cost-model.md#training-context-parallelism)."""
    grad_reduce: str = "fp32"
    """fp32 | bf16 [--grad-reduce-in-bf16]: the main gradients' dtype, in which they accumulate
    and reduce; the request's choice, filled in by the training estimate."""
    optimizer_states: str = "fp32"
    """fp32 | bf16 [--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16]:
    Adam's moments' dtype (needs the distributed optimizer, ZeRO >= 1); the request's choice,
    filled in by the training estimate (docs/cost-model.md#optimizer-states)."""
    tp_comm_overlap: bool = False
    """[--tp-comm-overlap] Transformer Engine's userbuffers pipeline each sequence-parallel
    all-gather and reduce-scatter with its GEMM; the training estimate fills it in (on where
    Megatron can run it: SP, TP inside one node) unless the request turns it off."""
    moe_comm_overlap: bool = False
    """[--overlap-moe-expert-parallel-comm] Megatron's combined 1F1B: one micro-batch's forward
    runs beside another's backward, layer by layer, so each one's expert-parallel all-to-alls
    hide under the other's compute; one more forward is in flight. The training estimate fills
    it in (on where Megatron can run it: EP, no full recompute, interleaving when pp > 1)
    unless the request turns it off (docs/cost-model.md#training-expert-parallelism-moe)."""
    account_for_embedding_and_loss: bool = False
    """[--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split] The
    embedding and the loss count as one layer each: L + 2 units even over the p*v chunks,
    v*u - 1 | v*u x (p-2) | v*u - 1 layers per stage with u = (L+2)/(p*v); first_last_layers
    stays None (Megatron refuses both together). The training estimate picks it where p does
    not divide L or v does not divide L/p (docs/cost-model.md#uneven-pipeline-stages)."""
    moe_dispatcher: str = "alltoall"
    """alltoall | deepep [--moe-token-dispatcher-type alltoall | flex on DeepEP] with EP: the
    training estimate fills it in from the request (train.moe_dispatcher_for; auto takes DeepEP
    where it can run and its transfers price lower) (docs/cost-model.md#deepep-in-training)."""
    engine: str = "megatron"
    """megatron | torchtitan: whose bookkeeping the memory is priced with (FSDP2's fp32 sharded
    parameters, torchao's fp8 casts that keep nothing between uses and save the 16-bit inputs:
    train.state_bytes_per_param, train.saved_activation_precision); the request's, filled in by
    the training estimate."""
    recompute_num_layers: int | None = None
    """With recompute full [--recompute-method block --recompute-num-layers k]: only the first k
    layers of each model chunk rerun their forward, the others keep every activation (no
    recompute); None: every layer [--recompute-method uniform --recompute-num-layers 1].
    Megatron only (docs/cost-model.md#training-partial-recompute)."""
    recompute_every: int | None = None
    """With recompute full under torchtitan [activation_checkpoint mode "selective",
    selective_ac_option "N"]: every N-th block of a rank is checkpointed whole, floor(n/N) of its n,
    the others keep every activation; None: every block [mode "full"]
    (docs/cost-model.md#training-partial-recompute)."""

    @property
    def layout(self) -> Layout:
        return Layout(self.tp, self.pp, self.dp, self.ep, self.cp)

    @property
    def recompute_label(self) -> str:
        """The recompute level in words: "full (block 5)" where only the first 5 layers of each
        chunk rerun (recompute_num_layers), "full (every 3)" where every third block does
        (recompute_every, torchtitan), else the level."""
        if self.recompute_every is not None:
            return f"{self.recompute} (every {self.recompute_every})"
        return self.recompute if self.recompute_num_layers is None else f"{self.recompute} (block {self.recompute_num_layers})"

    @property
    def priced_fp8_recipe(self) -> str:
        """The recipe the cost model prices: fp8_recipe, or for a configuration built without one
        (the estimate always fills it in) Megatron's default, delayed scaling."""
        return self.fp8_recipe or "delayed"

    @property
    def fp8_delayed(self) -> bool:
        """fp8 with delayed scaling (priced_fp8_recipe): Megatron's recompute "outputs" then leaves
        moe_act and layernorm out (activations.outputs_recompute_modules)."""
        return self.precision == "fp8" and self.priced_fp8_recipe == "delayed"

    def with_(self, **changes: object) -> TrainConfig:
        """dataclasses.replace without its per-call field introspection (the training search
        copies configurations tens of thousands of times); the fields are plain values."""
        copy = object.__new__(TrainConfig)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    @property
    def dp_cp(self) -> int:
        """Ranks that hold the same weights: Megatron's data-parallel group with CP
        (get_data_parallel_group(with_context_parallel=True)), over which gradients reduce and
        the distributed optimizer shards."""
        return self.dp * self.cp


@dataclass(frozen=True)
class Rejected:
    """Why a layout (or one configuration of it) cannot run: a value the search tallies,
    never an exception. The same type for serving and training."""

    layout: Layout
    reasons: tuple[str, ...]
    over_bytes: float = 0.0
    """How far the configuration is out of memory (0 when it fails for another reason)."""
    num_configs_rejected: int = 1
    """Configurations of this layout that were tried and failed (training searches several)."""
    sla_miss_ratio: float = 0.0
    """Serving, a layout that fits but misses an SLA: its worst value over the limit (1.04: 4%
    over; 0 when it fails for another reason), what orders the closest misses shown."""


@dataclass(frozen=True)
class Link:
    """One GPU's view of a link: its share of bandwidth (one direction) and per-step latency."""

    kind: str
    """nvlink | pcie | xgmi | infiniband | roce | ethernet."""
    scope: str
    """intra_node | inter_node."""
    bandwidth_bytes_per_s: float
    latency_seconds: float
    measured: bool = False
    """True when the figures come from `plan probe` (already what NCCL achieves)."""
    host_staged: bool = False
    """True when the GPUs have no peer-to-peer access, so each transfer goes through host memory."""
    p2p_bandwidth_bytes_per_s: float | None = None
    p2p_latency_seconds: float | None = None
    """A probe's own send/recv fit on this link (IntraNodeLink / InterNodeLink p2p figures);
    None: a send costs the link's figures (comm.p2p_seconds)."""

    @property
    def has_p2p_fit(self) -> bool:
        """The probe's send/recv fit prices a send on this link (both its figures given)."""
        return self.p2p_bandwidth_bytes_per_s is not None and self.p2p_latency_seconds is not None


@dataclass(frozen=True)
class GroupTopology:
    """How one communicating group of consecutive ranks sits on the nodes."""

    num_ranks: int
    ranks_per_node: int
    """g: the group's ranks inside one node (the smallest share when groups straddle)."""
    num_nodes: int
    """N: nodes the group spans."""
    intra: Link | None
    """Between the group's ranks inside a node; None when g == 1."""
    inter: Link | None
    """One GPU's share of its node's NICs; None when the group stays in one node."""


@dataclass(frozen=True)
class Placement:
    tp_link: Link | None
    """None when tp == 1 (no all-reduce); the network link when the TP group spans nodes."""
    pp_link: Link | None
    """The slowest link a pipeline boundary crosses; None when pp == 1."""
    tp_crosses_node: bool
    num_pp_boundaries_crossing_nodes: int
    tp_group: GroupTopology | None = None
    """Where the TP group's ranks sit (None when tp == 1)."""
    ep_group: GroupTopology | None = None
    """Where one EP group's ranks sit (None when ep == 1)."""
    cp_group: GroupTopology | None = None
    """Where one CP ring's ranks sit (None when cp == 1)."""
    cp_hop: Link | None = None
    """One hop of the CP ring inside a node (a send to one peer: intra_node_link's pair); None
    when cp == 1 or the ring's ranks are one a node."""

    @property
    def cp_link(self) -> Link | None:
        """The slowest hop of the CP ring: the NICs when the ring spans nodes, else a send to one
        peer in the node (on a mesh fabric one of its links, not the group's share)."""
        if self.cp_group is None:
            return None
        return self.cp_group.inter or self.cp_hop or self.cp_group.intra

    @property
    def ep_link(self) -> Link | None:
        """The slowest link an EP all-to-all crosses: the NICs when the group spans nodes."""
        if self.ep_group is None:
            return None
        return self.ep_group.inter or self.ep_group.intra


MESH_FABRICS = ("xgmi",)
"""Intra-node fabrics that are a full mesh of direct GPU-to-GPU links, no switch: AMD Infinity
Fabric on MI300X/MI325X platforms, each GPU with 7 links of 64 GB/s to the node's other 7 (AMD
Instinct MI300X data sheet; the catalog's bandwidth is the sum, 448 GB/s). NVLink nodes go
through NVSwitch and PCIe nodes through a switch: any group there gets the GPU's whole rate."""


def intra_node_link(cluster: ClusterSpec, ranks_in_node: int = 0) -> Link:
    """A GPU's link to `ranks_in_node` - 1 others in its node (0: any number, the whole rate).
    On a mesh fabric (MESH_FABRICS) a group of g of the node's n GPUs reaches only its g - 1
    peers' links, (g - 1)/(n - 1) of the GPU's total: a pair (a pipeline send, a ring hop) one
    link, 64 GB/s on MI300X; TP 4 three, 192 GB/s; all 8 the whole 448."""
    link = cluster.intra_node
    assert link is not None, "intra_node link asked of a one-GPU node"
    bandwidth, latency = link.bandwidth_bytes_per_s, link.latency_seconds
    gpn = cluster.gpus_per_node
    if link.kind in MESH_FABRICS and 2 <= ranks_in_node < gpn:
        bandwidth *= (ranks_in_node - 1) / (gpn - 1)
    measured = cluster.measured is not None
    staged = not link.peer_access and not measured  # a probe's figures already are the staged path's
    if staged:
        bandwidth *= HOST_STAGED_BANDWIDTH_FRACTION
        latency = max(latency, HOST_STAGED_STEP_LATENCY_SECONDS)
    return Link(link.kind, "intra_node", bandwidth, latency, measured, staged, *_p2p(
        link.p2p_bandwidth_gb_per_s, link.p2p_latency_us))


def _p2p(bandwidth_gb_per_s: float | None, latency_us: float | None) -> tuple[float | None, float | None]:
    """A profile's send/recv figures in SI units, both or neither."""
    if bandwidth_gb_per_s is None or latency_us is None:
        return None, None
    return units.gb_per_s_to_bytes_per_s(bandwidth_gb_per_s), units.us_to_seconds(latency_us)


def inter_node_link(cluster: ClusterSpec) -> Link:
    """Every GPU of a node crosses at once, so each gets 1/gpus_per_node of the NICs."""
    link = cluster.inter_node
    assert link is not None, "inter_node link asked of a one-node cluster"
    return Link(
        link.kind,
        "inter_node",
        cluster.inter_node_bandwidth_bytes_per_s_per_gpu,
        link.latency_seconds,
        cluster.measured is not None,
        False,
        *_p2p(link.p2p_bandwidth_gb_per_s_per_gpu, link.p2p_latency_us),
    )


def groups_cross_nodes(group_size: int, gpus_per_node: int) -> bool:
    """Do consecutive-rank groups of this size straddle a node boundary?"""
    period = math.lcm(group_size, gpus_per_node) // group_size
    return any(
        (g * group_size) // gpus_per_node != (g * group_size + group_size - 1) // gpus_per_node
        for g in range(period)
    )


def num_boundaries_crossing_nodes(layout: Layout, gpus_per_node: int, pp_outermost: bool = False) -> int:
    """Pipeline boundaries (of the first replica) whose send goes to another node. vLLM's
    order: a stage is one tp*cp block of ranks. Megatron's and torchtitan's
    (`pp_outermost`, tp-cp-dp-pp): stage s holds ranks [s*B, (s+1)*B), B = tp*cp*dp, and the
    first replica's send leaves rank s*B for rank (s+1)*B."""
    block = layout.tp * layout.cp * (layout.dp if pp_outermost else 1)
    return sum(
        (stage * block) // gpus_per_node != ((stage + 1) * block) // gpus_per_node
        for stage in range(layout.pp - 1)
    )


def group_topology(cluster: ClusterSpec, group_size: int) -> GroupTopology:
    """A group of `group_size` consecutive ranks: inside one node, or spread g per node
    over N nodes (g = gcd(group size, GPUs per node) when groups straddle node boundaries)."""
    gpn = cluster.gpus_per_node
    if cluster.num_nodes == 1 or not groups_cross_nodes(group_size, gpn):
        intra = intra_node_link(cluster, group_size) if group_size > 1 else None
        return GroupTopology(group_size, group_size, 1, intra, None)
    per_node = math.gcd(group_size, gpn)
    intra = intra_node_link(cluster, per_node) if per_node > 1 else None
    return GroupTopology(group_size, per_node, group_size // per_node, intra, inter_node_link(cluster))


def place(cluster: ClusterSpec, layout: Layout, pp_outermost: bool = False) -> Placement:
    """Where the layout's TP group and pipeline boundaries land. vLLM's order (dp never
    changes it), or with `pp_outermost` Megatron's and torchtitan's, where a stage is the
    tp*cp*dp block and its sends cross nodes once that block fills one
    (num_boundaries_crossing_nodes)."""
    gpn = cluster.gpus_per_node
    single_node = cluster.num_nodes == 1
    tp_crosses = not single_node and groups_cross_nodes(layout.tp, gpn)
    crossing = 0 if single_node else num_boundaries_crossing_nodes(layout, gpn, pp_outermost)
    tp_link = None
    if layout.tp > 1:
        tp_link = inter_node_link(cluster) if tp_crosses else intra_node_link(cluster, layout.tp)
    pp_link = None
    if layout.pp > 1:
        pp_link = inter_node_link(cluster) if crossing else intra_node_link(cluster, 2)  # a send: one peer
    tp_group = group_topology(cluster, layout.tp) if layout.tp > 1 else None
    cp_group = cp_group_topology(cluster, layout)
    cp_hop = intra_node_link(cluster, 2) if cp_group is not None and cp_group.ranks_per_node > 1 else None
    return Placement(tp_link, pp_link, tp_crosses, crossing, tp_group, ep_group_topology(cluster, layout, pp_outermost),
                     cp_group, cp_hop)


def ep_group_ranks(layout: Layout, pp_outermost: bool = False) -> list[int]:
    """Global ranks of the first EP group (stage 0): the TP groups of dp_per_ep_group
    consecutive data-parallel ranks. vLLM's order, r = (dp_index * pp + stage) * tp + tp_rank
    (each DP rank owns pp * tp consecutive GPUs); Megatron's (pp_outermost), r = (stage * dp
    + dp_index) * tp + tp_rank, makes them ep consecutive ranks. The same when pp = 1."""
    stride = layout.tp if pp_outermost else layout.pp * layout.tp
    return [d * stride + t for d in range(layout.dp_per_ep_group) for t in range(layout.tp)]


@functools.lru_cache(maxsize=256)
def _ep_group_spread(gpus_per_node: int, tp: int, pp: int, dp_per_ep_group: int, pp_outermost: bool) -> tuple[int, int]:
    """(ranks in the least-filled node the first EP group touches, nodes it touches)."""
    per_node: dict[int, int] = {}
    for rank in ep_group_ranks(Layout(tp, pp, dp_per_ep_group, tp * dp_per_ep_group), pp_outermost):
        node = rank // gpus_per_node
        per_node[node] = per_node.get(node, 0) + 1
    return min(per_node.values()), len(per_node)


def ep_group_topology(cluster: ClusterSpec, layout: Layout, pp_outermost: bool = False) -> GroupTopology | None:
    """How the EP group sits on the nodes: g ranks in the least-filled node it touches, N
    nodes. None without EP."""
    if layout.ep <= 1:
        return None
    g, n = _ep_group_spread(cluster.gpus_per_node, layout.tp, layout.pp, layout.dp_per_ep_group, pp_outermost)
    intra = intra_node_link(cluster, g) if g > 1 else None
    inter = inter_node_link(cluster) if n > 1 else None
    return GroupTopology(layout.ep, g, n, intra, inter)


def cp_group_ranks(layout: Layout) -> list[int]:
    """Global ranks of the first CP group: cp ranks at stride tp (Megatron's tp-cp-ep-dp-pp
    order, RankGenerator in parallel_state.py core_v0.19.0)."""
    return [i * layout.tp for i in range(layout.cp)]


def strided_group_topology(cluster: ClusterSpec, num_ranks: int, stride: int) -> GroupTopology | None:
    """How a group of num_ranks ranks at `stride` (0, stride, 2*stride, ...) sits on the
    nodes: g ranks in the least-filled node it touches, N nodes; None for one rank."""
    if num_ranks <= 1:
        return None
    g, n = _strided_spread(cluster.gpus_per_node, num_ranks, stride)
    intra = intra_node_link(cluster, g) if g > 1 else None
    inter = inter_node_link(cluster) if n > 1 else None
    return GroupTopology(num_ranks, g, n, intra, inter)


def _strided_spread(gpus_per_node: int, num_ranks: int, stride: int) -> tuple[int, int]:
    """(ranks in the least-filled node, nodes) of ranks 0, stride, ..., (n-1)*stride. In closed
    form when stride >= gpus_per_node (one rank per node) or divides it (k = gpn/stride per
    node, the last node holding what is left); else counted rank by rank."""
    if stride >= gpus_per_node:
        return 1, num_ranks
    if gpus_per_node % stride == 0:
        per_node = gpus_per_node // stride
        num_nodes = -(-num_ranks // per_node)
        return num_ranks - (num_nodes - 1) * per_node, num_nodes
    counts: dict[int, int] = {}
    for i in range(num_ranks):
        node = i * stride // gpus_per_node
        counts[node] = counts.get(node, 0) + 1
    return min(counts.values()), len(counts)


def cp_group_topology(cluster: ClusterSpec, layout: Layout) -> GroupTopology | None:
    """How one CP ring sits on the nodes (cp ranks at stride tp); None without CP. A ring
    hop crosses the NICs once N > 1."""
    return strided_group_topology(cluster, layout.cp, layout.tp)


def dp_group_topology(cluster: ClusterSpec, layout: Layout) -> GroupTopology | None:
    """How the data-parallel group with CP sits on the nodes: the dp*cp ranks that hold the
    same weights, at stride tp inside a pipeline stage's tp*cp*dp block (Megatron's
    tp-cp-ep-dp-pp order, RankGenerator in parallel_state.py core_v0.19.0;
    get_data_parallel_group(with_context_parallel=True)). None for one rank."""
    return strided_group_topology(cluster, layout.dp * layout.cp, layout.tp)


def expert_dp_group_topology(cluster: ClusterSpec, layout: Layout, num_ranks: int) -> GroupTopology | None:
    """The expert-data-parallel group (num_ranks = t*d/ep): with expert TP 1 Megatron orders
    expert ranks ep-edp-pp inside a stage, so the group is at stride ep."""
    return strided_group_topology(cluster, num_ranks, layout.ep)


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} by trial division up to the square root of what is left (the
    inputs are bounded: at most MAX_NUM_GPUS GPUs, MAX_NUM_LAYERS layers)."""
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, built from its prime factors."""
    result = [1]
    for prime, exponent in prime_factors(n).items():
        result = [d * prime**k for d in result for k in range(exponent + 1)]
    return sorted(result)


def expert_parallel_degrees(tp: int, dp: int, gpus_per_node: int, max_ep: int | None = None,
                            widest: bool = False, pp_in_node: int = 1) -> list[int]:
    """The EP degrees searched for one (tp, dp): tp * d for d in {1, the DP ranks that fill
    a node, dp}, above 1 and at most max_ep (the model's routed experts: a larger group
    leaves GPUs without an expert): EP inside the TP group, over one node, over every
    replica. (Any divisor d of dp is valid; these three are the placements deployments use,
    and they keep the search linear in the layouts at thousands of GPUs.) `widest` (the
    training search): also the widest group the experts allow where every replica's would be
    wider, the largest tp * d <= max_ep with d dividing dp (one expert or a few per GPU):
    GPT-OSS-120B's 128 experts over 256 B200 get ep = 128, not only 8. `pp_in_node`: the
    pipeline stages a node holds of each of its replicas: vLLM's rank order (TP, then stage, DP
    outermost) puts a replica's stages together, so a node holds gpus_per_node / (tp * pp) DP
    ranks of a stage (serving: pp), searched beside gpus_per_node / tp (the group then spans pp
    nodes); Megatron's (TP, CP, DP, then PP outermost) fills a node with one stage's DP ranks
    (training: 1). Qwen3-30B-A3B at tp=1 pp=2 on two 8-GPU nodes was searched at ep = 8 only, an
    EP group over both nodes, where ep = 4 in a node serves 11% more (found by a property sweep)."""
    wanted = {1, dp}
    # a node's worth of ranks of one stage; with a replica's stages together, also the ranks of
    # one node (a server of the group's replicas in one node)
    for stages in {1, pp_in_node}:
        in_node = gpus_per_node // (tp * stages) if gpus_per_node % (tp * stages) == 0 else 0
        if in_node and dp % in_node == 0:
            wanted.add(in_node)
    if widest and max_ep is not None and tp * dp > max_ep:
        wanted.add(max((d for d in range(1, max_ep // tp + 1) if dp % d == 0), default=1))
    return sorted(tp * d for d in wanted if tp * d > 1 and (max_ep is None or tp * d <= max_ep))


def factorizations(num_gpus: int) -> list[Layout]:
    """Every (tp, pp, dp) with tp * pp * dp = num_gpus."""
    return [
        Layout(tp, pp, num_gpus // (tp * pp))
        for tp in divisors(num_gpus)
        for pp in divisors(num_gpus // tp)
    ]
