"""Extract the AIConfigurator vLLM fused-MoE measurements the serving MoE kernels are fitted to.

    python tools/extract_aic_moe_kernels.py /path/to/aiconfigurator_core/systems/data OUT.csv

Needs pandas + pyarrow (not a planner dependency). Writes (column ep: 1, or the EP degree of an
EP_KEYS kernel's rows), for h100_sxm, h200_sxm, b200_sxm, gb200 and l40s,
vLLM 0.24.0's fused MoE op (moe/vllm/0.24.0/moe_perf.parquet) for each expert weight format
the planner prices with a measured kernel, using the kernel AIConfigurator collected for that
format on that GPU (KERNELS; FOREIGN_SOURCES adds rows of the same FlashInfer kernel timed under
SGLang where vLLM's collection lacks a shape): balanced routing (AIConfigurator's collector sends token i to
experts (i + j*ceil(E/k)) mod E, so min(E, N*k) experts are touched), no expert parallelism
(moe_ep_size 1), tp <= 8 with at least 128 expert columns per GPU (inter_size / tp: what a
deployment shards an expert to), num_tokens in TOKENS; the fastest of repeated points.

Per-tensor fp8 (ModelOpt's FlashInfer CUTLASS kernel on Hopper) is left out: it runs slower
than bf16 up to 1,024 tokens in these data (3.9 ms against 1.1 ms for Qwen3-235B's layer at 16
tokens on H200), and the block-fp8 checkpoints (DeepSeek, Qwen3 FP8) run the Triton kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

VERSION = "0.24.0"
KERNELS = {
    ("h100_sxm", "bf16"): "vllm_unquantizedfusedmoe_triton_tritonexperts",
    ("h200_sxm", "bf16"): "vllm_unquantizedfusedmoe_triton_tritonexperts",
    ("b200_sxm", "bf16"): "vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts",
    ("h100_sxm", "fp8"): "vllm_fp8moe_triton_tritonexperts",
    ("h200_sxm", "fp8"): "vllm_fp8moe_triton_tritonexperts",
    ("b200_sxm", "fp8"): "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic",
    ("h100_sxm", "mxfp4"): "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic",
    ("h200_sxm", "mxfp4"): "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic",
    ("b200_sxm", "mxfp4"): "vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_trtllmmxfp4expertsmonolithic",
    ("b200_sxm", "nvfp4"): "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_trtllm_trtllmnvfp4expertsmonolithic",
    ("gb200", "bf16"): "vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts",
    ("gb200", "fp8"): "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic",
    ("gb200", "mxfp4"): "vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_trtllmmxfp4expertsmonolithic",
    ("gb200", "nvfp4"): "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_trtllm_trtllmnvfp4expertsmonolithic",
    ("l40s", "bf16"): "vllm_unquantizedfusedmoe_triton_tritonexperts",
    ("l40s", "fp8"): "vllm_fp8moe_triton_tritonexperts",
    ("l40s", "mxfp4"): "vllm_gptossmxfp4moe_marlin_marlinexperts",
    ("h100_sxm", "marlin_mxfp4"): "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu",
    ("h200_sxm", "marlin_mxfp4"): "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu",
    ("b200_sxm", "marlin_mxfp4"): "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts",
    ("l40s", "marlin_mxfp4"): "vllm_gptossmxfp4moe_marlin_marlinexperts",
    ("h100_sxm", "fp8_ep"): "vllm_fp8moe_flashinfer_cutlass_flashinferexperts",
    ("h200_sxm", "fp8_ep"): "vllm_fp8moe_flashinfer_cutlass_flashinferexperts",
    ("b200_sxm", "flashinfer_mxfp8_mxfp4"): "vllm_mxfp4moe_flashinfer_trtllm_mxfp4_mxfp8_trtllmmxfp4expertsmodular",
}
"""(GPU, the planner's expert weight format) -> AIConfigurator's kernel_source. fp8 is block fp8
(moe_dtype fp8_block): Triton's w8a8 block kernel on Hopper and Ada, TRT-LLM's on Blackwell; gpt-oss
MXFP4 runs Marlin on Ada (L40S). marlin_mxfp4 is MXFP4 experts under `--moe-backend marlin`
(vLLM's weight-only Marlin MoE, 16-bit activations; VLLM_MXFP4_USE_MARLIN=1 in older releases):
on Hopper and Blackwell measured at one shape only (h 3584, FFN 3072, E 896, top-16), on L40S it is
the default kernel's data again. fp8_ep is block fp8 under expert parallelism on Hopper, where vLLM
picks FlashInfer's CUTLASS kernel instead of Triton (EP_KEYS: its rows are the EP ones). A100 is
left out: its data (vLLM 0.14.0) has no balanced rows."""
FOREIGN_SOURCES = {
    ("b200_sxm", "flashinfer_mxfp8_mxfp4"): ("sglang", "0.5.14", "sglang_flashinfer_trtllm_moe", "w4a8_mxfp4_mxfp8"),
}
"""(GPU, kernel key) -> (engine, version, kernel_source, moe_dtype) of extra rows. MXFP4 experts
with MXFP8 activations (`--moe-backend flashinfer_mxfp8`: FlashInfer's TRT-LLM MoE,
FLASHINFER_TRTLLM_MXFP4_MXFP8 in vLLM) are in vLLM 0.24.0's data at two shapes (h 4096 E 256 top-6;
h 7168 E 384 top-6), and at gpt-oss's (h 2880, E 32 / 128, top-4) only in SGLang 0.5.14's, which calls
the same FlashInfer kernel: its 16-bit-activation rows of that kernel at gpt-oss's shape are within
1-4% of vLLM 0.24.0's (0.92-1.00 at 1-16,384 tokens, tp 1-8)."""
EP_KEYS = {"fp8_ep"}
"""Kernel keys measured under expert parallelism: rows with moe_ep_size > 1 and moe_tp_size 1
(AIConfigurator's collector times one rank holding E/ep experts for num_tokens routed over all E),
instead of moe_ep_size 1."""
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_TP = 8
MIN_COLUMNS_PER_GPU = 128


def sources(gpu: str, weight_format: str) -> list[tuple[str, str, str, str | None]]:
    """(engine, version, kernel_source, moe_dtype or None for any) of a key's rows."""
    extra = FOREIGN_SOURCES.get((gpu, weight_format))
    return [("vllm", VERSION, KERNELS[gpu, weight_format], None), *([extra] if extra else [])]


def main(root: Path, out: Path) -> None:
    rows = []
    for (gpu, weight_format), (engine, version, kernel, dtype) in (
            (key, source) for key in KERNELS for source in sources(*key)):
        moe = pd.read_parquet(root / gpu / f"moe/{engine}/{version}/moe_perf.parquet")
        if dtype is not None:
            moe = moe[moe.moe_dtype == dtype]
        parallel = ((moe.moe_ep_size > 1) & (moe.moe_tp_size == 1) if weight_format in EP_KEYS
                    else (moe.moe_ep_size == 1) & (moe.moe_tp_size <= MAX_TP)
                    & (moe.inter_size / moe.moe_tp_size >= MIN_COLUMNS_PER_GPU))
        moe = moe[(moe.kernel_source == kernel) & (moe.distribution == "balanced") & parallel
                  & moe.num_tokens.isin(TOKENS)]
        keys = ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "num_tokens"]
        best = moe.groupby(keys, as_index=False).latency.min()
        best.insert(0, "weight_format", weight_format)
        best.insert(0, "gpu", gpu)
        rows.append(best.rename(columns={"latency": "latency_ms", "moe_tp_size": "tp", "moe_ep_size": "ep"}))
    table = pd.concat(rows).sort_values(["gpu", "weight_format", "hidden_size", "inter_size", "num_experts", "tp",
                                         "ep", "num_tokens"])
    table["latency_ms"] = table.latency_ms.map(lambda v: f"{v:.5g}")
    table.to_csv(out, index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
