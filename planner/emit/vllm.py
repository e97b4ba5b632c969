"""vLLM launch commands (targets vLLM 0.11-0.12-era flags, 2025-2026; engines.md).

Single node: one `vllm serve`. A replica larger than a node: every node runs
`vllm serve ... --nnodes N --node-rank R --master-addr HEAD`, workers `--headless`;
or Ray (`ray start`, then `--distributed-executor-backend ray` on the head).
Data parallel: `--data-parallel-size` on one node; across nodes the head serves
`--data-parallel-size-local` ranks and each worker adds `--headless
--data-parallel-start-rank`. `--max-num-seqs` applies per DP rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.emit.command import HEAD_ADDRESS_PLACEHOLDER, Step

VLLM_VERSION_TARGET = "vllm>=0.11 (V1 engine, multiprocessing multi-node)"
MASTER_PORT = 29501
DP_RPC_PORT = 13345
RAY_PORT = 6379


@dataclass(frozen=True)
class VllmArgs:
    model: str
    tp: int
    pp: int
    dp: int
    gpus_per_node: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    quantization: str | None
    kv_cache_dtype: str
    dtype: str


QUANTIZATION_FLAG = {"fp8": "fp8", "int8": None, "int4": None}
"""Only for weights the engine must quantize itself (VllmArgs.quantization is the CLI's
override, never a pre-quantized spec): fp8 works on the fly from a 16-bit checkpoint;
int8/int4 need an AWQ/GPTQ checkpoint, whose config vLLM reads without a flag (passing
--quantization to a checkpoint of another method makes vLLM refuse to start)."""


def engine_flags(a: VllmArgs) -> list[str]:
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


def vllm_steps(a: VllmArgs, backend: str = "mp") -> list[Step]:
    """Every command to run, in order, for this layout. backend: mp (default) or ray."""
    replica_gpus = a.tp * a.pp
    base = ["vllm", "serve", a.model, *engine_flags(a)]
    if replica_gpus <= a.gpus_per_node:
        return _dp_steps(a, base)
    num_nodes = math.ceil(replica_gpus / a.gpus_per_node)
    steps = []
    for replica in range(a.dp):
        # Each replica is its own deployment on its own nodes, with its own head.
        first = replica * num_nodes
        label = f"replica {replica}: " if a.dp > 1 else ""
        head = HEAD_ADDRESS_PLACEHOLDER if replica == 0 else f"REPLICA{replica}_{HEAD_ADDRESS_PLACEHOLDER}"
        steps += (_ray_steps(base, num_nodes, label, first, head) if backend == "ray"
                  else _mp_steps(base, num_nodes, label, first, head))
    return steps


def _mp_steps(base: list[str], num_nodes: int, label: str, first: int, head: str) -> list[Step]:
    steps = []
    for rank in range(num_nodes):
        argv = [*base, "--nnodes", str(num_nodes), "--node-rank", str(rank),
                "--master-addr", head, "--master-port", str(MASTER_PORT)]
        where = f"{label}node {first + rank}" + (" (head)" if rank == 0 else "")
        steps.append(Step(where, tuple(argv + (["--headless"] if rank else []))))
    return steps


def _ray_steps(base: list[str], num_nodes: int, label: str, first: int, head: str) -> list[Step]:
    steps = [Step(f"{label}node {first} (head)", ("ray", "start", "--head", "--port", str(RAY_PORT)))]
    steps += [
        Step(f"{label}node {first + rank}", ("ray", "start", f"--address={head}:{RAY_PORT}"))
        for rank in range(1, num_nodes)
    ]
    steps.append(Step(f"{label}node {first} (head)", (*base, "--distributed-executor-backend", "ray")))
    return steps


def _dp_steps(a: VllmArgs, base: list[str]) -> list[Step]:
    if a.dp == 1:
        return [Step("node 0", tuple(base))]
    per_node = a.gpus_per_node // (a.tp * a.pp)
    num_nodes = math.ceil(a.dp / per_node)
    if num_nodes == 1:
        return [Step("node 0", (*base, "--data-parallel-size", str(a.dp)))]
    steps = []
    for node in range(num_nodes):
        local = min(per_node, a.dp - node * per_node)
        argv = [*base, "--data-parallel-size", str(a.dp), "--data-parallel-size-local", str(local),
                "--data-parallel-address", HEAD_ADDRESS_PLACEHOLDER, "--data-parallel-rpc-port", str(DP_RPC_PORT)]
        if node:
            argv += ["--headless", "--data-parallel-start-rank", str(node * per_node)]
        steps.append(Step(f"node {node} (head)" if node == 0 else f"node {node}", tuple(argv)))
    return steps
