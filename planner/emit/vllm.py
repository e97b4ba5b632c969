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
"""

from __future__ import annotations

import math

from planner.emit.command import (
    ALL_NODES,
    HEAD_ADDRESS_PLACEHOLDER,
    LaunchStep,
    NodeSet,
    ServeArgs,
    env_prefix,
    node_rank_value,
)

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
    flags += [
        "--dtype", a.dtype,
        "--gpu-memory-utilization", f"{a.gpu_memory_utilization:g}",
        "--max-model-len", str(a.max_model_len),
        "--max-num-seqs", str(a.max_num_seqs),
    ]
    if a.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    if quantization_flag(a):
        flags += ["--quantization", str(quantization_flag(a))]
    if a.kv_cache_dtype == "fp8":
        flags += ["--kv-cache-dtype", "fp8"]
    return flags


def vllm_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    """Every command to run, in order, with vLLM's multiprocessing backend."""
    return _steps(a, ray=False)


def vllm_ray_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    """The same layout on a Ray cluster (only differs when a replica spans nodes)."""
    return _steps(a, ray=True)


def _steps(a: ServeArgs, ray: bool) -> tuple[LaunchStep, ...]:
    base = ("vllm", "serve", a.model, *engine_flags(a))
    nodes_per_replica = math.ceil(a.tp * a.pp / a.gpus_per_node)
    if nodes_per_replica == 1:
        return _dp_steps(a, base)
    return (_ray_steps if ray else _mp_steps)(a, base, nodes_per_replica * a.dp)


def _mp_steps(a: ServeArgs, base: tuple[str, ...], num_nodes: int) -> tuple[LaunchStep, ...]:
    """Head on node 0, the other nodes headless; with dp > 1 the DP flags make it one deployment."""
    dp = () if a.dp == 1 else ("--data-parallel-size", str(a.dp), "--data-parallel-address",
                               HEAD_ADDRESS_PLACEHOLDER, "--data-parallel-rpc-port", str(DP_RPC_PORT))

    def argv(node_rank: str) -> tuple[str, ...]:
        return (*base, *dp, "--nnodes", str(num_nodes), "--node-rank", node_rank,
                "--master-addr", HEAD_ADDRESS_PLACEHOLDER, "--master-port", str(MASTER_PORT))

    workers = NodeSet(1, num_nodes - 1)
    return (LaunchStep("head", NodeSet(0), argv("0")),
            LaunchStep("worker", workers, (*argv(node_rank_value(workers)), "--headless")))


def _ray_steps(a: ServeArgs, base: tuple[str, ...], num_nodes: int) -> tuple[LaunchStep, ...]:
    """One Ray cluster over every node; the head serves all of it."""
    serve = (*base, "--distributed-executor-backend", "ray")
    if a.dp > 1:
        serve = (*env_prefix(VLLM_RAY_DP_PACK_STRATEGY="span"), *serve,
                 "--data-parallel-size", str(a.dp), "--data-parallel-backend", "ray")
    return (LaunchStep("head", NodeSet(0), ("ray", "start", "--head", "--port", str(RAY_PORT))),
            LaunchStep("worker", NodeSet(1, num_nodes - 1),
                       ("ray", "start", f"--address={HEAD_ADDRESS_PLACEHOLDER}:{RAY_PORT}")),
            LaunchStep("head", NodeSet(0), serve))


def _dp_steps(a: ServeArgs, base: tuple[str, ...]) -> tuple[LaunchStep, ...]:
    """Replicas within a node: per_node DP ranks on each node; the last node may hold fewer."""
    if a.dp == 1:
        return (LaunchStep(ALL_NODES, NodeSet(0), base),)
    per_node = a.gpus_per_node // (a.tp * a.pp)
    num_nodes = math.ceil(a.dp / per_node)
    if num_nodes == 1:
        return (LaunchStep(ALL_NODES, NodeSet(0), (*base, "--data-parallel-size", str(a.dp))),)

    def argv(local: int) -> tuple[str, ...]:
        return (*base, "--data-parallel-size", str(a.dp), "--data-parallel-size-local", str(local),
                "--data-parallel-address", HEAD_ADDRESS_PLACEHOLDER, "--data-parallel-rpc-port", str(DP_RPC_PORT))

    last_local = a.dp - (num_nodes - 1) * per_node
    full = NodeSet(1, num_nodes - 1 - (last_local < per_node))
    steps = [LaunchStep("head", NodeSet(0), argv(per_node))]
    if full.length:
        steps.append(LaunchStep("worker", full, (*argv(per_node), "--headless", "--data-parallel-start-rank",
                                                 node_rank_value(full, times=per_node))))
    if last_local < per_node:
        last = NodeSet(num_nodes - 1)
        steps.append(LaunchStep("worker", last, (*argv(last_local), "--headless", "--data-parallel-start-rank",
                                                 node_rank_value(last, times=per_node))))
    return tuple(steps)
