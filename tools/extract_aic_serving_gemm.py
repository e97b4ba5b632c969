"""Extract the AIConfigurator vLLM GEMM measurements the serving matmul rates are fitted to.

    python tools/extract_aic_serving_gemm.py /path/to/aiconfigurator_core/systems/data OUT.csv

Needs pandas + pyarrow (not a planner dependency). Writes, for h100_sxm, h200_sxm, b200_sxm
and l40s, vLLM 0.24.0's linear kernels (gemm/vllm/0.24.0/gemm_perf.parquet: bf16
torch.nn.functional.linear, per-tensor fp8 CutlassFP8ScaledMMLinearKernel, NVFP4
FlashInferCuteDslNvFp4LinearKernel), and for a100_sxm vLLM 0.14.0's (bf16 only, the newest
vLLM AIConfigurator measured on A100), at the forward shapes of a Llama-3.1-8B and -70B layer
(QKV, output projection, gated MLP up, MLP down; tp 1, 2, 4, 8) and M >= 2048 tokens (the
prefill rows where the rate, not the weight read, decides), the fastest of repeated points.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

GPUS = {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "b200_sxm": "0.24.0", "l40s": "0.24.0", "a100_sxm": "0.14.0"}
DTYPES = ("bfloat16", "fp8", "nvfp4")
MIN_TOKENS = 2048


def layer_shapes() -> set[tuple[int, int]]:
    """(n, k) of QKV, output projection, MLP up (gated) and down at tp 1-8."""
    shapes = set()
    for h, f, qkv in ((4096, 14336, 6144), (8192, 28672, 10240)):
        for t in (1, 2, 4, 8):
            shapes |= {(qkv // t, h), (h, h // t), (2 * f // t, h), (h, f // t)}
    return shapes


def main(root: Path, out: Path) -> None:
    rows = []
    shapes = layer_shapes()
    for gpu, version in GPUS.items():
        gemm = pd.read_parquet(root / gpu / f"gemm/vllm/{version}/gemm_perf.parquet")
        gemm = gemm[gemm.gemm_dtype.isin(DTYPES) & (gemm.m >= MIN_TOKENS)]
        gemm = gemm[[(n, k) in shapes for n, k in zip(gemm.n, gemm.k, strict=True)]]
        best = gemm.groupby(["gemm_dtype", "m", "n", "k"], as_index=False).latency.min()
        best.insert(0, "gpu", gpu)
        rows.append(best.rename(columns={"latency": "latency_ms"}))
    pd.concat(rows).sort_values(["gpu", "gemm_dtype", "m", "n", "k"]).to_csv(out, index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
