"""vLLM launch commands for the release in ServeArgs.engine_versions (planner/engines.py), flag
names as vllm/engine/arg_utils.py EngineArgs.add_cli_args defines them in that release
(tests/engine_flags/vllm-VERSION.json holds the accepted flags).

One address serves the whole deployment; the head's API server balances over every DP rank
(vLLM's internal load balancing):
- one node: `vllm serve`, with `--data-parallel-size` for replicas;
- replicas within a node, over several nodes: the head serves `--data-parallel-size-local`
  ranks, each worker adds `--headless --data-parallel-start-rank`;
- a replica wider than a node: `--nnodes N --node-rank R --master-addr HEAD`, workers add
  `--headless`; with several such replicas `--nnodes` covers the whole deployment and each node
  takes its DP rank from its node rank (EngineArgs.create_engine_config infers
  data_parallel_rank = node_rank * (world_size / nnodes) / (tp * pp)), the engines reaching the
  head at `--data-parallel-address`;
- Ray: `ray start` on every node, then the head serves with `--distributed-executor-backend ray`
  (and `--data-parallel-backend ray` with VLLM_RAY_DP_PACK_STRATEGY=span when each DP rank
  spans nodes, envs.py: "used only when a single DP rank requires multiple nodes").
`--max-num-seqs` applies per DP rank. One step per role; per-node values are placeholders
(planner/emit/command.py).

Expert parallelism (ep > 1): `--enable-expert-parallel` shards the MoE layers' experts over every
TP x DP rank of a deployment (vllm/config/parallel.py ParallelConfig.data_parallel_size: "MoE
layers will be sharded according to the product of the tensor, prefill-context, and data
parallel sizes"), each DP rank running its own attention and batch. So one EP group is one
deployment, `--data-parallel-size ep // tp`, launched as above (over several nodes with the same
multi-node DP flags); several EP groups are independent deployments, each on its own nodes
(`$REPLICA_HEAD_IP` is its first node) or, when smaller than a node, side by side on one node
(CUDA_VISIBLE_DEVICES, `--port`); each serves its own address, so a load balancer fronts them.
An MoE model's replicas without EP are such independent deployments too: one deployment's
data-parallel ranks would share (and split) its experts.

The V0 engine (0.6.6.post1: VllmRelease.v1_engine False) has no data-parallel deployment and no
multi-node launch of its own: every replica is an independent deployment, side by side on a node
or on a Ray cluster of its nodes (_v0_steps); `--enable-chunked-prefill` where the plan chunks
prompts that V0 would not by default.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from planner.emit.command import (
    ALL_NODES,
    DEFAULT_ALL2ALL_BACKEND,
    HEAD_ADDRESS_PLACEHOLDER,
    REPLICA_HEAD_ADDRESS,
    LaunchStep,
    NodeSet,
    PerNode,
    ServeArgs,
    env_prefix,
    node_rank_value,
)

SERVER_PORT = 8000
"""vLLM's default API port (FrontendArgs.port); the next ones for deployments sharing a node."""
MASTER_PORT = 29501
DP_RPC_PORT = 13345
RAY_PORT = 6379

QUANTIZE_ON_LOAD = {"int8": None, "int4": None}
"""Only for weights the engine must quantize itself (ServeArgs.quantization is the CLI's
override, never a pre-quantized spec): fp8 works on the fly from a 16-bit checkpoint, under
the release's name for it (VllmRelease.online_fp8_quantization); int8/int4 need an AWQ/GPTQ
checkpoint, whose config vLLM reads without a flag (passing --quantization to a checkpoint of
another method makes vLLM refuse to start)."""


def quantization_flag(a: ServeArgs) -> str | None:
    if a.quantization == "fp8":
        return a.engine_versions.vllm_release.online_fp8_quantization
    return QUANTIZE_ON_LOAD.get(a.quantization or "")


def engine_flags(a: ServeArgs) -> list[str]:
    flags = ["--tensor-parallel-size", str(a.tp)]
    if a.pp > 1:
        flags += ["--pipeline-parallel-size", str(a.pp)]
    if a.ep > 1:
        flags.append("--enable-expert-parallel")
        if a.all2all_backend != DEFAULT_ALL2ALL_BACKEND and a.layout.dp_per_ep_group > 1:
            # ParallelConfig.all2all_backend (vllm/config/parallel.py at 0.33.0); the default
            # is left implicit. Without DP ranks in the EP group there is no exchange to run.
            flags += ["--all2all-backend", a.all2all_backend]
        if a.enable_dbo and a.layout.dp_per_ep_group > 1:
            flags.append("--enable-dbo")  # ParallelConfig.enable_dbo
    flags += [
        "--dtype", a.dtype,
        "--gpu-memory-utilization", f"{a.gpu_memory_utilization:g}",
        "--max-model-len", str(a.max_model_len),
        "--max-num-seqs", str(a.max_num_seqs),
    ]
    if a.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    if a.trust_remote_code:
        flags.append("--trust-remote-code")  # ModelConfig.trust_remote_code
    if a.enable_chunked_prefill:
        flags.append("--enable-chunked-prefill")  # V0 only (EngineArgs.enable_chunked_prefill, 0.6.6.post1)
    if a.async_scheduling is False and a.engine_versions.vllm_release.async_scheduling:
        # SchedulerConfig.async_scheduling, a BooleanOptionalAction (0.22.0, 0.33.0); on by default
        flags.append("--no-async-scheduling")
    if a.tokenizer_workers > 1:
        # ModelConfig.renderer_num_workers (vllm/engine/arg_utils.py, 0.22.0 and 0.33.0)
        flags += ["--renderer-num-workers", str(a.tokenizer_workers)]
    if quantization_flag(a):
        flags += ["--quantization", str(quantization_flag(a))]
    if a.kv_cache_dtype == "fp8":
        flags += ["--kv-cache-dtype", "fp8"]
    flags += moe_backend_flags(a.moe_backend)
    return flags + speculative_flags(a)


def speculative_flags(a: ServeArgs) -> list[str]:
    """`--speculative-config` (EngineArgs.speculative_config, a JSON object of SpeculativeConfig's
    fields, vllm/config/speculative.py at 0.22.0 and 0.33.0): the method, num_speculative_tokens
    and, for a draft head, its checkpoint ("model"); ngram keeps vLLM's prompt_lookup defaults."""
    spec = a.speculation
    if spec is None:
        return []
    config: dict[str, object] = {"method": spec.method}
    if spec.draft is not None:
        config["model"] = spec.served_draft
    config["num_speculative_tokens"] = spec.num_tokens
    return ["--speculative-config", json.dumps(config, separators=(",", ":"))]


MXFP8_MOE_ACTIVATIONS = '{"moe": {"activation": "mxfp8"}}'
"""--quantization-config: QuantizationConfigArgs.moe = QuantSpec(activation="mxfp8")
(vllm/config/quantization.py QUANT_KEY_NAMES at 0.22.0 and 0.33.0), the override the MXFP4 MoE
oracle reads (fused_moe/oracle/mxfp4.py _user_moe_activation_override)."""


def moe_backend_flags(backend: str) -> list[str]:
    """The flags of the planner's --moe-backend. KernelConfig.moe_backend (vllm/config/kernel.py
    MoEBackend) is bound from --moe-backend in vllm/engine/arg_utils.py at 0.22.0 and 0.33.0.
    marlin: that choice. flashinfer_mxfp8: `--moe-backend flashinfer_trtllm` with MXFP8 MoE
    activations, which select_mxfp4_moe_backend resolves to FLASHINFER_TRTLLM_MXFP4_MXFP8 (what
    0.22.0's deprecated VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 says to use instead)."""
    if backend == "auto":
        return []
    if backend == "flashinfer_mxfp8":
        return ["--moe-backend", "flashinfer_trtllm", "--quantization-config", MXFP8_MOE_ACTIVATIONS]
    return ["--moe-backend", backend]


def vllm_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    """Every command to run, in order, with vLLM's multiprocessing backend."""
    return _steps(a, ray=False)


def vllm_ray_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    """The same layout on a Ray cluster (only differs when a replica spans nodes)."""
    return _steps(a, ray=True)


@dataclass(frozen=True)
class Blocks:
    """`copies` identical deployments, deployment c on nodes offset + c*span to offset + c*span
    + span-1 (one deployment: copies = 1). Each copy's first node is its head, reached at
    $REPLICA_HEAD_IP; a lone deployment is the plan's head, HEAD_IP, or with named_heads (a
    disaggregated role, whose proxy names every server's node) NODE<offset>_IP. offset is a
    multiple of span, so $((NODE_RANK % span)) is a node's rank inside its deployment."""

    span: int
    copies: int = 1
    offset: int = 0
    named_heads: bool = False

    def __post_init__(self) -> None:
        assert self.offset % self.span == 0, "a deployment's nodes start at a multiple of its span"

    def nodes(self, first: int, length: int = 1) -> NodeSet:
        start = self.offset + first
        return NodeSet(start, length) if self.copies == 1 else NodeSet(start, length, self.span, self.copies)

    def rank(self, nodes: NodeSet, times: int = 1) -> str:
        """The node's rank (times `times`) inside its own deployment."""
        whole_plan = self.copies == 1 and self.offset == 0
        return node_rank_value(nodes, times, modulo=None if whole_plan else self.span)

    @property
    def address(self) -> str:
        if self.copies > 1:
            return PerNode(f"${REPLICA_HEAD_ADDRESS}")
        return f"NODE{self.offset}_IP" if self.named_heads else HEAD_ADDRESS_PLACEHOLDER

    def role(self, role: str) -> str:
        return role if self.copies == 1 else f"replica {role}"


@dataclass(frozen=True)
class Extras:
    """What a disaggregated role adds to every node's command of its deployments: environment
    variables before `vllm serve` (env_prefix; PerNode values expand on each node) and flags
    after the engine's own."""

    env: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()


def _steps(a: ServeArgs, ray: bool) -> tuple[LaunchStep, ...]:
    """Without EP one deployment serves every DP rank. With EP each EP group is one deployment
    of its dp_per_ep_group DP ranks (vLLM shards the experts over all of a deployment's
    TP x DP ranks, ParallelConfig.data_parallel_size), and several groups are independent
    deployments: whole nodes each, or several to a node (placement_reasons refuses the rest)."""
    if not a.engine_versions.vllm_release.v1_engine:
        return _v0_steps(a)
    if a.ep == 1 and not (a.is_moe and a.dp > 1):
        return _deployment_steps(a, ray, copies=1)
    # an MoE model's replicas without EP: one deployment each (in one deployment vLLM would
    # split the experts over every TP x DP rank and step the ranks together,
    # vllm/model_executor/layers/fused_moe/config.py FusedMoEParallelConfig.make at 0.33.0)
    group = replace(a, dp=a.layout.dp_per_ep_group if a.ep > 1 else 1)
    copies = a.layout.num_ep_groups if a.ep > 1 else a.dp
    if copies > 1 and a.gpus_per_ep_group < a.gpus_per_node:
        return _shared_node_steps(group, copies)
    return _deployment_steps(group, ray, copies)


def _v0_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    """The V0 engine (0.6.6.post1) has neither a data-parallel deployment nor a multi-node launch
    of its own (no --data-parallel-size, --nnodes or --headless in its EngineArgs.add_cli_args):
    each replica is its own `vllm serve` with its own address, several side by side on a node
    (CUDA_VISIBLE_DEVICES, --port), and a replica wider than a node runs on a Ray cluster of its
    nodes (--distributed-executor-backend ray, whether or not Ray was asked for)."""
    assert a.ep == 1 and a.speculation is None, "refused for V0 before planning (requests.for_vllm_release)"
    replica = replace(a, dp=1)
    if a.dp > 1 and a.tp * a.pp < a.gpus_per_node:
        return _shared_node_steps(replica, a.dp)
    return _deployment_steps(replica, True, copies=a.dp)


def _deployment_steps(a: ServeArgs, ray: bool, copies: int, offset: int = 0, extras: Extras = Extras(),
                      named_heads: bool = False) -> tuple[LaunchStep, ...]:
    """`copies` deployments of `a` on whole nodes from node `offset` on (Blocks)."""
    base = (*extras.env, "vllm", "serve", a.model, *engine_flags(a), *extras.flags)
    size = a.tp * a.pp
    if size <= a.gpus_per_node:
        ranks_per_node = a.gpus_per_node // size
        return _dp_steps(a, base, Blocks(math.ceil(a.dp / ranks_per_node), copies, offset, named_heads))
    blocks = Blocks(math.ceil(size / a.gpus_per_node) * a.dp, copies, offset, named_heads)
    return (_ray_steps if ray else _mp_steps)(a, base, blocks)


def deployment_steps_from(a: ServeArgs, copies: int, offset: int, extras: Extras) -> tuple[LaunchStep, ...]:
    """`copies` deployments of `a` (one EP group each when a.ep > 1), each on its own whole
    nodes, from node `offset` on, with the multiprocessing backend, heads named NODE<n>_IP: a
    disaggregated role's workers wider than a node (planner/emit/disagg.py)."""
    group = a if a.ep == 1 else replace(a, dp=a.layout.dp_per_ep_group)
    return _deployment_steps(group, False, copies, offset, extras, named_heads=True)


def _mp_steps(a: ServeArgs, base: tuple[str, ...], blocks: Blocks) -> tuple[LaunchStep, ...]:
    """Head on node 0, the other nodes headless; with dp > 1 the DP flags make it one deployment."""
    dp = () if a.dp == 1 else ("--data-parallel-size", str(a.dp), "--data-parallel-address",
                               blocks.address, "--data-parallel-rpc-port", str(DP_RPC_PORT))

    def argv(node_rank: str) -> tuple[str, ...]:
        return (*base, *dp, "--nnodes", str(blocks.span), "--node-rank", node_rank,
                "--master-addr", blocks.address, "--master-port", str(MASTER_PORT))

    workers = blocks.nodes(1, blocks.span - 1)
    return (LaunchStep(blocks.role("head"), blocks.nodes(0), argv("0")),
            LaunchStep(blocks.role("worker"), workers, (*argv(blocks.rank(workers)), "--headless")))


def _ray_steps(a: ServeArgs, base: tuple[str, ...], blocks: Blocks) -> tuple[LaunchStep, ...]:
    """One Ray cluster over every node of a deployment; its head serves all of it."""
    serve = (*base, "--distributed-executor-backend", "ray")
    if a.dp > 1:
        serve = (*env_prefix(VLLM_RAY_DP_PACK_STRATEGY="span"), *serve,
                 "--data-parallel-size", str(a.dp), "--data-parallel-backend", "ray")
    join = PerNode(f"--address={blocks.address}:{RAY_PORT}") if blocks.copies > 1 else (
        f"--address={HEAD_ADDRESS_PLACEHOLDER}:{RAY_PORT}")
    heads = blocks.nodes(0)
    return (LaunchStep(blocks.role("head"), heads, ("ray", "start", "--head", "--port", str(RAY_PORT))),
            LaunchStep(blocks.role("worker"), blocks.nodes(1, blocks.span - 1), ("ray", "start", join)),
            LaunchStep(blocks.role("head"), heads, serve))


def _dp_steps(a: ServeArgs, base: tuple[str, ...], blocks: Blocks) -> tuple[LaunchStep, ...]:
    """Replicas within a node: per_node DP ranks on each of blocks.span nodes; the last node
    may hold fewer (never with copies > 1: an EP group then fills whole nodes)."""
    per_node = a.gpus_per_node // (a.tp * a.pp)
    num_nodes, copies = blocks.span, blocks.copies
    if num_nodes == 1:
        dp = ("--data-parallel-size", str(a.dp)) if a.dp > 1 else ()
        return (LaunchStep(ALL_NODES if copies == 1 else "server", blocks.nodes(0), (*base, *dp)),)

    def argv(local: int) -> tuple[str, ...]:
        return (*base, "--data-parallel-size", str(a.dp), "--data-parallel-size-local", str(local),
                "--data-parallel-address", blocks.address, "--data-parallel-rpc-port", str(DP_RPC_PORT))

    last_local = a.dp - (num_nodes - 1) * per_node
    assert copies == 1 or last_local == per_node, "EP groups of whole nodes"
    full = blocks.nodes(1, num_nodes - 1 - (last_local < per_node))
    steps = [LaunchStep(blocks.role("head"), blocks.nodes(0), argv(per_node))]
    if full.length:
        steps.append(LaunchStep(blocks.role("worker"), full, (*argv(per_node), "--headless",
                                                              "--data-parallel-start-rank",
                                                              blocks.rank(full, times=per_node))))
    if last_local < per_node:
        last = blocks.nodes(num_nodes - 1)
        steps.append(LaunchStep("worker", last, (*argv(last_local), "--headless", "--data-parallel-start-rank",
                                                 blocks.rank(last, times=per_node))))
    return tuple(steps)


def _shared_node_steps(group: ServeArgs, copies: int) -> tuple[LaunchStep, ...]:
    """EP groups smaller than a node, several to each node: deployment s of a node on GPUs
    s*G to s*G+G-1 (CUDA_VISIBLE_DEVICES), serving on port SERVER_PORT + s, its DP ranks
    talking on their own port. One step per place on the node, the nodes that hold it."""
    size = group.gpus_per_ep_group
    per_node = group.gpus_per_node // size
    steps = []
    for slot in range(min(per_node, copies)):
        gpus = ",".join(str(g) for g in range(slot * size, slot * size + size))
        dp = () if group.dp == 1 else ("--data-parallel-size", str(group.dp),
                                       "--data-parallel-rpc-port", str(DP_RPC_PORT + slot))
        argv = (*env_prefix(CUDA_VISIBLE_DEVICES=gpus), "vllm", "serve", group.model, *engine_flags(group), *dp,
                "--port", str(SERVER_PORT + slot))
        steps.append(LaunchStep("server", NodeSet(0, math.ceil((copies - slot) / per_node)), argv))
    return tuple(steps)
