"""MoE calibration: the planner's expert GEMMs, expert-load imbalance and all-to-all against
AIConfigurator's measured vLLM kernels on H200.

    python bench/moe_calibration.py            # the three tables on stdout
    python bench/moe_calibration.py --verbose  # also one line per scored row
    python bench/moe_calibration.py --json     # the summaries as JSON

Sets (aiconfigurator-core 0.12.0, systems/data/h200_sxm, vLLM 0.24.0; docs/cost-model.md,
"Expert parallelism: calibration"):
- tests/fixtures/aiconfigurator_silicon/vllm_moe_h200.csv: 297 rows of moe/vllm/0.24.0/
  moe_perf.parquet, the fused MoE op's latency (ms) on one GPU. Shapes of qwen3-235b-a22b
  (h 4096, f 1536, E 128, e 8), qwen3-30b-a3b (2048/768/128/8) and mixtral-8x7b
  (4096/14336/8/2) with the bf16 Triton kernel (kernel_source
  vllm_unquantizedfusedmoe_triton_tritonexperts) and the per-tensor fp8 one
  (vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts); deepseek-v3 (7168/2048/256/8)
  only with the block-fp8 CUTLASS kernel (vllm_fp8moe_flashinfer_cutlass_flashinferexperts),
  at EP 8. num_tokens 1, 4, 16, 64, 256, 1024, 4096, 8192, 16384; (moe_tp, moe_ep) (1, 1)
  and (8, 1) balanced, (1, 8) (mixtral fp8: (1, 4), the largest measured) under the three
  routing distributions balanced, power_law_1.01, power_law_1.2.
- tests/fixtures/aiconfigurator_silicon/vllm_deepep_a2a_h200.csv: 108 rows of comm/vllm/
  0.24.0/moe_a2a_perf.parquet, DeepEP dispatch and combine (us), EP 8 in one node, h 7168
  and 3072, e 8, E 256, both backends (deepep_ll: low latency, 1-256 tokens; deepep_ht:
  normal mode, 20 SMs, 16-65536 tokens).

Conventions: a moe row's num_tokens are the tokens the EP group routes (AIC's collector
routes them over all E experts and times the rank holding E/ep of them), so the replica of
the planner's Layout(tp=1, dp=ep, ep=ep) carries num_tokens/ep; an a2a row's num_tokens are
one rank's. Errors are predicted / measured - 1. Importable; no I/O in the scoring functions.
Not part of the planner.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner import units  # noqa: E402
from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.cost import efficiency as eff  # noqa: E402
from planner.cost.comm import effective_group, group_alltoall_seconds  # noqa: E402
from planner.cost.serving_time import (  # noqa: E402
    ep_foreign_pair_bytes,
    ep_foreign_pair_seconds,
    moe_layer_gemm_seconds,
)
from planner.layout import GroupTopology, Layout, intra_node_link  # noqa: E402
from planner.specs import ClusterSpec, ModelSpec  # noqa: E402

FIXTURES = REPO / "tests/fixtures/aiconfigurator_silicon"
MOE_FIXTURE = FIXTURES / "vllm_moe_h200.csv"
A2A_FIXTURE = FIXTURES / "vllm_deepep_a2a_h200.csv"
CLUSTER = "1x8xH200"
DECODE_MAX_TOKENS = 256
"""Rows of at most this many tokens are decode-sized, of at least PREFILL_MIN_TOKENS prefill-sized."""
PREFILL_MIN_TOKENS = 1024
IMBALANCE_MIN_TOKENS = 4096
"""The imbalance is read where the op is compute-bound: every expert is touched and the
busiest GPU's extra rows cost FLOPs, not weight reads."""
POWER_LAWS = ("power_law_1.01", "power_law_1.2")
IMBALANCE_SPECS = ("qwen3-235b-a22b", "qwen3-30b-a3b")
"""Fine-grained MoE (16 experts per GPU at EP 8): mixtral-8x7b's one expert per GPU is the
extreme case, deepseek-v3 is only measured with a block-fp8 kernel whose power-law rows run
faster than its balanced ones."""
IMBALANCE_DISTRIBUTION = "power_law_1.2"
"""AIConfigurator's default routing for its MoE searches: workload_distribution "power_law"
(sdk/config.py) with alpha 1.2 for the generic MoE family (sdk/models/moe.py; 1.01 for
DeepSeek, sdk/models/deepseek.py)."""
A2A_BYTES_PER_ELEMENT = 2
"""bf16 activations: dispatch at 1.2-1.4x the combine's speed, not 2x, says both move 16 bits."""
A2A_FLOOR_MAX_TOKENS = 32


@dataclass(frozen=True)
class MoeRow:
    spec: str
    moe_dtype: str
    num_tokens: int
    moe_tp: int
    moe_ep: int
    distribution: str
    measured_seconds: float

    @property
    def regime(self) -> str:
        if self.num_tokens <= DECODE_MAX_TOKENS:
            return "decode"
        return "prefill" if self.num_tokens >= PREFILL_MIN_TOKENS else "between"


@dataclass(frozen=True)
class A2aRow:
    backend: str
    phase: str
    ep: int
    hidden_size: int
    topk: int
    num_experts: int
    num_tokens: int
    measured_seconds: float


def load_moe_rows(path: Path = MOE_FIXTURE) -> list[MoeRow]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [MoeRow(r["spec"], r["moe_dtype"], int(r["num_tokens"]), int(r["moe_tp_size"]),
                       int(r["moe_ep_size"]), r["distribution"], units.ms_to_seconds(float(r["latency_ms"])))
                for r in csv.DictReader(handle)]


def load_a2a_rows(path: Path = A2A_FIXTURE) -> list[A2aRow]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [A2aRow(r["comm_backend"], r["phase"], int(r["ep_size"]), int(r["hidden_size"]), int(r["topk"]),
                       int(r["num_experts"]), int(r["num_tokens"]), units.us_to_seconds(float(r["latency_us"])))
                for r in csv.DictReader(handle)]


@functools.cache
def cluster() -> ClusterSpec:
    return resolve_cluster(CLUSTER)


@functools.cache
def model_of(spec: str, moe_dtype: str) -> ModelSpec:
    """The shipped spec at the row's weight dtype: bf16 unquantized, fp8 and fp8_block W8A8."""
    quantization = None if moe_dtype == "bfloat16" else "fp8"
    return resolve_model(spec).model_copy(update={"quantization": quantization})


def row_layout(row: MoeRow) -> tuple[Layout, float]:
    """The planner's layout for a row and its replica's tokens (module docstring)."""
    if row.moe_ep > 1:
        return Layout(tp=row.moe_tp, pp=1, dp=row.moe_ep // row.moe_tp, ep=row.moe_ep), row.num_tokens * row.moe_tp / row.moe_ep
    return Layout(tp=row.moe_tp, pp=1, dp=1), float(row.num_tokens)


def predict_moe_seconds(row: MoeRow, imbalance: float = 1.0) -> float:
    """The planner's op time under the collector's routing: a balanced row touches min(E, N e)
    of the E experts (bench/moe_kernel_calibration.py), a power-law row the uniform expectation."""
    layout, tokens = row_layout(row)
    model = model_of(row.spec, row.moe_dtype)
    touched = (min(model.num_local_experts, row.num_tokens * model.num_experts_per_tok)
               if row.distribution == "balanced" else None)
    return moe_layer_gemm_seconds(model, cluster(), layout, tokens, imbalance, touched)


def summary(errors: list[float]) -> dict:
    magnitudes = [abs(e) for e in errors]
    return {"rows": len(errors), "median_abs": statistics.median(magnitudes), "max_abs": max(magnitudes),
            "median_signed": statistics.median(errors)}


def layout_kind(row: MoeRow) -> str:
    """tp1: one GPU holds every expert; tp8: every expert split 8 ways; ep: whole experts."""
    return "ep" if row.moe_ep > 1 else f"tp{row.moe_tp}"


def score_gemms(rows: list[MoeRow]) -> dict[str, dict]:
    """Balanced rows: the expert GEMM model's error by (dtype, layout kind, regime), by
    (dtype, regime) and per regime over every dtype."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if row.distribution != "balanced" or row.regime == "between":
            continue
        error = predict_moe_seconds(row) / row.measured_seconds - 1
        for key in (f"{row.moe_dtype} {layout_kind(row)} {row.regime}", f"{row.moe_dtype} {row.regime}",
                    f"all {row.regime}"):
            groups.setdefault(key, []).append(error)
    return {key: summary(errors) for key, errors in sorted(groups.items())}


def imbalance_ratios(rows: list[MoeRow]) -> dict[tuple[str, str, int, str], float]:
    """Median over num_tokens >= IMBALANCE_MIN_TOKENS of latency(power law) / latency(balanced),
    per (spec, dtype, ep, distribution), EP rows only: the busiest GPU's work over the mean."""
    balanced = {(r.spec, r.moe_dtype, r.moe_ep, r.num_tokens): r.measured_seconds
                for r in rows if r.distribution == "balanced" and r.moe_ep > 1}
    ratios: dict[tuple[str, str, int, str], list[float]] = {}
    for r in rows:
        if r.distribution in POWER_LAWS and r.moe_ep > 1 and r.num_tokens >= IMBALANCE_MIN_TOKENS:
            key = (r.spec, r.moe_dtype, r.moe_ep, r.distribution)
            ratios.setdefault(key, []).append(r.measured_seconds / balanced[key[:3] + (r.num_tokens,)])
    return {key: statistics.median(values) for key, values in sorted(ratios.items())}


def ep_group(ep: int) -> GroupTopology:
    """ep GPUs of the profile's node, links at NCCL's derated bus bandwidth (comm.effective_group)."""
    return effective_group(GroupTopology(ep, ep, 1, intra_node_link(cluster()), None))


def a2a_message_bytes(row: A2aRow) -> float:
    """S of the planner (moe.ep_alltoall_message_bytes): tokens * e * h * 2 (bf16)."""
    return row.num_tokens * row.topk * row.hidden_size * A2A_BYTES_PER_ELEMENT


def predict_a2a_seconds(row: A2aRow, fixed_seconds: float = 0.0) -> float:
    """comm.group_alltoall_seconds at S, plus `fixed_seconds` per all-to-all."""
    return group_alltoall_seconds(a2a_message_bytes(row), ep_group(row.ep)) + fixed_seconds


def score_a2a(rows: list[A2aRow], fixed_seconds: float = 0.0) -> dict[str, dict]:
    """Error by backend and phase, and by backend over the small (<= 256 tokens: latency)
    and large (>= 4096: bandwidth) messages."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        error = predict_a2a_seconds(row, fixed_seconds) / row.measured_seconds - 1
        keys = [f"{row.backend} {row.phase}"]
        if row.num_tokens <= DECODE_MAX_TOKENS:
            keys.append(f"{row.backend} <= {DECODE_MAX_TOKENS} tokens")
        if row.num_tokens >= IMBALANCE_MIN_TOKENS:
            keys.append(f"{row.backend} >= {IMBALANCE_MIN_TOKENS} tokens")
        for key in keys:
            groups.setdefault(key, []).append(error)
    return {key: summary(errors) for key, errors in sorted(groups.items())}


EP_FIT_MIN_TOKENS = 1024
"""EP rows from this size fit the foreign-pair traffic share (below it the op's floor and the
weight read hide it)."""


def fit_ep_foreign_pair_utilization(rows: list[MoeRow]) -> float:
    """EP_FOREIGN_PAIR_HBM_UTILIZATION: the median over the bf16 balanced EP rows of at least
    EP_FIT_MIN_TOKENS tokens of ep_foreign_pair_bytes / (HBM bandwidth * (measured - the op
    without that traffic))."""
    implied = []
    for row in rows:
        if row.distribution != "balanced" or row.moe_ep <= 1 or row.moe_dtype != "bfloat16" \
                or row.num_tokens < EP_FIT_MIN_TOKENS:
            continue
        layout, tokens = row_layout(row)
        model, m = model_of(row.spec, row.moe_dtype), max(1, round(tokens))
        without = predict_moe_seconds(row) - ep_foreign_pair_seconds(model, cluster(), layout, m)
        implied.append(ep_foreign_pair_bytes(model, layout, m)
                       / (cluster().gpu.hbm_bytes_per_s * (row.measured_seconds - without)))
    return statistics.median(implied)


def fit_alltoall_fixed_seconds(rows: list[A2aRow]) -> float:
    """The fixed cost the alpha-beta model misses: the median over DeepEP's low-latency rows of
    at most A2A_FLOOR_MAX_TOKENS tokens (where the bytes are negligible) of measured minus
    comm.group_alltoall_seconds."""
    return statistics.median(r.measured_seconds - predict_a2a_seconds(r) for r in rows
                             if r.backend == "deepep_ll" and r.num_tokens <= A2A_FLOOR_MAX_TOKENS)


def fit_expert_load_imbalance(rows: list[MoeRow]) -> float:
    """The median of IMBALANCE_SPECS' bf16 ratios under IMBALANCE_DISTRIBUTION (imbalance_ratios)."""
    ratios = imbalance_ratios(rows)
    return statistics.median(v for (spec, dtype, _, dist), v in ratios.items()
                             if spec in IMBALANCE_SPECS and dtype == "bfloat16" and dist == IMBALANCE_DISTRIBUTION)


def a2a_floor_seconds(rows: list[A2aRow], backend: str, phase: str) -> float:
    """The backend's latency floor: the median over messages of at most A2A_FLOOR_MAX_TOKENS tokens."""
    return statistics.median(r.measured_seconds for r in rows
                             if r.backend == backend and r.phase == phase and r.num_tokens <= A2A_FLOOR_MAX_TOKENS)


def a2a_bandwidth_bytes_per_s(rows: list[A2aRow], backend: str, phase: str, hidden_size: int) -> float:
    """Bytes a rank sends to its peers per second at the largest message: tokens * D * (n-1)/n
    * h * 2, D = n (1 - C(E - E/n, e) / C(E, e)) the distinct ranks a token's e experts sit on
    under uniform routing (DeepEP sends a token once per destination rank, not per expert)."""
    row = max((r for r in rows if r.backend == backend and r.phase == phase and r.hidden_size == hidden_size),
              key=lambda r: r.num_tokens)
    n = row.ep
    ranks_per_token = n * (1 - math.comb(row.num_experts - row.num_experts // n, row.topk)
                           / math.comb(row.num_experts, row.topk))
    sent = row.num_tokens * ranks_per_token * (n - 1) / n * row.hidden_size * A2A_BYTES_PER_ELEMENT
    return sent / row.measured_seconds


def print_table(title: str, scores: dict[str, dict]) -> None:
    print(title)
    print(f"{'group':28} {'rows':>5} {'|err| med':>10} {'max':>8} {'signed':>8}")
    for key, v in scores.items():
        print(f"{key:28} {v['rows']:5d} {v['median_abs']:10.0%} {v['max_abs']:8.0%} {v['median_signed']:+8.0%}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows, a2a = load_moe_rows(), load_a2a_rows()
    gemms = score_gemms(rows)
    ratios = imbalance_ratios(rows)
    a2a_before, a2a_after = score_a2a(a2a), score_a2a(a2a, eff.ALLTOALL_FIXED_SECONDS)
    if args.json:
        print(json.dumps({"gemms": gemms, "imbalance": {" ".join(map(str, k)): v for k, v in ratios.items()},
                          "alltoall": a2a_before, "alltoall_with_fixed_cost": a2a_after}, indent=2))
        return 0
    print_table("Expert GEMMs (balanced rows), error = predicted / measured - 1", gemms)
    print(f"Imbalance: latency(power law) / latency(balanced), median over >= {IMBALANCE_MIN_TOKENS} tokens")
    for (spec, dtype, ep, dist), ratio in ratios.items():
        print(f"  {spec:18} {dtype:10} ep {ep}  {dist:15} {ratio:5.2f}")
    print(f"  fitted ({IMBALANCE_DISTRIBUTION}, bf16, {', '.join(IMBALANCE_SPECS)}): "
          f"{fit_expert_load_imbalance(rows):.3f}; EXPERT_LOAD_IMBALANCE = {eff.EXPERT_LOAD_IMBALANCE}\n")
    print(f"EP foreign-pair traffic: fitted share of HBM (bf16 EP rows >= {EP_FIT_MIN_TOKENS} tokens) "
          f"{fit_ep_foreign_pair_utilization(rows):.3f}; EP_FOREIGN_PAIR_HBM_UTILIZATION = "
          f"{eff.EP_FOREIGN_PAIR_HBM_UTILIZATION}\n")
    print(f"DeepEP floor (median <= {A2A_FLOOR_MAX_TOKENS} tokens) and bytes to peers per second at the largest message")
    for backend, phase in sorted({(r.backend, r.phase) for r in a2a}):
        bandwidths = "  ".join(f"h {h}: {a2a_bandwidth_bytes_per_s(a2a, backend, phase, h) / 1e9:4.0f} GB/s"
                               for h in sorted({r.hidden_size for r in a2a}))
        print(f"  {backend} {phase:8} floor {units.seconds_to_us(a2a_floor_seconds(a2a, backend, phase)):5.0f} us  {bandwidths}")
    print(f"  fitted fixed cost (deepep_ll, <= {A2A_FLOOR_MAX_TOKENS} tokens, measured - model): "
          f"{units.seconds_to_us(fit_alltoall_fixed_seconds(a2a)):.1f} us\n")
    print_table("All-to-all: comm.group_alltoall_seconds (before)", a2a_before)
    fixed_us = units.seconds_to_us(eff.ALLTOALL_FIXED_SECONDS)
    print_table(f"All-to-all: + ALLTOALL_FIXED_SECONDS = {fixed_us:.0f} us (after)", a2a_after)
    if args.verbose:
        for row in rows:
            if row.distribution == "balanced":
                predicted = predict_moe_seconds(row)
                print(f"{row.spec:16} {row.moe_dtype:9} tp {row.moe_tp} ep {row.moe_ep} {row.num_tokens:6d} "
                      f"{units.seconds_to_ms(predicted):9.4f} ms {units.seconds_to_ms(row.measured_seconds):9.4f} ms "
                      f"{predicted / row.measured_seconds - 1:+.0%}")
        for row in a2a:
            predicted = predict_a2a_seconds(row, eff.ALLTOALL_FIXED_SECONDS)
            print(f"{row.backend} {row.phase:8} h {row.hidden_size} {row.num_tokens:6d} "
                  f"{units.seconds_to_us(predicted):9.1f} us {units.seconds_to_us(row.measured_seconds):9.1f} us "
                  f"{predicted / row.measured_seconds - 1:+.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
