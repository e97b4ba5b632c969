"""One-GPU smoke test of `plan probe`'s CUDA path, in under two minutes.

    python tools/gpu_smoke.py [--out DIR]        # DIR defaults to $OUT, else ./gpu-smoke

On one CUDA GPU it measures, with the probe's own functions (planner/probe/measure.py):
1. matmul rate as a short burst (boost clocks) and after ~10 s of back-to-back matmuls
   (sustained clocks), 16-bit, 8192^3;
2. HBM copy rate (read + write) on a 1 GiB buffer;
3. a one-rank NCCL all-reduce at 4 KiB, 1 MiB and 64 MiB, timed on the host clock and with
   CUDA events behind a device-side wait (the probe keeps the second, the first as a
   cross-check), and the host's overhead share;
then runs `plan probe --nproc-per-node 1` and a plan on the profile it wrote. Everything
goes to DIR/smoke.json (and the probe's profile to DIR/measured.yaml); stdout shows the
same. Without CUDA it says so in one line and exits 2: nothing here runs on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from planner import units

MATMUL_DIM = 8192
SUSTAIN_SECONDS = 10.0
COPY_BYTES = 2**30
ALLREDUCE_BYTES = (2**12, 2**20, 2**26)


def fail(message: str) -> None:
    print(f"gpu_smoke: {message}", file=sys.stderr)
    sys.exit(2)


def matmul_rates(torch, measure, device) -> dict[str, float]:
    burst = measure.matmul_flop_per_s(device, torch.bfloat16, MATMUL_DIM, 5)
    a = torch.randn(MATMUL_DIM, MATMUL_DIM, device=device, dtype=torch.bfloat16)
    deadline = time.perf_counter() + SUSTAIN_SECONDS
    while time.perf_counter() < deadline:  # heat the GPU to its sustained clocks
        for _ in range(20):
            torch.mm(a, a)
        torch.cuda.synchronize(device)
    sustained = measure.matmul_flop_per_s(device, torch.bfloat16, MATMUL_DIM, 20)
    return {"burst_tflops": units.flops_per_s_to_tflops(burst),
            "sustained_tflops": units.flops_per_s_to_tflops(sustained)}


def allreduce_both_ways(torch, dist, measure, timing, device) -> list[dict[str, float]]:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    rows = []
    try:
        for size in ALLREDUCE_BYTES:
            buffer = torch.empty(size // 4, dtype=torch.float32, device=device)

            def step(buffer=buffer):
                dist.all_reduce(buffer)

            def sync():
                torch.cuda.synchronize(device)

            host = sorted(measure.time_repeats(step, sync, device, 5, 20, 5))[2]
            events = sorted(measure.time_repeats_events(step, sync, device, 20, 5))[2]
            rows.append({"bytes": size, "host_us": units.seconds_to_us(host),
                         "events_us": units.seconds_to_us(events),
                         "host_overhead_fraction": timing.host_overhead_fraction(host, events)})
    finally:
        dist.destroy_process_group()
    return rows


def run(argv: list[str]) -> dict[str, object]:
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return {"argv": argv, "exit": result.returncode, "seconds": time.perf_counter() - started,
            "stdout_tail": result.stdout[-3000:], "stderr_tail": result.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-smoke")))
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        fail("torch is not installed (pip install torch, the CUDA build)")
    if not torch.cuda.is_available():
        fail("no CUDA GPU visible: this smoke test measures a GPU")
    from planner.probe import measure, timing

    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    report: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": str(torch.cuda.nccl.version()),
    }
    report["matmul"] = matmul_rates(torch, measure, device)
    report["hbm_copy_gb_per_s"] = units.bytes_per_s_to_gb_per_s(
        measure.copy_bandwidth_bytes_per_s(device, COPY_BYTES, 10))
    report["allreduce_one_rank"] = allreduce_both_ways(torch, dist, measure, timing, device)
    profile = args.out / "measured.yaml"
    report["probe"] = run([sys.executable, "-m", "planner", "probe", "--nproc-per-node", "1",
                           "--out", str(profile)])
    report["plan"] = run([sys.executable, "-m", "planner", "--model", "llama-3.1-8b",
                          "--cluster", str(profile), "--json"])
    text = json.dumps(report, indent=2)
    (args.out / "smoke.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
