"""Extract the AIConfigurator kernel measurements the training rates are fitted to.

    python tools/extract_aic_training_kernels.py /path/to/aiconfigurator_core/systems/data OUT_DIR

Needs pandas + pyarrow (not a planner dependency). Writes, for h100_sxm and b200_sxm (and the
context attention alone for h200_sxm, gb200, a100_sxm and l40s, at the framework versions AIC
measured there):
gemm (TRT-LLM 1.3.0rc20, torch_flow, bf16, per-tensor fp8 and block-scaled fp8 (fp8_block, its
quantization not separated: quantize_ms 0)) at the fprop and dgrad shapes of
a Llama-3.1-8B and -70B layer (M 4096/8192/16384 tokens, tp 1-8; grid points only), with the fp8
rows' activation quantization (compute_scale + scale_matrix at the same m, k) beside them;
the fp8 cast (scale_matrix) at m, k in 4096-16384; and bf16 context attention at 8K, head dim
128, GQA 4:1, batch 1-2 (the fastest of TRT-LLM, vLLM 0.24.0 and SGLang 0.5.14 kernels); and
(context_attention_head_dim.csv) the same kernels at 8K, GQA 8:1, batch 1-2, head dim 64, 128
and 256 on h100_sxm, h200_sxm, b200_sxm, gb200 and l40s (the head-dim dependence of the flash share).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

GPUS = ("h100_sxm", "b200_sxm")
ATTENTION_FRAMEWORKS = {
    "h100_sxm": ("trtllm/1.3.0rc20", "vllm/0.24.0", "sglang/0.5.14"),
    "h200_sxm": ("trtllm/1.3.0rc20", "vllm/0.24.0", "sglang/0.5.14"),
    "b200_sxm": ("trtllm/1.3.0rc20", "vllm/0.24.0", "sglang/0.5.14"),
    "gb200": ("trtllm/1.3.0rc20", "vllm/0.24.0", "sglang/0.5.14"),
    "l40s": ("trtllm/1.3.0rc20", "vllm/0.24.0", "sglang/0.5.14"),
    "a100_sxm": ("trtllm/1.0.0", "vllm/0.14.0", "sglang/0.5.10"),
}
HEAD_DIM_GPUS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s")
NEWEST = ("trtllm/1.3.0rc20", "vllm/0.24.0", "sglang/0.5.14")


def context_attention(root: Path, gpu: str, frameworks: tuple[str, ...], gqa: int,
                      head_dims: tuple[int, ...]) -> pd.DataFrame:
    """The fastest bf16 full-attention kernel per (batch, heads, head dim) at 8K, batch 1-2."""
    tables = []
    for framework in frameworks:
        att = pd.read_parquet(root / gpu / "attention" / framework / "context_attention_perf.parquet")
        window = att.window_size if "window_size" in att else 0  # older tables: full attention only
        att = att[(att.isl == 8192) & att.head_dim.isin(head_dims) & (att.attn_dtype == "bfloat16")
                  & (att.kv_cache_dtype == "bfloat16") & (window == 0) & (att.batch_size <= 2)
                  & (att.num_heads == gqa * att.num_key_value_heads) & att.num_heads.isin([8, 16, 32, 64])]
        tables.append(att)
    att = pd.concat(tables)
    keys = ["batch_size", "isl", "num_heads", "num_key_value_heads"] + (["head_dim"] if len(head_dims) > 1 else [])
    att = att.groupby(keys).latency.min().reset_index()
    att.insert(0, "gpu", gpu)
    return att
GRID = {512, 768, 1024, 1536, 2048, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384}
TOKENS = (4096, 8192, 16384)


def layer_shapes() -> set[tuple[int, int, int]]:
    """(m, n, k) of QKV, output projection, MLP up (gated) and down, fprop and dgrad."""
    shapes = set()
    for h, f, qkv in ((4096, 14336, 6144), (8192, 28672, 10240)):
        for t in (1, 2, 4, 8):
            for n, k in ((qkv // t, h), (h, h // t), (2 * f // t, h), (h, f // t)):
                for m in TOKENS:
                    shapes |= {(m, n, k), (m, k, n)}
    return {s for s in shapes if s[1] in GRID and s[2] in GRID}


def main(root: Path, out: Path) -> None:
    gemms, casts, attention = [], [], []
    for gpu in GPUS:
        base = root / gpu
        gemm = pd.read_parquet(base / "gemm/trtllm/1.3.0rc20/gemm_perf.parquet")
        gemm = gemm[(gemm.kernel_source == "torch_flow") & gemm.gemm_dtype.isin(["bfloat16", "fp8", "fp8_block"])]
        shapes = layer_shapes()
        gemm = gemm[[s in shapes for s in zip(gemm.m, gemm.n, gemm.k, strict=True)]]
        scale = pd.read_parquet(base / "quantize/trtllm/1.3.0rc20/computescale_perf.parquet")
        cast = pd.read_parquet(base / "quantize/trtllm/1.3.0rc20/scale_matrix_perf.parquet")
        quant = scale.merge(cast, on=["m", "k"], suffixes=("_scale", "_cast"))
        quant["quantize_ms"] = quant.latency_scale + quant.latency_cast
        gemm = gemm.merge(quant[["m", "k", "quantize_ms"]], on=["m", "k"], how="left")
        gemm.loc[gemm.gemm_dtype != "fp8", "quantize_ms"] = 0.0
        gemm["gpu"] = gpu
        gemms.append(gemm[["gpu", "gemm_dtype", "m", "n", "k", "latency", "quantize_ms"]])
        sized = cast[cast.m.isin(TOKENS) & cast.k.isin([4096, 8192, 16384])].copy()
        sized["gpu"] = gpu
        casts.append(sized[["gpu", "m", "k", "latency"]])
    for gpu, frameworks in ATTENTION_FRAMEWORKS.items():
        attention.append(context_attention(root, gpu, frameworks, 4, (128,)))
    by_head_dim = pd.concat([context_attention(root, gpu, NEWEST, 8, (64, 128, 256)) for gpu in HEAD_DIM_GPUS])
    by_head_dim.rename(columns={"latency": "latency_ms"}).sort_values(
        ["gpu", "head_dim", "batch_size", "num_heads"]).to_csv(out / "context_attention_head_dim.csv", index=False)
    gemm = pd.concat(gemms).sort_values(["gpu", "gemm_dtype", "m", "n", "k"])
    gemm.rename(columns={"latency": "latency_ms"}).to_csv(out / "training_gemm.csv", index=False)
    cast = pd.concat(casts).sort_values(["gpu", "m", "k"]).rename(columns={"latency": "latency_ms"})
    cast.to_csv(out / "training_fp8_cast.csv", index=False)
    att = pd.concat(attention).groupby(["gpu", "batch_size", "isl", "num_heads", "num_key_value_heads"])
    att.latency.min().reset_index().rename(columns={"latency": "latency_ms"}).to_csv(
        out / "training_context_attention.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
