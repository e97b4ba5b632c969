"""How sure we are: re-plan with each uncertain input moved, find where the choice flips.

The uncertain inputs are the link bandwidths and latencies (datasheet, not measured),
the HBM utilisation, the matmul efficiency and the fixed memory overhead per GPU. Each
is perturbed by building a modified ClusterSpec, never by touching module constants:
  bandwidth, latency   the link's own field times f (measured all-reduce curves of
                       that link: times / f for bandwidth, as if bandwidth-bound;
                       left as measured for latency)
  HBM utilisation      hbm_bandwidth * f; the model only ever uses HBM bandwidth times
                       a utilisation, so this is the same product
  matmul efficiency    every peak and measured matmul rate of the GPU times f; the
                       achievable rate is a fraction of these, so it scales by f
  draft acceptance     (serving with speculative decoding) every --draft-acceptance rate
                       times f, at most 1: a request input, applied by the replan
  MoE host time        (training MoE models on Megatron) the host's time per MoE block
                       forward (--moe-host-ms) times f: a request input, applied by the
                       replan; the one fitted constant the MoE training times lean on
  overhead memory      capacity lowered by (f - 1) * overhead / usable fraction: memory
                       left for the KV cache (or activations) shrinks by exactly the
                       extra overhead. The overhead of the explained layout is used for
                       all layouts; overheads differ across layouts by NCCL buffers only
                       (< 0.2 GiB, i.e. < 0.04 GiB at 20%).
One input at a time; the others stay at the model's value. The flip point is found by
a scan outward from 1 and bisection in log space between the last factor that keeps
the recommendation and the first that changes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from planner import units
from planner.layout import Layout
from planner.parallel import map_in_workers
from planner.specs import ClusterSpec, Measured

KNOB_LABELS = {
    "intra_bandwidth": "intra-node bandwidth",
    "inter_bandwidth": "inter-node bandwidth",
    "intra_latency": "intra-node latency",
    "inter_latency": "inter-node latency",
    "hbm_utilization": "HBM utilisation",
    "matmul_efficiency": "matmul efficiency",
    "overhead_memory": "overhead memory",
    "draft_acceptance": "draft acceptance",
    "moe_host": "MoE host time",
}


@dataclass(frozen=True)
class Knobs:
    """Scale factors on the uncertain inputs; 1.0 = the model's value."""

    intra_bandwidth: float = 1.0
    inter_bandwidth: float = 1.0
    intra_latency: float = 1.0
    inter_latency: float = 1.0
    hbm_utilization: float = 1.0
    matmul_efficiency: float = 1.0
    overhead_memory: float = 1.0
    draft_acceptance: float = 1.0
    """Speculative decoding: every --draft-acceptance rate times f (at most 1), a request input
    the replan applies (apply_knobs leaves the cluster as it is for it)."""
    moe_host: float = 1.0
    """MoE training on Megatron: the host's time per MoE block forward times f, a request input
    the replan applies (as draft_acceptance)."""


@dataclass(frozen=True)
class Settings:
    step: float = 0.2
    """The +/- move every input gets (+/-20%: see docs/cost-model.md#known-limitations)."""
    scan_down: tuple[float, ...] = (0.8, 0.65, 0.5, 0.35, 0.25)
    scan_up: tuple[float, ...] = (1.2, 1.5, 2.0, 3.0, 4.0)
    """Factors tried, nearest first, when looking for a flip; the first of each is the step."""
    num_bisections: int = 6


LIGHT = Settings(scan_down=(0.8,), scan_up=(1.2,), num_bisections=2)
"""Only the +/-20% runs (the sweep over every shipped model and cluster uses this)."""


@dataclass(frozen=True)
class Outcome:
    """What one re-plan says: the recommendation and the explained layout's metrics."""

    recommended: Layout | None
    metrics: tuple[tuple[str, float], ...] | None
    """(name, value) of the explained layout; None when it is infeasible there."""


Replan = Callable[[ClusterSpec, Knobs], Outcome]
"""Re-plan on this cluster (apply_knobs applied) with these knobs (those that move a request
input, draft_acceptance, the replan applies itself)."""


@dataclass(frozen=True)
class Flip:
    factor: float
    """The input's scale at which the recommendation changes (first changed value)."""
    value: float
    """The input at that scale, in the knob's display unit."""
    to_layout: Layout | None
    """The new recommendation (None: nothing fits any more)."""


@dataclass(frozen=True)
class KnobResult:
    knob: str
    label: str
    unit: str
    base_value: float
    at_low: Layout | None
    """Recommendation at 1 - step."""
    at_high: Layout | None
    high_factor: float
    """1 + step, or less for a fraction that would pass 1 (then capped at 1)."""
    scan_high: float
    """The largest factor tried upward (fractions stop at 1)."""
    flip_down: Flip | None
    """The nearest flip below 1 within the scan (None: none found)."""
    flip_up: Flip | None


@dataclass(frozen=True)
class MetricRange:
    name: str
    base: float
    low: float
    high: float
    """Extremes over every +/-step run in which the explained layout stays feasible."""


@dataclass(frozen=True)
class SensitivityReport:
    recommended: Layout
    explained: Layout
    step: float
    scan_low: float
    scan_high: float
    knobs: tuple[KnobResult, ...]
    metrics: tuple[MetricRange, ...]
    infeasible_under: tuple[str, ...]
    """'label -20%' style cases where the explained layout no longer fits."""

    @property
    def survives(self) -> bool:
        """The recommendation is unchanged with every input at -step and +step."""
        return all(k.at_low == self.recommended and k.at_high == self.recommended for k in self.knobs)

    @property
    def verdict(self) -> str:
        return "robust" if self.survives else "fragile"


@dataclass(frozen=True)
class KnobBase:
    """Display values of the inputs for this cluster and workload."""

    hbm_utilization: float
    matmul_fraction_of_peak: float
    overhead_bytes: float
    usable_fraction: float
    """The share of capacity the workload budgets (vLLM's gpu_memory_utilization; 1 for training)."""
    draft_acceptance: float | None = None
    """Speculative decoding: the highest --draft-acceptance rate (None: no drafts, no knob)."""
    moe_host_seconds: float | None = None
    """MoE training on Megatron: the host's time per MoE block forward priced (None: no knob)."""


FRACTION_KNOBS = ("hbm_utilization", "matmul_efficiency", "draft_acceptance")
"""Fractions of a peak: never scanned above 1 (a utilisation over 100% is no answer)."""


def knob_values(cluster: ClusterSpec, base: KnobBase) -> dict[str, tuple[float, str]]:
    """The knobs that exist on this cluster -> (model value, unit)."""
    values: dict[str, tuple[float, str]] = {}
    if cluster.intra_node is not None and cluster.gpus_per_node > 1:
        values["intra_bandwidth"] = (cluster.intra_node.bandwidth_gb_per_s, "GB/s")
        values["intra_latency"] = (cluster.intra_node.latency_us, "us")
    if cluster.inter_node is not None and cluster.num_nodes > 1:
        values["inter_bandwidth"] = (cluster.inter_node.nic_bandwidth_gbit_per_s, "Gb/s per NIC")
        values["inter_latency"] = (cluster.inter_node.latency_us, "us")
    values["hbm_utilization"] = (base.hbm_utilization, "of HBM peak")
    values["matmul_efficiency"] = (base.matmul_fraction_of_peak, "of matmul peak")
    values["overhead_memory"] = (units.bytes_to_gib(base.overhead_bytes), "GiB")
    if base.draft_acceptance:
        values["draft_acceptance"] = (base.draft_acceptance, "(the highest rate)")
    if base.moe_host_seconds:
        values["moe_host"] = (units.seconds_to_ms(base.moe_host_seconds), "ms per MoE block")
    return {key: values[key] for key in KNOB_LABELS if key in values}


def _scaled_curves(measured: Measured | None, scope: str, factor: float) -> Measured | None:
    """The probe's curves on `scope`'s links at `factor` of their bandwidth: every collective's
    (all-reduce, all-to-all, all-gather, reduce-scatter; only the all-reduce had moved, so an
    EP exchange on a measured profile ignored the knob: a CLI read)."""
    if measured is None or factor == 1.0:
        return measured
    return measured.model_copy(update={
        name: [c.model_copy(update={"median_seconds": [t / factor for t in c.median_seconds]})
               if c.link == scope else c for c in getattr(measured, name)]
        for name in Measured.CURVE_LISTS})


def _scaled_engine_curves(curves: list, factor: float) -> list:
    """The GPU's engine all-reduce curves (vLLM's, measured inside an NVLink node) at `factor`
    of the intra-node bandwidth. The plan prices TP inside a node with them whenever the node's
    link is near the catalog's (serving_time.on_catalog_fabric), so scaling only the link left
    the intra-node knob without effect within +/-50% (robust 'down to 0.25x'; a CLI read)."""
    if factor == 1.0:
        return curves
    return [c.model_copy(update={"median_seconds": [t / factor for t in c.median_seconds]}) for c in curves]


def _scaled_tflops(model, factor: float):
    return model.model_copy(update={
        name: value * factor for name, value in model.model_dump().items() if value is not None
    })


def _scaled_moe_kernels(kernels, factor: float):
    """The measured fused-MoE kernels with their matmul rates scaled (their weight streams
    follow the HBM bandwidth already)."""
    return kernels.model_copy(update={
        name: kernel.model_copy(update={"tflops": kernel.tflops * factor})
        for name in type(kernels).model_fields if (kernel := getattr(kernels, name)) is not None
    })


def apply_knobs(cluster: ClusterSpec, knobs: Knobs, base: KnobBase) -> ClusterSpec:
    """The cluster as the model would see it with these inputs (see the module docstring)."""
    update: dict = {}
    if cluster.intra_node is not None:
        update["intra_node"] = cluster.intra_node.model_copy(update={
            "bandwidth_gb_per_s": cluster.intra_node.bandwidth_gb_per_s * knobs.intra_bandwidth,
            "latency_us": cluster.intra_node.latency_us * knobs.intra_latency,
        })
    if cluster.inter_node is not None:
        update["inter_node"] = cluster.inter_node.model_copy(update={
            "nic_bandwidth_gbit_per_s": cluster.inter_node.nic_bandwidth_gbit_per_s * knobs.inter_bandwidth,
            "latency_us": cluster.inter_node.latency_us * knobs.inter_latency,
        })
    measured = _scaled_curves(cluster.measured, "intra_node", knobs.intra_bandwidth)
    update["measured"] = _scaled_curves(measured, "inter_node", knobs.inter_bandwidth)
    gpu = cluster.gpu
    extra_overhead = (knobs.overhead_memory - 1) * base.overhead_bytes / base.usable_fraction
    memory = {}
    if extra_overhead:  # vLLM's budget is a share of the CUDA-visible total: lower both
        memory = {"memory_gib": gpu.memory_gib - units.bytes_to_gib(extra_overhead),
                  "cuda_visible_memory_gib": units.bytes_to_gib(gpu.cuda_visible_memory_bytes - extra_overhead)}
    update["gpu"] = gpu.model_copy(update={
        "hbm_bandwidth_gb_per_s": gpu.hbm_bandwidth_gb_per_s * knobs.hbm_utilization,
        "peak_tflops": _scaled_tflops(gpu.peak_tflops, knobs.matmul_efficiency),
        "achievable_matmul_tflops": _scaled_tflops(gpu.achievable_matmul_tflops, knobs.matmul_efficiency),
        "serving_matmul_tflops": _scaled_tflops(gpu.serving_matmul_tflops, knobs.matmul_efficiency),
        "serving_moe_kernels": _scaled_moe_kernels(gpu.serving_moe_kernels, knobs.matmul_efficiency),
        "serving_allreduce": _scaled_engine_curves(gpu.serving_allreduce, knobs.intra_bandwidth),
        "serving_allreduce_unfused": _scaled_engine_curves(gpu.serving_allreduce_unfused, knobs.intra_bandwidth),
        **memory,
    })
    return cluster.model_copy(update=update)


class _Prober:
    """Re-plans one knob at a time, remembering every factor it has tried."""

    def __init__(self, cluster: ClusterSpec, base: KnobBase, replan: Replan, knob: str) -> None:
        self.cluster, self.base, self.replan, self.knob = cluster, base, replan, knob
        self.seen: dict[float, Outcome] = {}

    def at(self, factor: float) -> Outcome:
        if factor not in self.seen:
            knobs = Knobs(**{self.knob: factor})
            self.seen[factor] = self.replan(apply_knobs(self.cluster, knobs, self.base), knobs)
        return self.seen[factor]

    def flip(self, scan: tuple[float, ...], recommended: Layout, num_bisections: int) -> tuple[float, Layout | None] | None:
        kept = 1.0
        for factor in scan:
            if self.at(factor).recommended != recommended:
                return self._bisect(kept, factor, recommended, num_bisections)
            kept = factor
        return None

    def _bisect(self, kept: float, changed: float, recommended: Layout, num_bisections: int) -> tuple[float, Layout | None]:
        for _ in range(num_bisections):
            middle = math.sqrt(kept * changed)
            if self.at(middle).recommended == recommended:
                kept = middle
            else:
                changed = middle
        return changed, self.at(changed).recommended


@dataclass(frozen=True)
class _Direction:
    """One knob moved one way: the nearest flip (None: none in the scan) and the outcome at
    the +/-step factor."""

    flip: Flip | None
    at_step: Outcome


def _directions(knob: str, value: float, settings: Settings) -> tuple[tuple[tuple[float, ...], float], ...]:
    """(scan, step factor) below and above: 1 - step, and 1 + step capped where the knob is a
    fraction that cannot pass 1 (its scan then stops there too)."""
    up, high = settings.scan_up, 1 + settings.step
    if knob in FRACTION_KNOBS:
        high = min(high, max(1.0, 1 / value))
        up = tuple(f for f in up if value * f <= 1) or ((high,) if high > 1 else ())
    return (settings.scan_down, 1 - settings.step), (up, high)


def _probe(prober: _Prober, value: float, scan: tuple[float, ...], factor: float, recommended: Layout,
           num_bisections: int) -> _Direction:
    found = prober.flip(scan, recommended, num_bisections)
    return _Direction(None if found is None else Flip(found[0], value * found[0], found[1]), prober.at(factor))


def analyze(cluster: ClusterSpec, explained: Layout, base: KnobBase, replan: Replan,
            settings: Settings = Settings(), num_workers: int | None = None) -> SensitivityReport:
    """Every knob at 1 - step and 1 + step, its nearest flips, and the explained layout's
    metric ranges over those runs. Each knob moved down and moved up are independent re-plans,
    spread over the usable cores (parallel.map_in_workers; `num_workers`: at most that many,
    default every usable one), with the same result as one after another."""
    baseline = replan(cluster, Knobs())
    assert baseline.recommended is not None, "sensitivity of a plan with no feasible layout"
    recommended = baseline.recommended

    knobs = knob_values(cluster, base)
    # each knob below and above its value: independent re-plans, so one work item each
    items = [(knob, scan, factor) for knob, (value, _) in knobs.items()
             for scan, factor in _directions(knob, value, settings)]

    def probe(item: tuple[str, tuple[float, ...], float]) -> _Direction:
        knob, scan, factor = item
        return _probe(_Prober(cluster, base, replan, knob), knobs[knob][0], scan, factor, recommended,
                      settings.num_bisections)

    probed = dict(zip(items, map_in_workers(probe, items, num_workers), strict=True))
    results, runs, infeasible = [], [], []
    for knob, (value, unit) in knobs.items():
        (down, low), (up, high) = _directions(knob, value, settings)
        below, above = probed[(knob, down, low)], probed[(knob, up, high)]
        for factor, direction in ((low, below), (high, above)):
            if direction.at_step.metrics is None:
                infeasible.append(f"{KNOB_LABELS[knob]} {factor - 1:+.0%}")
            else:
                runs.append(direction.at_step.metrics)
        results.append(KnobResult(knob, KNOB_LABELS[knob], unit, value, below.at_step.recommended,
                                  above.at_step.recommended, high, max(up, default=1.0), below.flip, above.flip))
    return SensitivityReport(
        recommended=recommended,
        explained=explained,
        step=settings.step,
        scan_low=min(settings.scan_down),
        scan_high=max(settings.scan_up),
        knobs=tuple(results),
        metrics=_ranges(baseline.metrics, runs),
        infeasible_under=tuple(infeasible),
    )


def _ranges(base: tuple[tuple[str, float], ...] | None, runs: list) -> tuple[MetricRange, ...]:
    if base is None:
        return ()
    out = []
    for i, (name, value) in enumerate(base):
        values = [value] + [run[i][1] for run in runs]
        out.append(MetricRange(name, value, min(values), max(values)))
    return tuple(out)
