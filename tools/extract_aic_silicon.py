"""Extract the serving calibration set from AIConfigurator's measured runs.

    python tools/extract_aic_silicon.py /path/to/aiconfigurator_core/systems/silicon_sample.csv

Reads `systems/silicon_sample.csv` of the PyPI package aiconfigurator-core 0.12.0 (NVIDIA's
serving runs measured on real GPUs) and writes tests/fixtures/aiconfigurator_silicon/vllm_agg.csv:
the rows with backend == vllm and mode == agg whose (model_path, precision) maps to a shipped
model spec and whose system to a catalog GPU, with one replica that the planner can express
(pp == 1, no attention data parallelism; for MoE models moe_tp == tp and moe_ep == 1, or for
EP_SPECS moe_ep == tp: the experts spread over the TP group). Two columns are added, the
planner's names for the model (`spec`) and the GPU (`gpu`); the mapping's only home is here.
Standard library only: the project does not depend on pandas.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "tests/fixtures/aiconfigurator_silicon/vllm_agg.csv"

SPECS = {
    ("Qwen/Qwen3-32B", ""): "qwen3-32b",  # empty precision: the bf16 checkpoint as shipped
    ("meta-llama/Llama-3.1-70B", "fp8"): "llama-3.1-70b-fp8",
    ("meta-llama/Llama-3.1-70B", "fp4"): "llama-3.1-70b-nvfp4",
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8"): "llama-3.1-8b-fp8",
    # AIConfigurator labels gpt-oss's MoE weights nvfp4; vLLM serves the MXFP4 checkpoint.
    ("openai/gpt-oss-120b", "fp4"): "gpt-oss-120b",
    ("Qwen/Qwen3-235B-A22B-FP8", "fp8"): "qwen3-235b-a22b-fp8",
    ("MiniMaxAI/MiniMax-M2.5", "fp8"): "minimax-m2.5",
    ("MiniMaxAI/MiniMax-M2.5", "fp4"): "minimax-m2.5-nvfp4",  # served from nvidia/MiniMax-M2.5-NVFP4
    ("moonshotai/Kimi-K2.5", "int4"): "kimi-k2.5",
    ("moonshotai/Kimi-K2.5", "fp4"): "kimi-k2.5-nvfp4",  # served from nvidia/Kimi-K2.5-NVFP4
}
"""(model_path, precision) -> shipped model spec. Not mapped: Qwen3-32B at fp8 (vLLM quantizing
the bf16 checkpoint online, 3 rows)."""
SPEC_SYSTEMS = {"minimax-m2.5": {"h200_sxm", "h100_sxm"}, "kimi-k2.5-nvfp4": {"b200_sxm"},
                "minimax-m2.5-nvfp4": {"b200_sxm"}}
"""Specs mapped on some systems only. MiniMax-M2.5 fp8 on B200: InferenceX's script changed its
server settings between the 0.17.0 and 0.19.0 runs (benchmarks/single_node/minimaxm2.5_fp8_b200.sh
at 0f78cf4eb and bddbf4031: the fp8 KV cache, a 2 x ISL token budget, --stream-interval 20, the
MoE kernel), which the calibration does not carry yet."""
GPUS = {"h100_sxm": "H100-SXM5-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB"}
"""AIConfigurator system -> catalog GPU (planner/data/gpus.yaml)."""
HOPPER = {"h100_sxm", "h200_sxm"}
MOE_SPECS = {"gpt-oss-120b", "qwen3-235b-a22b-fp8", "minimax-m2.5", "minimax-m2.5-nvfp4", "kimi-k2.5",
             "kimi-k2.5-nvfp4"}
"""The mapped specs with experts: only for them do moe_tp_size and moe_ep_size mean anything."""
KEPT = ("id", "silicon_data_source", "backend_version", "model_path", "system", "precision",
        "isl", "osl", "batch_size", "tp_size", "pp_size", "moe_tp_size", "moe_ep_size",
        "silicon_ttft_ms", "silicon_tpot_ms")
"""Source columns copied unchanged (batch_size is the benchmark's concurrency)."""


EP_SPECS = {"minimax-m2.5", "kimi-k2.5-nvfp4"}
"""Specs whose expert-parallel rows (moe_ep = tp, attention TP) are kept: MiniMax-M2.5 on H100
(15 rows, vLLM 0.18.0, minimaxm2.5_fp8_h100.sh at 1d5cae141, its runs begun 3 s after that
commit); Kimi-K2.5 NVFP4 on B200, whose rows say ep 4 but whose script never passed
--enable-expert-parallel (bench/serving_calibration.py Run.layout_ep). Not yet: Qwen3-235B's 6
(AIConfigurator's harness), MiniMax-M2.5 on B200 (above)."""
DEDUPLICATED = {"MiniMaxAI/MiniMax-M2.5", "moonshotai/Kimi-K2.5"}  # INT4 and NVFP4
"""Models whose runs recur in several dumps (source_file=2026-03-25.csv, 2026-04-06.csv,
kimi-k2.5-gap-analysis.csv and AIConfigurator's db-dump/2026-04-27 repeat one measurement with the same lengths, concurrency,
degrees and measured means): each is kept once. The rows of the earlier models stay as extracted."""


def repeat_key(row: dict[str, str]) -> tuple[str, ...]:
    """What makes two rows the same measurement: the run's settings and its measured means."""
    settings = tuple(row[key] for key in ("model_path", "precision", "system", "backend_version", "isl", "osl",
                                          "batch_size", "tp_size", "moe_tp_size", "moe_ep_size"))
    # the dumps print the same mean with different digits (one rounds to 0.01 ms)
    return settings + tuple(f"{float(row[key]):.2f}" for key in ("silicon_ttft_ms", "silicon_tpot_ms"))


def degree(value: str) -> int:
    """'2.0' -> 2; an empty cell (the column does not apply) -> 1."""
    return int(float(value)) if value else 1


def planner_names(row: dict[str, str]) -> tuple[str, str] | None:
    """(spec, gpu) for a row the planner can express, else None."""
    if row["backend"] != "vllm" or row["mode"] != "agg":
        return None
    spec = SPECS.get((row["model_path"], row["precision"]))
    gpu = GPUS.get(row["system"])
    if spec is None or gpu is None:
        return None
    if spec == "llama-3.1-70b-nvfp4" and row["system"] in HOPPER:
        return None  # Hopper has no fp4 tensor cores
    if spec in SPEC_SYSTEMS and row["system"] not in SPEC_SYSTEMS[spec]:
        return None
    tp = degree(row["tp_size"])
    if (degree(row["pp_size"]), degree(row["attention_dp_size"])) != (1, 1):
        return None
    moe_degrees = (degree(row["moe_tp_size"]), degree(row["moe_ep_size"]))
    if spec in MOE_SPECS and moe_degrees not in ((tp, 1), (1, tp)):
        return None  # experts TP-split, or spread over the TP group (--enable-expert-parallel, no DP)
    if moe_degrees == (1, tp) and tp > 1 and spec not in EP_SPECS:
        return None
    return spec, gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="aiconfigurator_core/systems/silicon_sample.csv")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    with args.source.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    kept = []
    seen = set()
    for row in rows:
        names = planner_names(row)
        if names is None:
            continue
        if row["model_path"] in DEDUPLICATED and repeat_key(row) in seen:
            continue  # one measurement in two dumps
        seen.add(repeat_key(row))
        kept.append({**{key: row[key] for key in KEPT}, "spec": names[0], "gpu": names[1]})
    with args.output.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*KEPT, "spec", "gpu"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
    print(f"{len(kept)} of {len(rows)} rows -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
