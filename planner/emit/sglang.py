"""SGLang launch commands (targets sglang 0.4-0.5-era `sglang.launch_server` flags,
as defined in python/sglang/srt/server_args.py, ServerArgs).

`--tp-size` counts GPUs across all nodes; multi-node adds `--nnodes --node-rank
--dist-init-addr HEAD:PORT` on every node: one step for the head (node rank 0), one for
the workers (`$NODE_RANK`, planner/emit/command.py). `--max-running-requests` is per DP
worker (SGLang divides it by dp only with --enable-dp-attention), like vLLM's --max-num-seqs.
"""

from __future__ import annotations

import math

from planner.emit.command import (
    ALL_NODES,
    HEAD_ADDRESS_PLACEHOLDER,
    LaunchStep,
    NodeSet,
    ServeArgs,
    node_rank_value,
)

SGLANG_VERSION_TARGET = "sglang>=0.4.6"
DIST_INIT_PORT = 5000
KV_CACHE_DTYPE = {"auto": None, "fp8": "fp8_e4m3"}
QUANTIZATION = {"fp8": "fp8", "int8": None, "int4": None}


def sglang_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    base = ["python", "-m", "sglang.launch_server", "--model-path", a.model,
            "--tp-size", str(a.tp)]
    if a.pp > 1:
        base += ["--pp-size", str(a.pp)]
    if a.dp > 1:
        base += ["--dp-size", str(a.dp)]
    base += ["--mem-fraction-static", f"{a.gpu_memory_utilization:g}", "--context-length", str(a.max_model_len),
             "--max-running-requests", str(a.max_num_seqs)]
    if a.quantization and QUANTIZATION.get(a.quantization):
        base += ["--quantization", QUANTIZATION[a.quantization]]
    if KV_CACHE_DTYPE[a.kv_cache_dtype]:
        base += ["--kv-cache-dtype", KV_CACHE_DTYPE[a.kv_cache_dtype]]
    num_nodes = math.ceil(a.tp * a.pp * a.dp / a.gpus_per_node)
    if num_nodes == 1:
        return (LaunchStep(ALL_NODES, NodeSet(0), tuple(base)),)

    def argv(node_rank: str) -> tuple[str, ...]:
        return (*base, "--nnodes", str(num_nodes), "--node-rank", node_rank,
                "--dist-init-addr", f"{HEAD_ADDRESS_PLACEHOLDER}:{DIST_INIT_PORT}")

    workers = NodeSet(1, num_nodes - 1)
    return (LaunchStep("head", NodeSet(0), argv("0")),
            LaunchStep("worker", workers, argv(node_rank_value(workers))))
