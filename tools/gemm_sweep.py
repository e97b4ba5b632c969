"""Skinny-GEMM sweep on one CUDA GPU: the measured TFLOP/s of decode- and prefill-shaped GEMMs,
the numbers the serving step's GEMM shape model (cost/serving_time.gemm_utilization,
efficiency.gemm_row_half) stands for.

    python tools/gemm_sweep.py [--out DIR]       # DIR defaults to $OUT, else ./gemm-sweep

For each (N, K) in SHAPES and M in ROWS: y = x W^T with x [M, K] and W [N, K], bf16 (torch.mm)
and fp8 e4m3 with per-tensor scales (torch._scaled_mm, where the GPU has it), the median of
REPEATS CUDA-event timings of ITERATIONS back-to-back calls after a warm-up. Writes
DIR/gemm_sweep.json: one row per (dtype, M, N, K) with seconds and TFLOP/s. Without CUDA it
says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from planner import units

ROWS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SHAPES = ((8192, 8192), (28672, 8192), (8192, 28672), (10240, 8192))
"""Llama-3.1-70B at tp = 1: output projection, MLP up (gate and up: 2 x 14,336), MLP down, QKV."""
ITERATIONS = 20
REPEATS = 5


def timed(torch, fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERATIONS):
            fn()
        end.record()
        end.synchronize()
        samples.append(units.ms_to_seconds(start.elapsed_time(end)) / ITERATIONS)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gemm-sweep")))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gemm_sweep: no CUDA GPU visible (nothing here runs on a CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    rows = []
    for n, k in SHAPES:
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        w8 = w.to(torch.float8_e4m3fn)
        scale = torch.ones((), device=device, dtype=torch.float32)
        for m in ROWS:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            flops = 2 * m * n * k
            seconds = timed(torch, lambda x=x, w=w: torch.mm(x, w.t()))
            rows.append({"dtype": "bf16", "m": m, "n": n, "k": k, "seconds": seconds, "tflops": units.flops_per_s_to_tflops(flops / seconds)})
            if m % 16 == 0 and hasattr(torch, "_scaled_mm"):
                x8 = x.to(torch.float8_e4m3fn)
                try:
                    seconds = timed(torch, lambda x8=x8, w8=w8, scale=scale: torch._scaled_mm(
                        x8, w8.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16))
                    rows.append({"dtype": "fp8", "m": m, "n": n, "k": k, "seconds": seconds,
                                 "tflops": units.flops_per_s_to_tflops(flops / seconds)})
                except RuntimeError as error:  # a shape or build without the kernel
                    rows.append({"dtype": "fp8", "m": m, "n": n, "k": k, "error": str(error)[:200]})
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm_sweep.json").write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
