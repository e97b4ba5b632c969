"""Extract the all-reduce times the serving step prices vLLM's unfused TP all-reduce with.

    python tools/extract_aic_vllm_allreduce.py /path/to/aiconfigurator_core/systems/data OUT.csv

Needs pandas + pyarrow (not a planner dependency). Writes, for h100_sxm, h200_sxm, b200_sxm and
gb200 (2 and 4 GPUs: one tray), AIConfigurator's measured vLLM 0.24.0 TP all-reduce
(comm/vllm/0.24.0/custom_allreduce_perf.parquet, backend vllm_graph), and for a100_sxm the only
vLLM release measured there, 0.14.0 (A100 has no fused all-reduce + RMSNorm: vLLM fuses on
Hopper and later, so this is the all-reduce it runs at every size): the collector calls
vllm.distributed.tensor_model_parallel_all_reduce inside a CUDA graph, so each point is what
vLLM's communicator dispatches at that size (its custom one-shot / two-shot kernels, symmetric
memory or NCCL), bf16, 2, 4 and 8 GPUs of one node. message_size counts bf16 elements
(collector/collect_all_reduce.py all-reduces a [message_size // 4096, 4096] tensor); written
as bytes, 256 B to 1 GiB. The fastest of repeated points. The catalog's
serving_allreduce_unfused curves (planner/data/gpus.yaml) keep every other size (x4 steps)
from 256 B to 256 MiB (tests/serve/test_fused_allreduce.py checks they are these numbers).
"""

from __future__ import annotations

import sys
from pathlib import Path

from extract_aic_fused_allreduce import allreduce_points

VERSIONS = {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "b200_sxm": "0.24.0", "gb200": "0.24.0", "a100_sxm": "0.14.0"}
BACKEND = "vllm_graph"


def main(root: Path, out: Path) -> None:
    tables = {gpu: f"comm/vllm/{version}/custom_allreduce_perf.parquet" for gpu, version in VERSIONS.items()}
    allreduce_points(root, tables, BACKEND).to_csv(out, index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
