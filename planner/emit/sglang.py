"""SGLang launch commands (targets sglang 0.4-0.5-era `sglang.launch_server` flags; engines.md).

`--tp-size` counts GPUs across all nodes; multi-node adds `--nnodes --node-rank
--dist-init-addr HEAD:PORT` on every node. `--max-running-requests` is per DP worker
(SGLang divides it by dp only with --enable-dp-attention), like vLLM's --max-num-seqs.
"""

from __future__ import annotations

import math

from planner.emit.command import HEAD_ADDRESS_PLACEHOLDER, Step
from planner.emit.vllm import VllmArgs

SGLANG_VERSION_TARGET = "sglang>=0.4.6"
DIST_INIT_PORT = 5000
KV_CACHE_DTYPE = {"auto": None, "fp8": "fp8_e4m3"}
QUANTIZATION = {"fp8": "fp8", "int8": None, "int4": None}


def sglang_steps(a: VllmArgs) -> list[Step]:
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
        return [Step("node 0", tuple(base))]
    return [
        Step(f"node {rank} (head)" if rank == 0 else f"node {rank}",
             (*base, "--nnodes", str(num_nodes), "--node-rank", str(rank),
              "--dist-init-addr", f"{HEAD_ADDRESS_PLACEHOLDER}:{DIST_INIT_PORT}"))
        for rank in range(num_nodes)
    ]
