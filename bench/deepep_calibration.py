"""DeepEP calibration: the planner's DeepEP dispatch and combine (serving, --all2all-backend
deepep_low_latency / deepep_high_throughput) against AIConfigurator's measured DeepEP kernels,
one node to eight.

    python bench/deepep_calibration.py           # the fitted constants and the error tables
    python bench/deepep_calibration.py --json    # the same as JSON

Data: tests/fixtures/aiconfigurator_silicon/sglang_deepep_multinode.csv, written by
tools/extract_aic_deepep.py from aiconfigurator-core 0.12.0's SGLang 0.5.6.post2 wideep
collection on H200 (its H100 files hold the same numbers and are left out): DeepSeek-V3's
h 7168, e 8, E 256 and 288, EP over 1, 2, 4 and 8 nodes of 8 GPUs, num_tokens per rank;
low-latency rows (dispatch in fp8, combine in bf16) and normal-mode rows at 20 SMs, dispatch
in fp8 (the transmit and notify phases summed).

The pricing (planner/cost/comm.deepep_seconds on moe.deepep_traffic) is
    T = F(mode, nodes) + max(NVLink bytes / (B_nvl u_nvl), RDMA bytes / (B_nic u_rdma)),
    F(mode, nodes) = a_mode + b_mode log2(nodes),
and its six constants are fitted here, in this order, each on the rows where it shows:
- a, b per mode: least squares of the per-node-count floor, the median of the rows of at most
  FLOOR_MAX_TOKENS tokens (where the bytes take under a microsecond);
- u_nvl: the median over the one-node rows where the bytes dominate (low latency >= 64 tokens,
  normal >= BANDWIDTH_MIN_TOKENS_NORMAL) of NVLink bytes / (B_nvl (T - F));
- u_rdma: the same over the rows of 2, 4 and 8 nodes with RDMA bytes and B_nic.
B_nvl, B_nic: the 1x8xH200 / Nx8xH200 profile's NVLink and per-GPU NIC bandwidth. Every row is
one call, as a vLLM step is (its budget, 256 tokens by default under the low-latency backend,
sizes DeepEP's buffers). Importable; no I/O in the scoring functions. Not part of the planner.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner import units  # noqa: E402
from planner.catalog import cluster_from_shorthand, resolve_model  # noqa: E402
from planner.cost import efficiency as eff  # noqa: E402
from planner.cost.moe import deepep_traffic  # noqa: E402
from planner.cost.serving_time import ep_exchange_ops  # noqa: E402
from planner.layout import Layout, place  # noqa: E402
from planner.specs import ModelSpec  # noqa: E402

FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/sglang_deepep_multinode.csv"
GPU = "H200-SXM-141GB"
GPUS_PER_NODE = 8
FLOOR_MAX_TOKENS = 4
BANDWIDTH_MIN_TOKENS_LL = 64
BANDWIDTH_MIN_TOKENS_NORMAL = 1024
BACKEND = {"low_latency": "deepep_low_latency", "normal": "deepep_high_throughput"}


@dataclass(frozen=True)
class Row:
    mode: str
    """low_latency | normal"""
    phase: str
    nodes: int
    num_experts: int
    num_tokens: int
    measured_seconds: float

    @property
    def backend(self) -> str:
        return BACKEND[self.mode]


def load_rows(path: Path = FIXTURE) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [Row(r["mode"], r["phase"], int(r["nodes"]), int(r["num_experts"]), int(r["num_tokens"]),
                    units.us_to_seconds(float(r["latency_us"])))
                for r in csv.DictReader(handle) if r["gpu"] == "h200_sxm"]


def model_for(row: Row) -> ModelSpec:
    """DeepSeek-V3 (fp8 experts: fp8 dispatch) with the row's expert count, its tokens routed
    uniformly over all of them (the collector's random routing, not the model's group-limited
    one)."""
    return resolve_model("deepseek-v3").model_copy(update={"num_local_experts": row.num_experts,
                                                           "num_expert_groups": None,
                                                           "expert_groups_per_token": None})


def traffic(row: Row) -> tuple[float, float]:
    layout = Layout(1, 1, row.nodes * GPUS_PER_NODE, row.nodes * GPUS_PER_NODE)
    return deepep_traffic(model_for(row), layout, row.num_tokens, row.backend, row.phase, GPUS_PER_NODE, row.nodes)


def link_bandwidths() -> tuple[float, float]:
    """(NVLink, one GPU's NIC share) of the Nx8xH200 profile, bytes/s."""
    placement = place(cluster_from_shorthand(2, GPUS_PER_NODE, GPU, f"2x8x{GPU}"), Layout(1, 1, 16, 16))
    group = placement.ep_group
    return group.intra.bandwidth_bytes_per_s, group.inter.bandwidth_bytes_per_s


def floor_by_nodes(rows: list[Row], mode: str) -> dict[int, float]:
    """Per node count: the median of the mode's rows of at most FLOOR_MAX_TOKENS tokens."""
    return {n: statistics.median(r.measured_seconds for r in rows
                                 if r.mode == mode and r.nodes == n and r.num_tokens <= FLOOR_MAX_TOKENS)
            for n in sorted({r.nodes for r in rows if r.mode == mode})}


def fit_floor(rows: list[Row], mode: str) -> tuple[float, float]:
    """(a, b) of F = a + b log2(nodes), least squares over floor_by_nodes."""
    points = [(math.log2(n), f) for n, f in floor_by_nodes(rows, mode).items()]
    mx = statistics.mean(x for x, _ in points)
    my = statistics.mean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def bandwidth_rows(rows: list[Row], inter: bool) -> list[Row]:
    return [r for r in rows if (r.nodes > 1) == inter
            and r.num_tokens >= (BANDWIDTH_MIN_TOKENS_LL if r.mode == "low_latency" else BANDWIDTH_MIN_TOKENS_NORMAL)]


def fit_utilization(rows: list[Row], inter: bool, floors: dict[str, tuple[float, float]]) -> float:
    """u_nvl (inter False) or u_rdma (True): median of bytes / (bandwidth (T - F))."""
    nvlink, nic = link_bandwidths()
    shares = []
    for r in bandwidth_rows(rows, inter):
        a, b = floors[r.mode]
        busy = r.measured_seconds - (a + b * math.log2(r.nodes))
        nvl_bytes, rdma_bytes = traffic(r)
        shares.append((rdma_bytes / nic if inter else nvl_bytes / nvlink) / busy)
    return statistics.median(shares)


def fit(rows: list[Row]) -> dict[str, float]:
    floors = {mode: fit_floor(rows, mode) for mode in BACKEND}
    return {"ll_fixed_seconds": floors["low_latency"][0], "ll_fixed_seconds_per_doubling": floors["low_latency"][1],
            "ht_fixed_seconds": floors["normal"][0], "ht_fixed_seconds_per_doubling": floors["normal"][1],
            "nvlink_utilization": fit_utilization(rows, False, floors),
            "rdma_utilization": fit_utilization(rows, True, floors)}


def predict_seconds(row: Row) -> float:
    """The planner's price of the row: serving_time.ep_exchange_ops on nodes x 8 H200, tp 1,
    dp = ep = 8 x nodes (DeepEP moves each rank's own tokens), the row's phase."""
    ep = row.nodes * GPUS_PER_NODE
    cluster = cluster_from_shorthand(row.nodes, GPUS_PER_NODE, GPU, f"{row.nodes}x{GPUS_PER_NODE}x{GPU}")
    layout = Layout(1, 1, ep, ep)
    ops = ep_exchange_ops(model_for(row), cluster, layout, place(cluster, layout), row.num_tokens,
                          backend=row.backend)
    name = "MoE dispatch" if row.phase == "dispatch" else "MoE combine"
    op = next(o for o in ops if o.name == name)
    return op.seconds * op.count_per_step


def summary(errors: list[float]) -> dict:
    magnitudes = [abs(e) for e in errors]
    return {"rows": len(errors), "median_abs": statistics.median(magnitudes), "max_abs": max(magnitudes),
            "median_signed": statistics.median(errors)}


def score(rows: list[Row]) -> dict[str, dict]:
    """Error = predicted / measured - 1 by (mode, phase, nodes), by mode and over all rows."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        error = predict_seconds(r) / r.measured_seconds - 1
        for key in (f"{r.mode} {r.phase} {r.nodes} node(s)", f"{r.mode}", "all"):
            groups.setdefault(key, []).append(error)
    return {key: summary(errors) for key, errors in sorted(groups.items())}


def catalog() -> dict[str, float]:
    """The constants the planner uses (efficiency.py)."""
    return {"ll_fixed_seconds": eff.DEEPEP_FIXED_SECONDS["deepep_low_latency"][0],
            "ll_fixed_seconds_per_doubling": eff.DEEPEP_FIXED_SECONDS["deepep_low_latency"][1],
            "ht_fixed_seconds": eff.DEEPEP_FIXED_SECONDS["deepep_high_throughput"][0],
            "ht_fixed_seconds_per_doubling": eff.DEEPEP_FIXED_SECONDS["deepep_high_throughput"][1],
            "nvlink_utilization": eff.DEEPEP_NVLINK_UTILIZATION, "rdma_utilization": eff.DEEPEP_RDMA_UTILIZATION}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = load_rows()
    fitted, used, scores = fit(rows), catalog(), score(rows)
    if args.json:
        print(json.dumps({"fitted": fitted, "catalog": used, "scores": scores}, indent=2))
        return 0
    print("DeepEP constants: fitted here / in planner/cost/efficiency.py")
    for key, value in fitted.items():
        scale, unit = (1e6, "us") if "seconds" in key else (1.0, "")
        print(f"  {key:32} {value * scale:8.3f} {unit:3} {used[key] * scale:8.3f} {unit}")
    print("\nfloor per node count (median of rows <= "
          f"{FLOOR_MAX_TOKENS} tokens, us): " + "; ".join(
              f"{mode} " + ", ".join(f"{n}: {units.seconds_to_us(s):.1f}" for n, s in floor_by_nodes(rows, mode).items())
              for mode in BACKEND))
    print(f"\n{'group':34} {'rows':>5} {'|err| med':>10} {'max':>8} {'signed':>8}")
    for key, v in scores.items():
        print(f"{key:34} {v['rows']:5d} {v['median_abs']:10.0%} {v['max_abs']:8.0%} {v['median_signed']:+8.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
