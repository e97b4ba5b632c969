"""`plan explain --mode disaggregated`: one P/D deployment in depth, as data (SI units).

Sections: which GPUs of which node run which prefill and decode worker (the same packing the
launch commands use, planner/emit/disagg.py), a request's path from arrival to its last
token with the time of each leg, each worker's memory per GPU, and the rate matching of the
two fleets. Every number is read from the DisaggEstimate (planner/disagg_search.py), so it
equals the `plan --json` disaggregated entry; the path's legs add up to its TTFT and E2E.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.cost import efficiency as eff
from planner.cost.speculative import expected_tokens_per_step
from planner.disagg_search import DisaggEstimate, WorkerPlan, same_node_groups
from planner.explain import MAX_NODES_MAPPED, MemoryBar, MemorySegment, stage_label
from planner.requests import Speculation
from planner.specs import ClusterSpec, ModelSpec
from planner.units import BYTES_PER_MIB, seconds_to_ms, sequences


@dataclass(frozen=True)
class PdSlot:
    node: int
    local_index: int
    role: str | None
    """prefill | decode, None when the deployment leaves this GPU unused."""
    worker: int | None = None
    stage: int | None = None
    tp_rank: int | None = None


@dataclass(frozen=True)
class PdPlacement:
    num_nodes: int
    gpus_per_node: int
    slots: tuple[PdSlot, ...]
    """Every GPU of the first MAX_NODES_MAPPED nodes."""
    same_node: bool
    """P and D share nodes: the KV moves over NVLink, else over the NICs."""


@dataclass(frozen=True)
class PathLeg:
    name: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class RequestPath:
    to_first_token: tuple[PathLeg, ...]
    """Legs that add up to TTFT (in this order)."""
    ttft_seconds: float
    after_first_token: tuple[PathLeg, ...]
    """The remaining O - 1 tokens, which with TTFT add up to E2E."""
    e2e_seconds: float


@dataclass(frozen=True)
class RateMatching:
    prefill_requests_per_second: float
    """N_p * r_p: what the prefill workers take within the TTFT budget."""
    decode_requests_per_second: float
    """N_d * r_d: what the decode workers finish within the TPOT limit."""
    requests_per_second: float
    binding: str
    prefill_utilization: float


@dataclass(frozen=True)
class DisaggExplanation:
    workload: str
    model: str
    cluster: str
    label: str
    gpus_used: int
    ttft_seconds: float
    tpot_seconds: float
    e2e_seconds: float
    goodput_per_gpu: float
    """Per planned GPU, as `plan` ranks it (its copies' goodput over every planned GPU)."""
    notes: tuple[str, ...]
    placement: PdPlacement
    path: RequestPath
    memory: tuple[MemoryBar, ...]
    rate: RateMatching


def _role_slots(first_node: int, worker: WorkerPlan, role: str, gpn: int, first_gpu: int = 0,
                workers_per_node: int | None = None) -> dict[tuple[int, int], PdSlot]:
    """Workers packed onto nodes from `first_node` (GPU `first_gpu` on), `workers_per_node` a
    node, as emit/disagg.py places them; a worker wider than a node takes whole nodes. Rank
    within a worker r = (dp_rank * pp + stage) * tp + tp_rank (dp_rank > 0 only in an
    expert-parallel decode worker)."""
    g = worker.gpus_per_worker
    per_node = workers_per_node or max(1, gpn // g)
    out = {}
    for w in range(worker.workers):
        if g > gpn:
            start = (first_node + w * math.ceil(g / gpn)) * gpn
        else:
            start = (first_node + w // per_node) * gpn + first_gpu + (w % per_node) * g
        for r in range(g):
            node, local = divmod(start + r, gpn)
            stage, tp_rank = divmod(r % (worker.pp * worker.tp), worker.tp)
            out[(node, local)] = PdSlot(node, local, role, w, stage, tp_rank)
    return out


def pd_placement(cluster: ClusterSpec, e: DisaggEstimate) -> PdPlacement:
    gpn = cluster.gpus_per_node
    p, d = e.prefill, e.decode
    if e.same_node:
        m = same_node_groups(p.workers, p.gpus_per_worker, d.workers, d.gpus_per_worker, cluster)
        p_local, d_local = p.workers // m, d.workers // m
        used = {**_role_slots(0, p, "prefill", gpn, 0, p_local),
                **_role_slots(0, d, "decode", gpn, p_local * p.gpus_per_worker, d_local)}
    else:
        prefill = _role_slots(0, p, "prefill", gpn)
        first_decode = max(node for node, _ in prefill) + 1
        used = {**prefill, **_role_slots(first_decode, d, "decode", gpn)}
    assert len(used) == e.gpus_used, "two workers placed on one GPU"
    num_nodes = min(cluster.num_nodes, MAX_NODES_MAPPED)
    unit = dict(used)
    for copy in range(1, e.copies):
        node_offset, gpu_offset = copy_offset(copy, unit, gpn, e.same_node)
        if node_offset >= num_nodes:
            break
        for slot in unit.values():
            if slot.node >= num_nodes:
                continue
            workers = p.workers if slot.role == "prefill" else d.workers
            key = (slot.node + node_offset, slot.local_index + gpu_offset)
            assert key not in used, "two copies placed on one GPU"
            used[key] = replace(slot, node=key[0], local_index=key[1], worker=slot.worker + copy * workers)
    slots = tuple(used.get((n, i), PdSlot(n, i, None)) for n in range(num_nodes) for i in range(gpn))
    return PdPlacement(cluster.num_nodes, gpn, slots, e.same_node)


def copy_offset(copy: int, unit: dict[tuple[int, int], PdSlot], gpn: int, same_node: bool) -> tuple[int, int]:
    """(nodes, GPUs within the node) copy `copy` of the deployment sits past the first, as
    disagg_search.plan_copies counts them: same-node units narrower than a node side by side in
    it (as many as fit), then on the next nodes; the others on nodes of their own, one unit's
    nodes after another."""
    unit_nodes = max(node for node, _ in unit) + 1
    per_node_gpus = max(local for _, local in unit) + 1
    side_by_side = gpn // per_node_gpus if same_node else 1
    group, place = divmod(copy, side_by_side)
    return group * unit_nodes, place * per_node_gpus


def request_path(e: DisaggEstimate, speculation: Speculation | None = None) -> RequestPath:
    """TTFT = first-token cost + queue + the prompt's prefill service + exposed KV transfer + the first
    decode round, and under async scheduling the decode round scheduled ahead of it
    (disagg_search.latency_seconds); E2E = TTFT + (O - 1) * TPOT (under speculative decoding TPOT
    is a round over the tokens it emits)."""
    load, kv, p = e.prefill_load, e.kv, e.prefill
    steps = e.steps_per_prompt
    decode_round = e.tpot_seconds * (1.0 if speculation is None else expected_tokens_per_step(speculation.acceptance))
    ahead = (PathLeg("decode step scheduled ahead", decode_round,
                     "async scheduling: the worker learns the KV has arrived from a step's output, its next "
                     "step already scheduled"),) if e.decode_rounds_before_first_token > 1 else ()
    first = (
        PathLeg("request overhead", e.first_token_seconds,
                "HTTP, the prompt's tokenization (vLLM's proxy: on the prefill, then the decode server; SGLang's "
                "router: on both at once), "
                "hand-off, streaming the first token" if e.first_token_seconds > eff.FIRST_TOKEN_SECONDS else
                "HTTP, hand-off, streaming the first token (prompts sent as token ids)"),
        PathLeg("queue at prefill", load.wait_seconds,
                (f"one micro-batch at a time until prompts queue, at {load.utilization:.0%} utilization "
                 f"({load.rate_per_second:.2f} req/s per worker; the worker's flow-equivalent chain)")
                if load.chained else
                # cost/disaggregated.gated_batch_prefill: the busy share, not the rate over capacity
                (f"the rest of the step running when it arrives: a step runs {load.busy_fraction:.0%} of the time "
                 f"at {load.rate_per_second:.2f} req/s per worker ({load.utilization:.0%} of its capacity at full "
                 f"steps), {load.prompts_per_step:.1f} prompt(s) a step on average"
                 + (f"; {load.lag_fraction:.0%} of the steps run one behind under async scheduling (a step left "
                    f"prompts over), a step more" if load.lag_fraction >= 0.005 else ""))
                if load.busy_fraction is not None else
                # rho against the capacity at full steps (cost/disaggregated.prefill_at_rate), not the busy
                # share at this step size: "41% utilization" beside a 50 ms step at 10 req/s read as a slip
                f"M/D/1 wait at {load.utilization:.0%} of the worker's capacity ({load.rate_per_second:.2f} req/s per "
                f"worker; {load.rate_per_second / load.utilization:.2f} at full steps)" if load.utilization > 0 else
                f"no wait ({load.rate_per_second:.2f} req/s per worker)"),
        PathLeg("prefill", load.prefill_seconds - load.wait_seconds,
                f"one micro-batch's path through the {p.pp} stages of a prefill worker tp={p.tp} pp={p.pp}"
                if load.chained else
                f"its own step, with the prompts that arrived during the one before it (alone at an idle worker), "
                f"on a prefill worker tp={p.tp} pp={p.pp}"
                if load.busy_fraction is not None else
                f"{steps} step(s) of {load.prompts_per_step:.1f} prompt(s) on a prefill worker tp={p.tp} "
                f"pp={p.pp}, round {seconds_to_ms(p.round_seconds):.1f} ms"
                + (f"; its {steps} chunks in consecutive micro-batches, one every round / {p.pp}"
                   if steps > 1 and p.pp > 1 else "")),
        PathLeg("KV transfer (exposed)", kv.exposed_seconds,
                f"{kv.bytes_per_request / BYTES_PER_MIB:,.0f} MiB over {kv.link_kind} ({kv.link_scope}), "
                f"{kv.num_streams} stream(s){f' to each of {kv.copies} decode ranks' if kv.copies > 1 else ''}, "
                f"read after the prefill ends ({kv.source})"),
        *ahead,
        PathLeg("first decode round", decode_round,
                f"on a decode worker {e.decode.shape_label} with "
                f"{sequences(e.decode.concurrency)} sequences"),
    )
    rounds = (f"{e.output_len - 1} more decode rounds" if speculation is None else
              f"{e.output_len - 1} more tokens, {expected_tokens_per_step(speculation.acceptance):.2f} "
              f"per decode round (speculative decoding)")
    rest = (PathLeg(f"TPOT x {e.output_len - 1}", (e.output_len - 1) * e.tpot_seconds, rounds),)
    return RequestPath(first, e.ttft_seconds, rest, e.e2e_seconds)


def worker_memory(cluster: ClusterSpec, role: str, w: WorkerPlan) -> tuple[MemoryBar, ...]:
    bars = []
    for s in w.stages:
        segments = (MemorySegment("weights", s.weights_bytes), MemorySegment("activations", s.activation_bytes),
                    MemorySegment("overhead", s.overhead_bytes), MemorySegment("KV cache", s.kv_cache_bytes))
        note = f"KV cache {s.kv_cache_tokens:,} tokens" + (
            f"; {sequences(w.concurrency)} sequences" if role == "decode" else f"; {w.concurrency:.1f} prompts per step")
        bars.append(MemoryBar((s.stage,), f"{role} {w.shape_label}, {stage_label(s.stage, w.pp)}",
                              segments, cluster.gpu.memory_bytes, s.budget_bytes, note))
    return tuple(bars)


def copies_notes(e: DisaggEstimate) -> tuple[str, ...]:
    """The copies the planned GPUs run, when not exactly one (the drawing numbers each copy's
    workers on from the last copy's, over its first MAX_NODES_MAPPED nodes)."""
    if e.copies == 1 and not e.idle_gpus:
        return ()
    return (f"{e.copies} copies of the deployment: the {e.planned_gpus} planned GPUs run {e.copies} x {e.gpus_used}, "
            f"{e.idle_gpus} idle; goodput per GPU counts all {e.planned_gpus}",)


def explain_disaggregated(model: ModelSpec, cluster: ClusterSpec, e: DisaggEstimate,
                          speculation: Speculation | None = None) -> DisaggExplanation:
    rate = RateMatching(e.rate.prefill_requests_per_second, e.rate.decode_requests_per_second,
                        e.requests_per_second, e.binding, e.prefill_load.utilization)
    return DisaggExplanation(
        "serve (disaggregated)", model.name, cluster.name, e.label, e.gpus_used, e.ttft_seconds, e.tpot_seconds,
        e.e2e_seconds, e.plan_goodput_per_gpu, (*e.notes, *copies_notes(e)), pd_placement(cluster, e),
        request_path(e, speculation),
        worker_memory(cluster, "prefill", e.prefill) + worker_memory(cluster, "decode", e.decode), rate)
