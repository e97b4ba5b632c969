"""Extract the AIConfigurator vLLM GEMMs at decode batch sizes that the weight-stream rate per GPU
is read from (bench/decode_bandwidth_calibration.py --gemm).

    python tools/extract_aic_decode_gemm.py /path/to/aiconfigurator_core/systems/data OUT.csv

Needs pandas + pyarrow (not a planner dependency). Writes, for h100_sxm and l40s (vLLM 0.24.0's
bf16 torch.nn.functional.linear and per-tensor fp8 CutlassFP8ScaledMMLinearKernel) and a100_sxm
(vLLM 0.14.0, bf16), every measured shape with M <= 8 rows (a decode step's batch: the kernel
streams the weight matrix once) whose weights are at least three times the GPU's L2 cache (the
benchmark repeats each GEMM, so a matrix that fits in L2 is read from it: the L40S's 96 MB L2
gives 8-32 MB matrices "bandwidths" above HBM's), the fastest of repeated points.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

GPUS = {"h100_sxm": "0.24.0", "l40s": "0.24.0", "a100_sxm": "0.14.0"}
L2_BYTES = {"h100_sxm": 50e6, "l40s": 96e6, "a100_sxm": 40e6}  # NVIDIA's architecture documents
KERNELS = {"bfloat16": 2, "fp8": 1}  # bytes per weight
MAX_ROWS = 8


def main(root: Path, out: Path) -> None:
    rows = []
    for gpu, version in GPUS.items():
        gemm = pd.read_parquet(root / gpu / f"gemm/vllm/{version}/gemm_perf.parquet")
        gemm = gemm[gemm.gemm_dtype.isin(tuple(KERNELS)) & (gemm.m <= MAX_ROWS)]
        weight = gemm.n * gemm.k * gemm.gemm_dtype.map(KERNELS)
        gemm = gemm[weight >= 3 * L2_BYTES[gpu]]
        best = gemm.groupby(["gemm_dtype", "m", "n", "k"], as_index=False).latency.min()
        best.insert(0, "gpu", gpu)
        rows.append(best.rename(columns={"latency": "latency_ms"}))
    pd.concat(rows).sort_values(["gpu", "gemm_dtype", "m", "n", "k"]).to_csv(out, index=False, float_format="%.6g")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
