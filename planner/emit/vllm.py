"""vLLM launch commands (targets vLLM 0.11-0.12-era flags, 2025-2026, as defined in
vllm/engine/arg_utils.py, EngineArgs.add_cli_args).

Single node: one `vllm serve`. A replica larger than a node: the head runs
`vllm serve ... --nnodes N --node-rank 0 --master-addr HEAD`, every worker the same with
its node rank and `--headless`; or Ray (`ray start` on every node, then
`--distributed-executor-backend ray` on the head). Data parallel: `--data-parallel-size`
on one node; across nodes the head serves `--data-parallel-size-local` ranks and each
worker adds `--headless --data-parallel-start-rank`. `--max-num-seqs` applies per DP rank.
Data parallel replicas larger than a node are independent deployments, each with its own
head (the first node of the replica). One step per role; per-node values are placeholders
(planner/emit/command.py).
"""

from __future__ import annotations

import math

from planner.emit.command import (
    ALL_NODES,
    HEAD_ADDRESS_PLACEHOLDER,
    REPLICA_HEAD_ADDRESS,
    LaunchStep,
    NodeSet,
    PerNode,
    ServeArgs,
    node_rank_value,
)

VLLM_VERSION_TARGET = "vllm>=0.11 (V1 engine, multiprocessing multi-node)"
MASTER_PORT = 29501
DP_RPC_PORT = 13345
RAY_PORT = 6379

QUANTIZATION_FLAG = {"fp8": "fp8", "int8": None, "int4": None}
"""Only for weights the engine must quantize itself (ServeArgs.quantization is the CLI's
override, never a pre-quantized spec): fp8 works on the fly from a 16-bit checkpoint;
int8/int4 need an AWQ/GPTQ checkpoint, whose config vLLM reads without a flag (passing
--quantization to a checkpoint of another method makes vLLM refuse to start)."""


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
    if a.quantization and QUANTIZATION_FLAG.get(a.quantization):
        flags += ["--quantization", QUANTIZATION_FLAG[a.quantization]]
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
    return (_ray_steps if ray else _mp_steps)(base, nodes_per_replica, a.dp)


def _roles(nodes_per_replica: int, dp: int) -> tuple[tuple[str, NodeSet], tuple[str, NodeSet], str]:
    """(head role, its nodes), (worker role, their nodes), the head address: replica r holds
    nodes r*k .. r*k+k-1 and is its own deployment."""
    k = nodes_per_replica
    if dp == 1:
        return ("head", NodeSet(0)), ("worker", NodeSet(1, k - 1)), HEAD_ADDRESS_PLACEHOLDER
    return (("replica head", NodeSet(0, 1, k, dp)), ("replica worker", NodeSet(1, k - 1, k, dp)),
            PerNode(f"${REPLICA_HEAD_ADDRESS}"))


def _mp_steps(base: tuple[str, ...], k: int, dp: int) -> tuple[LaunchStep, ...]:
    (head_role, heads), (worker_role, workers), address = _roles(k, dp)

    def argv(node_rank: str) -> tuple[str, ...]:
        return (*base, "--nnodes", str(k), "--node-rank", node_rank,
                "--master-addr", address, "--master-port", str(MASTER_PORT))

    in_replica = node_rank_value(workers, modulo=k) if dp > 1 else node_rank_value(workers)
    return (LaunchStep(head_role, heads, argv("0")),
            LaunchStep(worker_role, workers, (*argv(in_replica), "--headless")))


def _ray_steps(base: tuple[str, ...], k: int, dp: int) -> tuple[LaunchStep, ...]:
    (head_role, heads), (worker_role, workers), address = _roles(k, dp)
    join = f"--address={address}:{RAY_PORT}"
    return (LaunchStep(head_role, heads, ("ray", "start", "--head", "--port", str(RAY_PORT))),
            LaunchStep(worker_role, workers, ("ray", "start", PerNode(join) if dp > 1 else join)),
            LaunchStep(head_role, heads, (*base, "--distributed-executor-backend", "ray")))


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
