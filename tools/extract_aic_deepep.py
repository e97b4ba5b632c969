"""Extract AIConfigurator's measured DeepEP dispatch and combine times across nodes, the data the
planner's DeepEP all-to-all pricing is scored on (bench/moe_calibration.py, "DeepEP across nodes").

    python tools/extract_aic_deepep.py /path/to/aiconfigurator_core/systems/data OUT.csv

Needs pandas + pyarrow (not a planner dependency). Reads, for h100_sxm and h200_sxm, SGLang
0.5.6.post2's wideep collection (comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet and
wideep_deepep_normal_perf.parquet: DeepSeek-V3's h 7168, e 8, E 256 and 288, over 1, 2, 4 and 8
nodes of 8 GPUs, one rank's num_token tokens). Low-latency rows as they are (dispatch and combine
average time); normal-mode rows at DeepEP's default 20 SMs (what vLLM's DeepEPHTAll2AllManager
sets, vllm/distributed/device_communicators/all2all.py at 0.33.0), transmit plus notify time.
Writes one row per (gpu, mode, phase, nodes, experts, tokens): the fastest of repeated points.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

VERSION = "0.5.6.post2"
GPUS = ("h100_sxm", "h200_sxm")
NORMAL_SMS = 20


def rows(data: Path) -> pd.DataFrame:
    out = []
    for gpu in GPUS:
        folder = data / gpu / "comm" / "sglang" / VERSION
        ll = pd.read_parquet(folder / "wideep_deepep_ll_perf.parquet")
        for phase in ("dispatch", "combine"):
            out.append(pd.DataFrame({
                "gpu": gpu, "mode": "low_latency", "phase": phase, "nodes": ll.node_num, "hidden_size": ll.hidden_size,
                "topk": ll.num_topk, "num_experts": ll.num_experts, "num_tokens": ll.num_token,
                "latency_us": ll[f"{phase}_avg_t_us"]}))
        normal = pd.read_parquet(folder / "wideep_deepep_normal_perf.parquet")
        for phase in ("dispatch", "combine"):
            kept = normal[normal[f"{phase}_sms"] == NORMAL_SMS]
            out.append(pd.DataFrame({
                "gpu": gpu, "mode": "normal", "phase": phase, "nodes": kept.node_num, "hidden_size": kept.hidden_size,
                "topk": kept.num_topk, "num_experts": kept.num_experts, "num_tokens": kept.num_token,
                "latency_us": kept[f"{phase}_transmit_us"] + kept[f"{phase}_notify_us"]}))
    frame = pd.concat(out, ignore_index=True)
    keys = ["gpu", "mode", "phase", "nodes", "hidden_size", "topk", "num_experts", "num_tokens"]
    return frame.groupby(keys, as_index=False)["latency_us"].min().sort_values(keys)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    frame = rows(Path(sys.argv[1]))
    frame.to_csv(sys.argv[2], index=False, float_format="%.4f")
    print(f"{len(frame)} rows -> {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
