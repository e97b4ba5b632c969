"""Extract the all-reduce times the serving step prices vLLM's fused all-reduce + RMSNorm with.

    python tools/extract_aic_fused_allreduce.py /path/to/aiconfigurator_core/systems/data OUT.csv

Needs pandas + pyarrow (not a planner dependency). Writes, for h100_sxm, h200_sxm, b200_sxm and gb200 (2 and 4 GPUs: one tray),
AIConfigurator's measured TRT-LLM custom all-reduce (comm/trtllm/1.3.0rc20/
custom_allreduce_perf.parquet: bf16, 2, 4 and 8 GPUs of one node, 128 to 512 Mi elements, written
as bytes, 256 B to 1 GiB; CUDA-graph timed): the one-shot / two-shot Lamport kernels that FlashInfer's trtllm_allreduce_fusion (the
kernel vLLM's AllReduceFusionPass calls) was ported from. The fastest of repeated points.
The catalog's serving_allreduce curves (planner/data/gpus.yaml) keep every other size (x4 steps)
from 256 B to 256 MiB (tests/serve/test_fused_allreduce.py checks they are these numbers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

VERSION = "1.3.0rc20"
BF16_BYTES = 2
"""message_size counts bf16 elements, not bytes: AIConfigurator's collector (collector/
collect_all_reduce.py, get_input_shape_and_comm_size) all-reduces a tensor of message_size
elements, [message_size // 4096, 4096] above 4096."""
GPUS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200")


def allreduce_points(root: Path, tables: dict[str, str], backend: str | None = None) -> pd.DataFrame:
    """The fastest bf16 point per (GPU, group size, size) of AIConfigurator's all-reduce
    tables, `tables` mapping each GPU to its table (comm/<framework>/<version>/
    custom_allreduce_perf.parquet under the GPU), sizes as bytes (BF16_BYTES per counted
    element); `backend` keeps one of its backends."""
    rows = []
    for gpu, table in tables.items():
        data = pd.read_parquet(root / gpu / table)
        data = data[data.allreduce_dtype == "bfloat16"]
        if backend is not None:
            data = data[data.backend == backend]
        best = data.groupby(["num_gpus", "message_size"], as_index=False).latency.min()
        best.insert(0, "gpu", gpu)
        best["message_size"] *= BF16_BYTES
        rows.append(best.rename(columns={"latency": "latency_ms", "message_size": "message_bytes"}))
    points = pd.concat(rows).sort_values(["gpu", "num_gpus", "message_bytes"])
    points["latency_ms"] = points.latency_ms.map(lambda v: f"{v:.5g}")
    return points


def main(root: Path, out: Path) -> None:
    table = f"comm/trtllm/{VERSION}/custom_allreduce_perf.parquet"
    allreduce_points(root, dict.fromkeys(GPUS, table)).to_csv(out, index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
