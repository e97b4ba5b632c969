"""Disaggregated serving search: prefill workers (tp, pp) x count and decode workers (tp, pp) x
count over the cluster's GPUs, each worker priced with the serving step model
(cost/serving_time.round_time), rate-matched (cost/disaggregated.py), the prompt's KV moved
between them (cost/kv_transfer.py), ranked by goodput per GPU used.

Placement: TP stays inside a node (tp divides the GPUs per node); a worker wider than a node
takes whole nodes. P and D share nodes when the deployment tiles into identical nodes (each
holding N_p/m prefill and N_d/m decode workers), and the KV then moves over NVLink; otherwise
the prefill workers take their own nodes and the KV crosses the NICs.
Derivation: docs/cost-model.md (Serving: disaggregated).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from planner.cost import efficiency as eff
from planner.cost.continuous_batching import (
    SLOT_WAIT_NOTE_FRACTION,
    false_position_bracket,
    on_geometric_grid,
    pooled_slot_wait_seconds,
)
from planner.cost.disaggregated import (
    PrefillLoad,
    RateMatch,
    closed_loop_rate,
    decode_concurrency_at_rate,
    decode_requests_per_second,
    max_prefill_rate,
    prefill_at_rate,
    prefill_worker,
    rate_match,
)
from planner.cost.ingress import TOKENIZER_NOTE_UTILIZATION
from planner.cost.kv_transfer import (
    KvTransfer,
    kv_link_requests_per_second,
    kv_transfer,
    prompt_kv_layers,
)
from planner.cost.params import kv_cache_format
from planner.cost.serving_memory import (
    StageMemory,
    default_max_num_seqs,
    kv_limited_sequences,
    max_model_len_of,
    max_num_batched_tokens,
    memory_reasons,
    stage_memory,
    structural_reasons,
)
from planner.cost.serving_time import (
    StepConstants,
    StepLoad,
    round_time,
    step_constants,
    with_moe_backend,
)
from planner.cost.speculative import speculation_shape
from planner.emit.command import placement_reasons
from planner.layout import Layout, Link, Placement, inter_node_link, intra_node_link, place
from planner.memo import Memo
from planner.requests import DEFAULT_ALL2ALL_BACKEND, ServeRequest, for_checkpoint
from planner.serve_search import check_moe_backend
from planner.specs import ClusterSpec, ModelSpec, SpecError
from planner.units import BYTES_PER_MIB, ms_above, plain, plural, seconds_to_ms

MAX_UNIT_NODES = 8
"""The largest disaggregated deployment searched, in nodes: goodput per GPU is what is
ranked, and a larger cluster runs copies of the best unit (the search stays instant at
thousands of nodes)."""
SHOWN_CANDIDATES = 10
"""Combinations priced in full (actual loads, E2E) from the best on the rate-matched bound
(more where --top asks for more rows)."""
RATE_CANDIDATES_PER_ROW = 4
"""Under a finite --request-rate, at most this many combinations priced at the rate per row
shown (40 at the default 10 rows): past the rows shown, one more only while its no-load E2E
floor is below the last shown row's E2E."""
PREFILL_EXACT_PROMPTS = 16
"""prefill_price_points: prompt counts per step up to this priced one by one."""
MIN_DISAGGREGATED_GPUS = 2
"""A prefill worker and a decode worker, one GPU each at least."""


def plan_copies(plan_gpus: int, gpus_per_node: int, unit_gpus: int, unit_nodes: int, same_node: bool) -> int:
    """Copies of a deployment of unit_gpus GPUs over unit_nodes nodes that the planned GPUs hold,
    node by node (a copy never splits a node's share across a node boundary):
    - same-node (P and D in identical groups, KV over NVLink), one node: floor(g / G) per full
      node, and floor(r / G) on a partial one (r = its planned GPUs);
    - same-node over m nodes, G/m GPUs on each: floor(F floor(g m / G) / m), F the full nodes;
    - prefill and decode on nodes of their own (KV over the NICs): floor(nodes / n_u), nodes
      the planned nodes (a partial last one counted) and n_u the nodes one copy takes.
    At least 1 (the search built the deployment within the planned GPUs)."""
    full, partial = divmod(plan_gpus, gpus_per_node)
    if same_node and unit_nodes <= 1:
        copies = full * (gpus_per_node // unit_gpus) + partial // unit_gpus
    elif same_node:
        per_node = unit_gpus // unit_nodes
        copies = full * (gpus_per_node // per_node) // unit_nodes
    else:
        copies = math.ceil(plan_gpus / gpus_per_node) // unit_nodes
    return max(1, copies)


def worker_ep(tp: int, dp: int) -> int:
    """A worker's EP degree: its dp > 1 DP ranks share the experts (ep = tp * dp); 1 without."""
    return tp * dp if dp > 1 else 1


@dataclass(frozen=True)
class WorkerShape:
    """One worker shape priced once per search."""

    tp: int
    pp: int
    stages: tuple[StageMemory, ...]
    placement: Placement
    kv_cache_tokens: int
    """Per DP rank (one worker has dp of them under EP): what vLLM reports."""
    dp: int = 1
    """Data-parallel ranks of one worker: > 1 only for an expert-parallel decode worker, whose
    dp ranks each run their own attention and batch and share the experts (ep = tp * dp)."""

    @property
    def running_tokens(self) -> int:
        """Per DP rank, the tokens of running sequences the cache holds (StageMemory.running_tokens)."""
        return min(s.running_tokens for s in self.stages)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def ep(self) -> int:
        return worker_ep(self.tp, self.dp)

    @property
    def key(self) -> tuple[int, int, int]:
        return self.tp, self.pp, self.dp

    @property
    def layout(self) -> Layout:
        return Layout(self.tp, self.pp, self.dp, self.ep)


@dataclass(frozen=True)
class WorkerPlan:
    """One role of the deployment (JSON: `prefill`, `decode`)."""

    tp: int
    pp: int
    workers: int
    concurrency: float
    """Decode: sequences per worker (per DP rank of an EP worker); prefill: prompts per step."""
    round_seconds: float
    """Decode: T_d (TPOT); prefill: one round of its steps."""
    kv_cache_tokens: int
    max_num_seqs: int
    weights_and_kv_bytes_per_gpu: float
    stages: tuple[StageMemory, ...]
    """One GPU of each pipeline stage of a worker (weights, activations, overhead, KV cache)."""
    dp: int = 1
    """DP ranks per worker (an expert-parallel decode worker: ep = tp * dp)."""

    @property
    def ep(self) -> int:
        return worker_ep(self.tp, self.dp)

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus(self) -> int:
        return self.gpus_per_worker * self.workers

    @property
    def shape_label(self) -> str:
        return shape_label(self.tp, self.pp, self.dp)


def shape_label(tp: int, pp: int, dp: int) -> str:
    """A worker's shape as the table prints it: tp and pp, and dp with its EP group where DP ranks share experts."""
    base = f"tp={tp} pp={pp}"
    return base if dp == 1 else f"{base} dp={dp} ep={worker_ep(tp, dp)}"


@dataclass(frozen=True)
class DisaggEstimate:
    prefill: WorkerPlan
    decode: WorkerPlan
    kv: KvTransfer
    same_node: bool
    """P and D share nodes (KV over NVLink)."""
    ttft_seconds: float
    tpot_seconds: float
    e2e_seconds: float
    requests_per_second: float
    binding: str
    """prefill | decode: the side whose rate limits the system; clients: closed-loop clients
    keep it below that (--max-concurrency); request-rate: a finite --request-rate it keeps up
    with sets its load."""
    max_model_len: int
    num_nodes_used: int
    output_len: int
    prefill_load: PrefillLoad
    """One prefill worker at R / N_p: its queueing wait and its steps (TTFT's prefill part)."""
    steps_per_prompt: int
    """S_p: prefill steps a prompt takes (its service: disaggregated.prompt_service_seconds)."""
    first_token_seconds: float
    """The fixed client-side cost of the first token (efficiency.FIRST_TOKEN_SECONDS)."""
    rate: RateMatch
    """What the N_p prefill and the N_d decode workers can each take (req/s) and which binds."""
    notes: tuple[str, ...] = field(default=())
    decode_rounds_before_first_token: int = 1
    """Whole decode rounds in TTFT (decode_rounds_before_first_token): 2 under async scheduling."""
    plan_gpus: int = 0
    """The GPUs planned (--gpus or the cluster's): the deployment runs as many copies as fit
    them (copies); 0: this deployment's own."""
    gpus_per_node: int = 0
    """The cluster's (copies are counted node by node); 0 with plan_gpus 0."""
    overloaded: bool = False
    """A finite --request-rate it does not serve within the limits: above what its copies
    complete (the queue grows for as long as the requests keep coming), or taken but outside the
    SLA; priced at the rate the plan loads it to (rate_bound)."""
    rate_shortfall: str = ""
    """Why it does not serve the --request-rate (overloaded), as the comparison's clause says it."""

    @property
    def gpus_used(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def planned_gpus(self) -> int:
        """The GPUs the copies are counted on (this deployment's own when none were given)."""
        return max(self.plan_gpus, self.gpus_used)

    @property
    def idle_gpus(self) -> int:
        """Planned GPUs no copy runs on."""
        return self.planned_gpus - self.copies * self.gpus_used

    @property
    def copies(self) -> int:
        """Copies of the deployment the planned GPUs hold (plan_copies)."""
        if not self.plan_gpus:
            return 1
        return plan_copies(self.plan_gpus, self.gpus_per_node, self.gpus_used, self.num_nodes_used,
                           self.same_node)

    @property
    def plan_goodput_tokens_per_second(self) -> float:
        """copies * goodput: what the planned GPUs serve, the ones no copy fits idle."""
        return self.copies * self.goodput_tokens_per_second

    @property
    def plan_goodput_per_gpu(self) -> float:
        """plan_goodput over every planned GPU, idle ones included: what ranks deployments on
        a given cluster (a deployment that leaves GPUs idle serves less per GPU of it)."""
        return self.plan_goodput_tokens_per_second / self.planned_gpus

    @property
    def throughput_tokens_per_second(self) -> float:
        """R * O output tokens/s of the whole deployment."""
        return self.requests_per_second * self.output_len

    @property
    def goodput_tokens_per_second(self) -> float:
        """Every estimate kept meets every SLA in its steady state: goodput = throughput."""
        return self.throughput_tokens_per_second

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_tokens_per_second / self.gpus_used

    @property
    def label(self) -> str:
        p, d = self.prefill, self.decode
        return f"P {p.workers}x({p.shape_label}) + D {d.workers}x({d.shape_label})"


@dataclass(frozen=True)
class DisaggPlan:
    candidates: tuple[DisaggEstimate, ...]
    """Best first."""
    rejected: tuple[tuple[str, int], ...]
    """(reason, combinations) tallied."""
    why_none: str = ""
    """Why there is no candidate, one clause (empty when there is one)."""
    would_fit: tuple[str, ...] = ()
    """With no candidate, the TTFT or E2E limit at least one pairing meets with one request
    alone, where the one asked is below it (lowest_latencies), as lines after "What would fit:"."""

    @property
    def recommended(self) -> DisaggEstimate | None:
        return self.candidates[0] if self.candidates else None


def worker_sizes(cluster: ClusterSpec, num_gpus: int) -> list[tuple[int, int]]:
    """(tp, pp): tp a power of two dividing the GPUs per node, pp a power of two, tp * pp at
    most num_gpus - 1 (the other role needs a GPU), whole nodes once wider than a node."""
    gpn = cluster.gpus_per_node
    return [(tp, pp) for tp in tp_degrees(gpn) for pp in powers_of_two_below(num_gpus)
            if tp * pp < num_gpus and not placement_reasons(tp, pp, 1, gpn)]


def tp_degrees(gpus_per_node: int) -> list[int]:
    """Powers of two dividing the GPUs per node: TP stays inside a node."""
    return [tp for tp in powers_of_two_below(gpus_per_node + 1) if gpus_per_node % tp == 0]


def powers_of_two_below(limit: int) -> list[int]:
    return [2**k for k in range(max(0, limit - 1).bit_length()) if 2**k < limit]


def role_request(request: ServeRequest, role: str) -> ServeRequest:
    """The request as one role's servers run it. With a DeepEP --all2all-backend the plan pairs
    the modes as vLLM's guide does (serving/expert_parallel_deployment, "Backend Selection
    Guide": high throughput for prefill, low latency for decode); the default backend and
    --enable-dbo stay as given for both roles."""
    if request.all2all_backend == DEFAULT_ALL2ALL_BACKEND:
        return request
    mode = "deepep_high_throughput" if role == "prefill" else "deepep_low_latency"
    return replace(request, all2all_backend=mode)


def ep_decode_sizes(model: ModelSpec, cluster: ClusterSpec, num_gpus: int) -> list[tuple[int, int, int]]:
    """(tp, 1, d) expert-parallel workers of an MoE model: tp * d GPUs (d >= 2 DP ranks with
    data-parallel attention, ep = tp * d) filling one node or whole nodes, at most num_gpus - 1
    (the other role needs a GPU). Searched for both roles: decode is where EP pays most (more
    tokens per expert read, docs/cost-model.md, Expert parallelism); a prefill worker spreads
    the experts too, at the price of its exchange (DeepEP's high-throughput kernels and dual-
    batch overlap make it cheaper)."""
    if not model.is_moe:
        return []
    gpn = cluster.gpus_per_node
    return [(tp, 1, d) for tp in tp_degrees(gpn) for d in powers_of_two_below(num_gpus)
            if d >= 2 and tp * d < num_gpus and ((tp * d) % gpn == 0 or gpn % (tp * d) == 0)]


def worker_memory(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, tp: int, pp: int,
                  dp: int = 1) -> tuple[Layout, list[StageMemory]] | None:
    """A worker's layout and its stages' memory at vLLM's default --max-num-seqs; None where
    the layout itself is refused (structural_reasons)."""
    layout = Layout(tp, pp, dp, worker_ep(tp, dp))
    if structural_reasons(model, layout):
        return None
    return layout, stage_memory(model, cluster, layout, request,
                                default_max_num_seqs(cluster, request.engine_versions.vllm_release))


def price_shape(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, tp: int, pp: int,
                max_model_len: int, dp: int = 1) -> WorkerShape | None:
    found = worker_memory(model, cluster, request, tp, pp, dp)
    if found is None or memory_reasons(found[1], max_model_len):
        return None
    layout, stages = found
    return WorkerShape(tp, pp, tuple(stages), place(cluster, layout), min(s.kv_cache_tokens for s in stages), dp)


def decode_round_seconds(model: ModelSpec, cluster: ClusterSpec, shape: WorkerShape, concurrency: float,
                         context_tokens: float, request: ServeRequest,
                         constants: StepConstants | None = None, priced: dict | None = None) -> float:
    """T_d, the decode worker's time per output token: a round of C_d decodes at mean context, no
    prompt chunk, as the decode role's `request` runs it (role_request); under speculative
    decoding each sequence also verifies its k drafts, the drafter runs, and the round emits
    e tokens per sequence (speculative.speculation_shape, for its output length): T_d = round / e."""
    tokens_per_round, spec_tokens = speculation_shape(request.speculation, request.output_len)
    load = StepLoad(concurrency, concurrency * context_tokens, spec_tokens=concurrency * spec_tokens)
    in_flight = max(1, min(shape.pp, math.ceil(concurrency)))
    constants = constants or step_constants(model, cluster, shape.layout, request.all2all_backend,
                                            request.enable_dbo, request)
    return round_time(model, cluster, shape.layout, shape.placement, shape.stages, load, in_flight,
                      constants=constants, priced=priced).seconds / tokens_per_round


def decode_concurrency(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, shape: WorkerShape,
                       memo: Memo | None = None) -> int:
    """Largest C_d <= cap (the sequences the KV cache runs at their mean footprint,
    kv_limited_sequences; vLLM's max_num_seqs; the step's token budget over the 1 + k rows a
    sequence takes with k drafts; --batch, the concurrency per replica the user
    asked for, as the aggregated plan takes it; under --emit sglang SGLang's pool) with T_d <= --max-tpot-ms, by bisection (T_d
    grows with C_d); 0 when one sequence misses."""
    context = request.decode_context_tokens
    # each decoding sequence takes 1 + k of a step's tokens (its token and its k drafts), so a
    # step's budget holds budget // (1 + k) of them (vLLM's scheduler leaves the rest out of the
    # step): 256 sequences with one draft each had been priced in DeepEP low-latency's 256-token
    # steps (a CLI read)
    rows = 1 + speculation_shape(request.speculation)[1]
    cap = min(kv_limited_sequences(shape.running_tokens, request.input_len, request.output_len, context),
              default_max_num_seqs(cluster, request.engine_versions.vllm_release),
              max_num_batched_tokens(cluster, request, shape.layout) // rows)  # vLLM: max_num_seqs <= the budget
    if request.batch is not None:
        cap = min(cap, request.batch)
    if request.pool_engine == "sglang" and cap >= 1:  # SGLang's own pool (serve.sglang_pool_cap)
        from planner.emit.sglang import planned_running

        cap = min(cap, planned_running(model, cluster, request, shape.layout, shape.stages,
                                       max_model_len_of(model, request), cap, decode_worker=True))
    limit = request.max_tpot_seconds
    if cap < 1:
        return 0

    constants = step_constants(model, cluster, shape.layout, request.all2all_backend, request.enable_dbo, request)
    memo = memo if memo is not None else Memo()

    def ok(c: int) -> bool:
        return limit is None or memo.get(("t_d", shape.key, c), decode_round_seconds, model, cluster, shape, c,
                                         context, request, constants) <= limit

    if request.batch is not None:
        # --batch fixes the concurrency, as the aggregated plan holds it ("at concurrency 64"): a
        # decode worker whose cache or TPOT limit allows fewer is rejected, not run at fewer
        # sequences unannounced (a CLI read and its review)
        return cap if cap == request.batch and ok(cap) else 0
    if ok(cap):
        return cap
    if not ok(1):
        return 0
    good, bad = 1, cap
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if ok(middle) else (good, middle)
    return good


def prefill_rounds(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, shape: WorkerShape,
                   budget: int):
    """(PrefillWorker, round_seconds(b)) with T(b) interpolated between whole prompt counts.
    A worker of k = pp stages runs k micro-batches of b prompts per round; an expert-parallel
    worker of d DP ranks (they step in lockstep, each on its own prompts, the experts on all of
    them) runs b prompts on each rank per step: its lanes are d, each step priced at one rank's
    load."""
    i = request.input_len
    k = shape.pp
    steps = math.ceil(i / budget)
    chunk = i / steps
    constants = step_constants(model, cluster, shape.layout, request.all2all_backend, request.enable_dbo, request)

    def exact(b: float) -> float:
        load = StepLoad(0, 0, k * b * chunk, k * b * request.prompt_pairs / steps, k * b / steps)
        return round_time(model, cluster, shape.layout, shape.placement, shape.stages, load, k,
                          constants=constants).seconds

    # a step runs at most max_num_seqs sequences (vLLM's scheduler), whatever the budget leaves
    seqs = default_max_num_seqs(cluster, request.engine_versions.vllm_release)
    if steps == 1:
        budget = min(budget, seqs * i)
    most = max(1, budget // i) if steps == 1 else 1
    points = prefill_price_points(most)
    table = [exact(float(b)) for b in points]

    def between(values: Sequence[float], b: float) -> float:
        b = min(max(b, 1.0), float(most))
        upper = min(bisect.bisect_left(points, b), len(points) - 1)
        if points[upper] == b or upper == 0:
            return values[upper]
        low, high = points[upper - 1], points[upper]
        return values[upper - 1] + (b - low) / (high - low) * (values[upper] - values[upper - 1])

    def seconds(b: float) -> float:
        return between(table, b)

    micro = None
    if k > 1 and shape.dp == 1 and steps == 1:
        # a pipelined worker of whole prompts: one micro-batch's path and busiest stage
        # (disaggregated.pipelined_prefill_seconds), at the same counts
        def single(b: float) -> tuple[float, float]:
            load = StepLoad(0, 0, b * chunk, b * request.prompt_pairs, b)
            timed = round_time(model, cluster, shape.layout, shape.placement, shape.stages, load, 1,
                               constants=constants)
            return timed.seconds, timed.stage_steps[timed.slowest_stage].seconds

        paths, busiest = zip(*(single(float(b)) for b in points), strict=True)

        def micro(b: float) -> tuple[float, float]:
            return between(paths, b), between(busiest, b)

    return prefill_worker(i, budget, k * shape.dp, seconds, k, micro, request.schedules_ahead), seconds


def prefill_price_points(most: int) -> list[int]:
    """The prompt counts per step priced exactly: every count up to PREFILL_EXACT_PROMPTS, then
    powers of sqrt(2), and `most`; T(b) in between is linear (past a few prompts a step is
    compute-bound, linear in its tokens). A 1-token prompt under an 8K budget is 8,192 counts,
    not 8,192 priced steps."""
    points = set(range(1, min(most, PREFILL_EXACT_PROMPTS) + 1))
    x = float(PREFILL_EXACT_PROMPTS)
    while x < most:
        points.add(int(round(x)))
        x *= math.sqrt(2)
    points.add(most)
    return sorted(points)


def same_node_groups(num_prefill: int, prefill_gpus: int, num_decode: int, decode_gpus: int,
                     cluster: ClusterSpec) -> int:
    """m identical nodes each holding N_p/m prefill and N_d/m decode workers (smallest m), or 0."""
    gpn = cluster.gpus_per_node
    if max(prefill_gpus, decode_gpus) > gpn:
        return 0
    for m in range(1, min(math.gcd(num_prefill, num_decode), cluster.num_nodes) + 1):
        if num_prefill % m == 0 and num_decode % m == 0 and \
                (num_prefill // m) * prefill_gpus + (num_decode // m) * decode_gpus <= gpn:
            return m
    return 0


def nodes_apart(workers: int, gpus: int, gpn: int) -> int:
    return math.ceil(workers * gpus / gpn)


def combination_copies(cluster: ClusterSpec, request: ServeRequest, memo: _Memo, p_key, n_p: int, d_key,
                       n_d: int, same: bool) -> tuple[int, int]:
    """(GPUs of one copy of the combination, its copies on the planned GPUs: plan_copies)."""
    g_p, g_d = memo.prefill_shapes[p_key].num_gpus, memo.shapes[d_key].num_gpus
    gpus = n_p * g_p + n_d * g_d
    return gpus, plan_copies(request.num_gpus or cluster.num_gpus, cluster.gpus_per_node, gpus,
                             unit_nodes(n_p, g_p, n_d, g_d, same, cluster), same)


def unit_nodes(n_p: int, prefill_gpus: int, n_d: int, decode_gpus: int, same_node: bool,
               cluster: ClusterSpec) -> int:
    """The nodes one deployment takes: its identical groups (same_node_groups), or each role's
    workers packed into nodes of their own."""
    gpn = cluster.gpus_per_node
    if same_node:
        return same_node_groups(n_p, prefill_gpus, n_d, decode_gpus, cluster)
    return nodes_apart(n_p, prefill_gpus, gpn) + nodes_apart(n_d, decode_gpus, gpn)


def kv_link(cluster: ClusterSpec, same_node: bool) -> Link:
    """The KV cache's path from a prefill GPU to a decode GPU: a send to one peer in the node
    (one link on a mesh fabric: layout.intra_node_link), else its share of the NICs."""
    return intra_node_link(cluster, 2) if same_node else inter_node_link(cluster)


PIPELINED_DECODE = ("a decode worker with pipeline stages cannot take in the KV (vLLM's NixlConnector refuses a "
                    "kv_consumer with pipeline_parallel_size > 1, nixl/base_worker.py at 0.33.0)")
"""Why decode workers keep pp = 1 (prefill workers may pipeline: they push, NixlPushConnector, to a
pp = 1 decode; the pull NixlConnector reads stage 0 only)."""
PIPELINED_PREFILL_RECURRENT = ("a prefill worker with pipeline stages of a Mamba/linear-attention hybrid cannot pass "
                               "its state: it must push its KV (NixlPushConnector), which refuses pipeline stages "
                               "with Mamba/SSM layers, nixl/base_worker.py at 0.33.0")
"""vLLM's pipelined prefill workers push (emit/disagg.nixl_connector); the push path has no
pipelined hybrid state yet."""
PIPELINED_PREFILL_PULL_ONLY = ("a prefill worker with pipeline stages cannot pass its KV on vLLM {version}: its NIXL "
                               "connector only pulls, and the decode worker reads one stage's layers (the push "
                               "connector that writes every stage's came with 0.33.0)")
PIPELINED_DECODE_UNPRICED = ("a decode worker with pipeline stages is not planned on SGLang {version}: its "
                             "pipelined decode was not read (0.5.23's, whose decode scheduler agrees on each step's "
                             "requests over the stages, is planned: --engine-version sglang=0.5.23)")
"""The same rejection where the commands are SGLang's, whose decode workers may pipeline, for a
release whose pipelined decode was not read (engines.SglangRelease.pipelined_decode)."""
PIPELINED_DECODE_STAGES = ("a decode worker with pipeline stages takes the KV only from a prefill worker with as "
                           "many (SGLang's CommonKVReceiver: \"Decode pp size should be equal to prefill pp size or 1\", "
                           "disaggregation/common/conn.py at 0.5.23)")
PIPELINED_DECODE_WINDOW = ("a sliding-window model's decode worker with pipeline stages needs the prefill worker's "
                           "TP size (SGLang 0.5.23 does not move window state between different TP sizes under "
                           "pipeline parallelism, disaggregation/common/conn.py)")


def pipelined_decode_reason(model: ModelSpec, prefill: tuple[int, int, int], decode: tuple[int, int, int],
                            engine: str, request: ServeRequest) -> str | None:
    """Why a (tp, pp, dp) decode worker with pipeline stages cannot pair with this prefill worker,
    or None when it can (or has none): vLLM's NIXL connectors take no pipelined consumer, and a
    pipelined prefill worker of a hybrid model none at all (PIPELINED_PREFILL_RECURRENT); SGLang
    0.5.23 takes one fed by a prefill worker of as many stages, at the same TP size for a
    sliding-window model without MLA."""
    if engine != "sglang" and prefill[1] > 1:
        if not request.engine_versions.vllm_release.nixl_pipelined_prefill:
            return PIPELINED_PREFILL_PULL_ONLY.format(version=request.engine_versions.vllm_release.version)
        if model.num_recurrent_layers:
            return PIPELINED_PREFILL_RECURRENT
    if decode[1] == 1:
        return None
    if engine != "sglang":
        return PIPELINED_DECODE
    if not request.engine_versions.sglang_release.pipelined_decode:
        return PIPELINED_DECODE_UNPRICED.format(version=request.engine_versions.sglang_release.version)
    if prefill[1] != decode[1]:
        return PIPELINED_DECODE_STAGES
    if model.num_kv_window_layers and not model.is_mla and prefill[0] != decode[0]:
        return PIPELINED_DECODE_WINDOW
    return None


def rejections_for_engine(plan: DisaggPlan, engine: str, request: ServeRequest) -> DisaggPlan:
    """The plan with its rejections worded for the engine the commands are for: the decode
    pp = 1 rule is vLLM's; SGLang's decode workers may pipeline (PIPELINED_DECODE_UNPRICED)."""
    if engine != "sglang":
        return plan
    unpriced = PIPELINED_DECODE_UNPRICED.format(version=request.engine_versions.sglang_release.version)
    rejected = tuple((unpriced if reason == PIPELINED_DECODE else reason, count) for reason, count in plan.rejected)
    return replace(plan, rejected=rejected, why_none=plan.why_none.replace(PIPELINED_DECODE, unpriced))


@dataclass
class _Memo:
    """Per search: what each shape and (P, D, link) pairing costs."""

    shapes: dict = field(default_factory=dict)
    """The decode role's shapes (memory as its servers run)."""
    prefill_shapes: dict = field(default_factory=dict)
    """The prefill role's (the same unless role_request differs, e.g. DeepEP's two modes)."""
    decode: dict = field(default_factory=dict)
    prefill: dict = field(default_factory=dict)
    pairing: dict = field(default_factory=dict)
    priced: dict = field(default_factory=dict)
    """Per decode shape: round_time's memo of its load-free stage rates and per-load terms
    (serving_time.stage_step_times), shared by every pairing's Little's-law solve."""
    constants: dict = field(default_factory=dict)
    """Per decode shape: its step_constants (decode_rounds)."""
    rounds: dict = field(default_factory=dict)
    """Per decode shape: T_d by concurrency, as decode_rounds priced it."""
    e2e_floor: dict = field(default_factory=dict)
    """Per (prefill shape, decode shape and cap, link): e2e_floor_seconds."""
    prefill_grid: dict = field(default_factory=dict)
    """Per prefill shape: its prefill_seconds at max_prefill_rate's grid of rates."""
    top_cap: dict = field(default_factory=dict)
    """Per decode shape: the most sequences a rank runs within --max-tpot-ms (decode_concurrency)."""
    crossing: dict = field(default_factory=dict)
    """Per (prefill shape, decode shape, N_p, N_d, link): crossing_key's cap."""
    e2e_prefill_rate: dict = field(default_factory=dict)
    """Per (prefill shape, decode shape, link): e2e_prefill_rate."""
    e2e_cap: dict = field(default_factory=dict)
    """Per decode shape: the most sequences a rank runs at the TPOT an E2E limit implies
    (e2e_implied_tpot_seconds; only with one)."""
    load_cap: dict = field(default_factory=dict)
    """Per decode key launched one sequence above its TPOT cap: the most sequences a rank may run
    on average within --max-tpot-ms (tpot_load_cap), and per key balanced_key registers, its
    fractional load; other keys run up to their cap (load_cap)."""
    loaded: dict = field(default_factory=dict)
    """Per (p_key, N_p, d_key, N_d, link, rate): _loaded_latency's answer."""
    balanced: set = field(default_factory=set)
    """The keys of memo.load_cap balanced_key registered (their load the sides' crossing's)."""
    transfers: dict = field(default_factory=dict)
    """Per (prefill tp and pp, decode tp and pp, link): _transfer's KV hand-off."""


DECODE_CAP_HALVINGS = 3
"""With a TTFT or E2E limit, decode workers are also tried at 1/2, 1/4 and 1/8 of the most
sequences the TPOT limit allows (and of the most the E2E limit's implied TPOT allows,
e2e_implied_tpot_seconds): the first token waits for a decode round, so a fuller decode worker
leaves the prefill less of the TTFT budget, every output token takes a round of E2E, and a
looser limit must not lose a deployment that a tighter one found."""


def e2e_implied_tpot_seconds(request: ServeRequest) -> float:
    """The most a decode round may take for --max-e2e-ms to hold with nothing else in the way:
    E2E >= the first-token cost + r whole rounds before the first token (e tokens each:
    speculation_shape; r = decode_rounds_before_first_token) + (O - 1) after it, each token a
    round of T_d, so T_d <= (E2E - first token) / (O - 1 + r e); the --max-tpot-ms limit where
    tighter. Decode workers are tried at the concurrency it allows too (plan_disaggregated),
    since the E2E limit, unlike the TPOT one, is only checked once a pairing is priced."""
    assert request.max_e2e_seconds is not None
    rounds = request.output_len - 1 + speculation_shape(request.speculation)[0] * decode_rounds_before_first_token(request)
    implied = max(0.0, request.max_e2e_seconds - first_token_seconds(request)) / rounds
    return implied if request.max_tpot_seconds is None else min(implied, request.max_tpot_seconds)


def first_token_seconds(request: ServeRequest) -> float:
    """Everything in a disaggregated TTFT outside the workers' steps and the KV transfer: the
    fixed first-token cost (efficiency.FIRST_TOKEN_SECONDS) and the prompt's tokenization, one
    prompt at a time (PromptTokenizer.steady_seconds; the tokenizers' queue at a rate is not
    priced here), on each server the request passes in turn (tokenizations_in_ttft)."""
    tokenizer = request.tokenizer
    if tokenizer is None:
        return eff.FIRST_TOKEN_SECONDS
    return eff.FIRST_TOKEN_SECONDS + tokenizations_in_ttft(request) * tokenizer.steady_seconds(request.input_len)


def tokenizations_in_ttft(request: ServeRequest) -> int:
    """Tokenizations of the prompt one after another before the first token: vLLM's proxy sends
    the request, text and all, to a prefill server, and once it replies, the same body to a
    decode server, which tokenizes it again (tests/v1/kv_connector/nixl_integration/
    toy_proxy_server.py, _handle_completions; vllm-project/vllm read at 030ea52): 2. SGLang's
    router hands the request to the prefill and the decode server at once, which tokenize it
    side by side (sgl-router's PD router, execute_dual_dispatch): 1."""
    return 1 if request.pool_engine == "sglang" else 2


def tokenizer_utilization(request: ServeRequest, rate_per_s: float, prefill_workers: int,
                          decode_workers: int) -> float:
    """The busiest server's tokenizer thread's busy share at `rate_per_s` requests: each prefill
    worker's server takes R / N_p of the prompts and each decode worker's R / N_d (both
    tokenize: tokenizations_in_ttft), over its threads (PromptTokenizer.utilization); 0 for
    micro-batches and prompts sent as token ids."""
    tokenizer = request.tokenizer
    if tokenizer is None:
        return 0.0
    return tokenizer.utilization(request.input_len, rate_per_s / min(prefill_workers, decode_workers))


E2E_CAP_STEPS = 4
"""The E2E limit's implied-TPOT concurrency is tried at each quarter of it too (e2e_caps)."""


def e2e_caps(cap: int) -> list[int]:
    """The decode concurrencies tried for an E2E limit: the most its implied TPOT allows
    (e2e_implied_tpot_seconds, which leaves the TTFT out, so it is an upper bound) at each quarter
    of it, and its halvings below: the TTFT under load takes some of the budget, and the
    concurrency that then meets the limit lies below the bound, often between two halvings."""
    if cap < 1:  # not even one sequence meets the implied TPOT (or --max-tpot-ms)
        return []
    return sorted({max(1, cap * k // E2E_CAP_STEPS) for k in range(1, E2E_CAP_STEPS + 1)} | set(decode_caps(cap, True)))


def decode_caps(cap: int, sla_limited: bool) -> list[int]:
    """The decode concurrencies tried: the TPOT-limited cap, and with a TTFT or E2E limit halvings of it."""
    caps = [cap]
    for _ in range(DECODE_CAP_HALVINGS if sla_limited else 0):
        if caps[-1] // 2 < 1:
            break
        caps.append(caps[-1] // 2)
    return caps


def plan_disaggregated(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                       shared: Memo | None = None, engine: str = "vllm",
                       shown: int = SHOWN_CANDIDATES) -> DisaggPlan:
    """`shared`: the workers' memory, prefill tables and decode rounds already priced, kept
    across searches that differ only in the SLA limits (planner/frontier.py); None: this
    search's own. `engine`: the one the commands are for; SGLang's decode workers may have
    pipeline stages (pipelined_decode_reason), vLLM's may not. `shown`: the combinations
    priced in full and kept (--top above SHOWN_CANDIDATES asks for more)."""
    shown = max(shown, SHOWN_CANDIDATES)
    request = for_checkpoint(model, request)  # the checkpoint's own KV format, as plan_serving takes it
    rate_candidates = RATE_CANDIDATES_PER_ROW * shown
    pipelined = engine == "sglang" and request.engine_versions.sglang_release.pipelined_decode
    check_moe_backend(model, cluster, request.moe_backend)
    shared = shared if shared is not None else Memo()
    cluster = with_moe_backend(cluster, request.moe_backend)
    plan_gpus = request.num_gpus or cluster.num_gpus
    num_gpus = min(plan_gpus, MAX_UNIT_NODES * cluster.gpus_per_node)
    max_model_len = max_model_len_of(model, request)
    memo = _Memo()
    sizes = [(tp, pp, 1) for tp, pp in worker_sizes(cluster, num_gpus)] + ep_decode_sizes(model, cluster, num_gpus)
    prefill_request, decode_request = role_request(request, "prefill"), role_request(request, "decode")
    for tp, pp, dp in sizes:
        shape = shared.get(("decode shape", tp, pp, dp), price_shape, model, cluster, decode_request, tp, pp,
                           max_model_len, dp)
        if shape is None:
            continue
        cap = 0 if pp > 1 and not pipelined else decode_concurrency(model, cluster, decode_request, shape, shared)
        # a fixed --batch is the one concurrency tried (decode_concurrency)
        fixed = request.batch is not None
        caps = decode_caps(cap, not fixed and (request.max_ttft_seconds is not None
                                               or request.max_e2e_seconds is not None))
        implied_tpot = e2e_implied_tpot_seconds(request) if request.max_e2e_seconds is not None else 0.0
        if implied_tpot > 0 and cap > 0 and not fixed:  # and below the TPOT the E2E limit implies
            implied = replace(decode_request, max_tpot_seconds=implied_tpot)
            memo.e2e_cap[shape.key] = decode_concurrency(model, cluster, implied, shape, shared)
            caps += e2e_caps(memo.e2e_cap[shape.key])
        memo.top_cap[shape.key] = cap
        for c in sorted(set(caps) - {0}, reverse=True) or [0]:
            _cap_key(memo, shape, c)
        if not fixed and request.max_tpot_seconds is not None and cap >= 1:
            # one sequence more at launch, loaded to what --max-tpot-ms allows on average
            engine_cap = decode_concurrency(model, cluster, replace(decode_request, max_tpot_seconds=None), shape,
                                            shared)
            fraction = tpot_load_cap(model, cluster, request, memo, shape, cap, engine_cap)
            if fraction is not None:
                memo.load_cap[_cap_key(memo, shape, cap + 1)] = fraction
        shape_p = (shape if prefill_request == decode_request else
                   shared.get(("prefill shape", tp, pp, dp), price_shape, model, cluster, prefill_request, tp, pp,
                              max_model_len, dp))
        if shape_p is None:
            continue
        memo.prefill_shapes[shape.key] = shape_p
        shape_budget = max_num_batched_tokens(cluster, prefill_request, shape_p.layout)
        memo.prefill[shape.key] = shared.get(("prefill rounds", shape.key), prefill_rounds, model, cluster,
                                             prefill_request, shape_p, min(shape_budget, shape_p.running_tokens // pp))
    rejected: dict[str, int] = {}
    bounds: list[Combination] = []

    def copies_of(p_key, n_p, d_key, n_d, same) -> tuple[int, int]:
        """(GPUs of one copy, copies on the planned GPUs)."""
        return combination_copies(cluster, request, memo, p_key, n_p, d_key, n_d, same)

    def served_per_gpu(p_key, n_p, d_key, n_d, same) -> float:
        """Output tokens/s per planned GPU for each request/s a copy completes."""
        return copies_of(p_key, n_p, d_key, n_d, same)[1] * request.output_len / plan_gpus

    def combination(p_key, n_p, d_key, n_d, same, rate: tuple[float, float]) -> Combination:
        """The bound the search orders a deployment by (Combination), from its workers' rates."""
        match = rate_match(rate[0], n_p, rate[1], n_d)
        gpus, copies = copies_of(p_key, n_p, d_key, n_d, same)
        completed = copies * match.requests_per_second
        if request.max_concurrency is not None:  # what its clients can keep it at (client_bound), at most
            floor = e2e_floor_seconds(model, cluster, request, memo, p_key, d_key, same)
            completed = clients_rate_bound(request.max_concurrency, copies, match.requests_per_second,
                                           lambda _rate: floor, 0)
        served = completed * request.output_len
        # whether it keeps up with a sent rate is read only at one (rate_bound's test)
        capacity_per_s = match.requests_per_second if request.offered_rate_per_s is None else \
            rate_capacity_per_second(model, cluster, request, memo, (p_key, n_p, d_key, n_d, same))
        return Combination(-round(served / plan_gpus), -match.requests_per_second / gpus, p_key, n_p,
                           d_key, n_d, same, completed, copies * capacity_per_s)

    pairs: dict[tuple, tuple] = {}  # (p_key, decode shape, N_p, N_d, link) -> a halving's key
    for p_key, d_key in [(p, d) for p in memo.prefill for d in memo.shapes]:
        why = pipelined_decode_reason(model, p_key, d_key[:3], engine, request)
        if why is not None:
            rejected[why] = rejected.get(why, 0) + 1
            continue
        if memo.decode[d_key] == 0:
            why = (f"--batch {request.batch}: the decode worker does not run that many within its KV cache "
                   f"and --max-tpot-ms" if request.batch is not None else "no decode concurrency meets --max-tpot-ms")
            rejected[why] = rejected.get(why, 0) + 1
            continue
        links = [same for same, possible in ((True, cluster.gpus_per_node > 1), (False, cluster.num_nodes > 1))
                 if possible]
        rates = [_pairing(model, cluster, request, memo, p_key, d_key, same) for same in links]
        balances = [r[0] / r[1] for r in rates if not isinstance(r, str)] or [1.0]
        counts = {c for b in balances for c in _counts(cluster, num_gpus, memo.prefill_shapes[p_key], memo.shapes[d_key], b)}
        for n_p, n_d, same in sorted(counts):
            rate = _pairing(model, cluster, request, memo, p_key, d_key, same)
            # every count pair, also one no halving's cap leaves a TTFT budget: its crossing may
            pairs.setdefault((p_key, memo.shapes[d_key].key, n_p, n_d, same), d_key)
            if isinstance(rate, str):
                rejected[rate] = rejected.get(rate, 0) + 1
                continue
            bounds.append(combination(p_key, n_p, d_key, n_d, same, rate))
    # with a TTFT limit, each count pair that could rank among the priced also at its crossing cap
    crossed_from: dict[tuple, tuple | None] = {}  # (p_key, n_p, crossing key, n_d, same) -> its best halving's key
    for entry in crossing_entries(model, cluster, request, memo, pairs, bounds, served_per_gpu,
                                  CROSSING_CANDIDATES_PER_ROW * shown):
        key, crossed, halving = entry
        crossed_from[key] = halving
        p_key, n_p, d_key, n_d, same = key
        bounds.append(combination(p_key, n_p, d_key, n_d, same, crossed))
    bounds.sort()
    offered = request.offered_rate_per_s

    def floor_of(entry: Combination) -> float:
        return e2e_floor_seconds(model, cluster, request, memo, entry.p_key, entry.d_key, entry.same)

    def worth_pricing_past_the_shown(entry: Combination) -> bool:
        """At a rate, past the `shown` rows: a combination that keeps up, while fewer than
        rate_candidates are priced and its E2E floor beats the last shown row's E2E among those
        that keep up (any, while fewer than `shown` do: an E2E limit or the clients can leave one
        below the rate)."""
        if offered is None or entry.capacity_per_second <= offered or len(out) >= rate_candidates:
            return False
        kept = sorted(e.e2e_seconds for e in out if not e.overloaded)
        return len(kept) < shown or floor_of(entry) < kept[shown - 1]

    if offered is not None:
        # at a rate the deployments that keep up serve alike and rank by E2E: those first, by the
        # floor no load can beat (e2e_floor_seconds), the rest (overloaded) as at capacity; keeping
        # up is the capacity's test (rate_bound's), not the 90% the plan loads prefill workers to
        bounds = (sorted((b for b in bounds if b.capacity_per_second > offered), key=floor_of)
                  + [b for b in bounds if b.capacity_per_second <= offered])
    out, seen = [], set()
    limits_rate = request.max_e2e_seconds is not None and crossing_applies(request)  # e2e_limited
    best_at: dict[tuple, DisaggEstimate] = {}  # per deployment, its entry in `out`
    # heap: (-goodput per GPU at its matched rate, then at its E2E ceiling, order, combination,
    # the ceiling's req/s or None before it is priced)
    deferred: list[tuple] = []
    order = itertools.count()
    e2e_capped: dict[tuple, list[int]] = {}  # per deployment, the caps e2e_limited's rate was E2E's at
    refined = 0
    e2e_misses: dict[tuple, list[tuple[float, float]]] = {}

    def shown_kth() -> float:
        """The `shown`-th goodput per planned GPU found; -inf while fewer are."""
        return -math.inf if len(out) < shown else sorted((e.plan_goodput_per_gpu for e in out), reverse=True)[shown - 1]

    def keep(found: DisaggEstimate, p_key, n_p, d_key, n_d, same, checked: bool = True) -> None:
        """`found` into `out`, once per deployment (the best of those run below their matched rate).
        `checked`: whether `found` met the limits at its matched rate (under --max-concurrency one
        that missed TTFT or E2E there is priced at its clients' load, which must meet them)."""
        unit = math.gcd(n_p, n_d)
        found = replace(found, plan_gpus=plan_gpus, gpus_per_node=cluster.gpus_per_node)
        # the decode cap found was priced at: an E2E refinement's lower one (_largest_meeting_e2e
        # keys it (*shape, cap)), which the loads below must keep (a review: a copy launched at
        # the cap that missed E2E, its capacity taken there)
        refined_key = (*memo.shapes[d_key].key, found.decode.max_num_seqs)
        d_key = refined_key if refined_key in memo.decode and found.decode.max_num_seqs != memo.decode[d_key] \
            else d_key
        if request.max_concurrency is not None:
            found = client_bound(model, cluster, request, memo, found, (p_key, n_p, d_key, n_d, same), max_model_len,
                                 checked)
            if isinstance(found, str):
                rejected[found] = rejected.get(found, 0) + 1
                return
        if offered is not None:
            found = rate_bound(model, cluster, request, memo, found, (p_key, n_p, d_key, n_d, same), max_model_len)
            if isinstance(found, str):
                rejected[found] = rejected.get(found, 0) + 1
                return
        deployment = (p_key, n_p // unit, d_key[:3], n_d // unit, same)
        if found.binding != E2E_BINDING:  # at its matched rate: the same deployment's later caps
            seen.add(deployment)  # are bounded below it
        # the same deployment found again (at another cap, below its matched rate, or refined
        # below its bound): the better one stays
        earlier = best_at.get(deployment)
        if earlier is not None:
            if not replaces(found, earlier):
                return
            out.remove(earlier)
        best_at[deployment] = found
        out.append(found)

    def found_beats(deployment: tuple, goodput_per_gpu: float) -> bool:
        """Whether the deployment's entry found serves at least `goodput_per_gpu` (another cap's
        bound): under E2E-limited pricing, where an entry found can sit below its own bound (run
        below its matched rate, or refined to a lower cap), in place of `seen` (a review: the
        same deployment deferred at the cap that missed E2E was dropped for a refinement at 43.45
        tok/s per GPU where its ceiling was 48.57; DeepSeek-V3 1,024 at E2E 3 s, TPOT 20 ms fell
        from 45.85 to 43.45 as TTFT loosened from 200 to 300 ms)."""
        kept = best_at.get(deployment)
        return kept is not None and kept.plan_goodput_per_gpu >= goodput_per_gpu

    def clients_bound_per_gpu(entry: Combination, exact: bool) -> float | None:
        """Output tokens/s per planned GPU the combination's clients keep it at, at most: the
        order's bound tightened by a lower bound on E2E at each rate (clients_rate_bound), the
        cheap one's few Little's-law rounds (e2e_lower_bound_seconds) or, `exact`, the E2E
        client_bound prices (_loaded_latency). None where, at the exact bound, the busiest copies'
        E2E, their clients over their rate (Little's law), is over --max-e2e-ms already
        (client_bound's own proof, E2E_PROOF_TOLERANCE)."""
        key = (entry.p_key, entry.n_p, entry.d_key, entry.n_d, entry.same)
        capacity = matched_load(model, cluster, request, memo, *key).requests_per_second

        def cheap_upper(clients: int) -> float:
            return clients_rate_bound(clients, 1, capacity, lambda rate: e2e_lower_bound_seconds(
                model, cluster, request, memo, entry.p_key, entry.d_key, entry.same,
                loads_at(memo, entry.n_p, entry.d_key, entry.n_d, rate), whole=True))

        copies = copies_of(*key)[1]
        q, r = divmod(request.max_concurrency, copies)
        busiest = q + 1 if r else q
        upper = {c: client_rate_upper(model, cluster, request, memo, *key, c) if exact else cheap_upper(c)
                 for c in ({q + 1, q} if r else {q}) if c}
        # (the exact bound's only: the cheap one's E2E can exceed E2E where a round shortens with the load)
        if exact and e2e_proved_over(busiest, upper[busiest], request):
            return None
        completed = r * upper.get(q + 1, 0.0) + (copies - r) * upper.get(q, 0.0)
        return completed * request.output_len / plan_gpus

    def clients_order(entries: list[Combination]):
        """`entries` (ordered by E2E's floor, clients_rate_bound's loosest) in the order of their
        tightest bound (clients_bound_per_gpu, cheap then exact), each yielded with it, found
        lazily: an entry's bound is tightened once it comes first, and the entry is yielded once
        it comes first with the exact one; each level's bound is capped at the looser one's (a
        decode round can shorten as the load grows, past vLLM's fused all-reduce size, so a
        "lower bound" on E2E can exceed E2E: a review found the cheap one 3.9% over in 74 of
        54,408 cases), so no later entry beats the one yielded. Tightening every entry's exact
        bound cost Qwen3-30B-A3B on 2x8 H200 at 64 clients some 5 s a search; entries whose E2E
        at no load misses --max-e2e-ms go through untightened (the search rejects them unpriced:
        a review, 20 s a search at 8 clients and E2E 2 s on Qwen3-235B fp8, 0.5 s so)."""
        # a deployment's highest decode cap runs it as any lower one does below the lower one's
        # capacity (Little's law's concurrency is the same there) and more above it: its halvings
        # need no bound (Qwen3-30B-A3B at 64 clients and E2E 3 s tightened 1,700 entries, 4 s).
        # With a TTFT limit too: under clients the prefill's budget is priced with a lone
        # sequence's round whatever the cap (pairing_rates; at the cap, a lower one had left it
        # more: Llama-3.1-70B at 64 clients, TTFT 300 ms, 261.5 -> 205.2 bounding the highest alone)
        top: dict[tuple, Combination] = {}
        for entry in entries:
            key = (entry.p_key, entry.n_p, memo.shapes[entry.d_key].key, entry.n_d, entry.same)
            if key not in top or load_cap(memo, entry.d_key) > load_cap(memo, top[key].d_key):
                top[key] = entry
        entries = list(top.values()) if top else entries
        heap = [(-entry.requests_per_second, i, 0, entry) for i, entry in enumerate(entries)]
        heapq.heapify(heap)
        limit = request.max_e2e_seconds
        levels = 2  # the cheap tier, then the exact one
        while heap:
            key, i, level, entry = heapq.heappop(heap)
            unit = math.gcd(entry.n_p, entry.n_d)
            if level == levels or (entry.p_key, entry.n_p // unit, entry.d_key[:3], entry.n_d // unit, entry.same) in seen \
                    or limit is not None and e2e_floor_seconds(model, cluster, request, memo, entry.p_key,
                                                               entry.d_key, entry.same) > limit:
                yield entry  # (a deployment found already, or one no load brings within E2E: skipped unpriced)
                continue
            per_gpu = clients_bound_per_gpu(entry, exact=level == 1)
            if per_gpu is None:  # proved to miss E2E
                rejected[E2E_MISS] = rejected.get(E2E_MISS, 0) + 1
                continue
            per_gpu = min(per_gpu, entry.requests_per_second * request.output_len / plan_gpus)
            completed = per_gpu * plan_gpus / request.output_len
            heapq.heappush(heap, (-completed, i, level + 1, entry._replace(
                neg_tokens_per_second_per_gpu=-round(per_gpu), requests_per_second=completed)))

    def price_deferred(down_to: float) -> None:
        """The combinations that missed --max-e2e-ms at their matched rate, run below it
        (e2e_limited), best E2E ceiling first, while that ceiling beats both `down_to` (the next
        bound) and the `shown`-th goodput found: best first over the bounds and the ceilings (the
        ceilings' rates prune what exact pricing would have cost: Qwen3-235B fp8 on 2x8 H200 at
        E2E 8 s priced 140 combinations' E2E-limited rates, each some 500 decode rounds)."""
        while deferred and -deferred[0][0] > max(down_to, shown_kth()):
            neg_served, _, combination_key, ceiling = heapq.heappop(deferred)
            p_key, n_p, d_key, n_d, same = combination_key
            unit = math.gcd(n_p, n_d)
            deployment = (p_key, n_p // unit, d_key[:3], n_d // unit, same)
            cap = memo.decode[d_key]
            # a higher cap runs the decode ranks at no fewer sequences at any rate (Little's law
            # capped at the cap), so E2E at no lower: where a lower cap's rate was E2E's, not
            # its ceiling's, this one's is at most that (both tested before the ceiling is priced:
            # 1,921 ceilings for 24 pricings on Qwen3-30B-A3B at E2E 1.5 s, a review)
            if found_beats(deployment, -neg_served) or any(c <= cap for c in e2e_capped.get(deployment, ())):
                continue
            if ceiling is None:  # ordered by its matched rate so far: now by its ceiling's
                matched = matched_load(model, cluster, request, memo, *combination_key).requests_per_second
                ceiling = e2e_rate_ceiling(model, cluster, request, memo, *combination_key)
                heapq.heappush(deferred, (neg_served * ceiling / matched, next(order), combination_key, ceiling))
                continue
            found = e2e_limited(model, cluster, request, memo, *combination_key, max_model_len, ceiling)
            if isinstance(found, str):
                rejected[found] = rejected.get(found, 0) + 1
                continue
            if found.requests_per_second < (1 - 2 * E2E_RATE_TOLERANCE) * ceiling:
                e2e_capped.setdefault(deployment, []).append(cap)
            keep(found, *combination_key)

    for entry in (bounds if request.max_concurrency is None else clients_order(bounds)):
        _, _, p_key, n_p, d_key, n_d, same, _, _ = entry
        bound_per_gpu = entry.requests_per_second * request.output_len / plan_gpus
        price_deferred(bound_per_gpu)
        # E2E-limited rates and clients' (below the bound: E2E under load) may leave the first found below later bounds
        if len(out) >= shown and not worth_pricing_past_the_shown(entry) and not (
                (limits_rate or request.max_concurrency is not None) and bound_per_gpu > shown_kth()):
            break
        # the same deployment at a lower decode cap, or a multiple of one already kept
        unit = math.gcd(n_p, n_d)
        deployment = (p_key, n_p // unit, d_key[:3], n_d // unit, same)
        # (under --max-concurrency an entry found below its bound is client-bound: another cap
        # above the clients' load runs them at the same rate, and one below it at less; one the
        # clients fill is found at its bound. Pricing every cap instead (found_beats) left the
        # answers as they were to the solver's tolerance and took Qwen3-30B-A3B on 2x8 H200 at 64
        # clients, TTFT 300 ms, E2E 6 s, TPOT 40 ms from 4 to 20 s)
        if found_beats(deployment, bound_per_gpu) if limits_rate else deployment in seen:
            continue
        pairing = (p_key, d_key, same)
        refinable = refined < E2E_REFINEMENTS and memo.decode[d_key] > 1
        limit = request.max_e2e_seconds
        known_miss = False  # at the matched rate, proved by a bound
        if limit is not None:  # skip what a bound proves misses, counted as _detail would count it
            loads = worker_loads(model, cluster, request, memo, p_key, n_p, d_key, n_d, same)
            floor_misses = e2e_floor_seconds(model, cluster, request, memo, *pairing) > limit
            known_miss = not refinable and request.max_concurrency is None and (
                any(loads[0] >= p and loads[1] >= d for p, d in e2e_misses.get(pairing, ()))
                or e2e_lower_bound_seconds(model, cluster, request, memo, *pairing, loads) > limit)
            # (with the load the search's own, a miss at the matched rate is run below it: e2e_limited)
            if floor_misses or known_miss and not limits_rate:
                refined += floor_misses and refinable  # _largest_meeting_e2e would have tried it, in vain
                rejected[E2E_MISS] = rejected.get(E2E_MISS, 0) + 1
                continue
        found = E2E_MISS if known_miss else _detail(model, cluster, request, memo, p_key, n_p, d_key, n_d, same,
                                                    max_model_len)
        fallback = None if known_miss else crossed_from.get((p_key, n_p, d_key, n_d, same))
        if isinstance(found, str) and fallback is not None and deployment not in seen:  # the crossing missed (a round at load
            # above the cap's: CUDA-graph padding): the halving it came from, as priced before
            d_key = fallback
            found = _detail(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, max_model_len)
        checked = True
        if request.max_concurrency is not None and found in (E2E_MISS, TTFT_MISS):
            # its clients run it below the matched rate: the limits are checked at their load
            # (client_bound); at the matched rate alone a refinement's lower cap queued them
            # (a review: Qwen3-235B fp8 at 64 clients, E2E 5.5 s found nothing)
            found, checked = _detail(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, max_model_len,
                                     check_limits=False), False
        if found == E2E_MISS:
            e2e_misses.setdefault(pairing, []).append(loads)
            if limits_rate:  # run below its matched rate, in its turn (price_deferred)
                matched = matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same)
                heapq.heappush(deferred, (-served_per_gpu(p_key, n_p, d_key, n_d, same) * matched.requests_per_second,
                                          next(order), (p_key, n_p, d_key, n_d, same), None))
            if refinable:
                refined += 1
                found = _largest_meeting_e2e(model, cluster, request, memo, p_key, n_p, d_key, n_d, same,
                                             max_model_len)
            if limits_rate and isinstance(found, str):  # (counted if the deferred pricing misses too)
                continue
        if isinstance(found, str):
            rejected[found] = rejected.get(found, 0) + 1
            continue
        keep(found, p_key, n_p, d_key, n_d, same, checked)
    price_deferred(-math.inf)
    # the latency objective at a rate: the lowest TPOT at that load among those that keep up
    by_tpot = offered is not None and request.objective == "latency"
    out = sorted(out, key=lambda e: (e.overloaded, e.tpot_seconds, rank_key(e)) if by_tpot else rank_key(e))
    out = out[:shown]
    would_fit = () if out else lowest_latencies(model, cluster, request, memo, engine)
    return DisaggPlan(tuple(out), tuple(sorted(rejected.items())),
                      "" if out else why_no_deployment(request, num_gpus, bool(memo.shapes), bool(rejected),
                                                       None if memo.shapes or not sizes else largest_worker_reason(
                                                           model, cluster, decode_request, sizes, max_model_len)),
                      would_fit)


def lowest_latencies(model, cluster, request, memo, engine: str) -> tuple[str, ...]:
    """What would fit where the TTFT or E2E limit is below what any pairing reaches with one
    request alone (latency_seconds at no load: its prefill alone, the KV transfer over NVLink
    where both workers fit in a node, else the NICs, and a lone sequence's rounds): the least
    limit that one meets and the pairing, a line each. No load gives less, so below it no
    deployment meets the limit (the aggregated plan says as much; the disaggregated one had said
    only "none meets the SLA")."""
    lowest: dict[str, tuple[float, str]] = {}
    for p_key, d_shape in [(p, d) for p in memo.prefill for d in {s.key: s for s in memo.shapes.values()}.values()]:
        if memo.top_cap.get(d_shape.key, 0) < 1 or \
                pipelined_decode_reason(model, p_key, d_shape.key[:3], engine, request) is not None:
            continue
        shape_p = memo.prefill_shapes[p_key]
        d_key = _cap_key(memo, d_shape, 1)
        for same in (True, False):
            if same and shape_p.num_gpus + d_shape.num_gpus > cluster.gpus_per_node or \
                    not same and cluster.num_nodes < 2:
                continue
            ttft, e2e = lone_latencies(model, cluster, request, memo, p_key, d_key, same)
            link = _transfer(model, cluster, request, memo, p_key, d_key, same).link_kind
            pairing = f"P {shape_label(*shape_p.key)} + D {shape_label(*d_shape.key)}, KV over {link}"
            for name, value in (("ttft", ttft), ("e2e", e2e)):
                if name not in lowest or value < lowest[name][0]:
                    lowest[name] = (value, pairing)
    lines = []
    for name, flag, label, limit in (("ttft", "--max-ttft-ms", "TTFT", request.max_ttft_seconds),
                                     ("e2e", "--max-e2e-ms", "E2E latency", request.max_e2e_seconds)):
        if limit is not None and name in lowest and lowest[name][0] > limit:
            value, pairing = lowest[name]
            lines.append(f"{flag} {math.ceil(seconds_to_ms(value)):,} or more: the lowest {label} any prefill + "
                         f"decode pairing reaches here, with one request alone ({pairing})")
    return tuple(lines)


def client_bound(model, cluster, request, memo, found: DisaggEstimate, combination: tuple,
                 max_model_len: int, checked: bool = True) -> DisaggEstimate | str:
    """`found` under --max-concurrency C over its k copies, C = q k + r: r copies hold q + 1
    clients, the rest q (as the aggregated replicas split them, serve.estimate), each kept at
    client_bound_rate (below its capacity when its clients cannot fill it). The estimate is the
    busiest copies' (their TTFT, TPOT, E2E) at the copies' mean rate, which sets the goodput;
    at capacity the clients beyond what it holds queue (queued_at_capacity). 4 clients over 8 copies: four copies at one client each, four
    idle, half of 8 copies at one."""
    copies = found.copies
    q, r = divmod(request.max_concurrency, copies)

    def rate_of(clients: int) -> float:
        return client_bound_rate(model, cluster, request, memo, *combination, clients) if clients else 0.0

    busiest = q + 1 if r else q
    upper = client_rate_upper(model, cluster, request, memo, *combination, busiest)
    # a miss proved without the closed loop's search (a review: a Mixtral search at 16 clients and
    # E2E 2 s priced every combination's, 1.6 s for none)
    if e2e_proved_over(busiest, upper, request):
        return E2E_MISS
    # and their rate at least clients / E2E(upper), where TTFT is at least TTFT there (both grow with it)
    if request.max_ttft_seconds is not None:
        lower = min(upper, busiest / _loaded_latency(model, cluster, request, memo, *combination, upper).e2e_seconds)
        if _loaded_latency(model, cluster, request, memo, *combination, lower).ttft_seconds > \
                request.max_ttft_seconds * (1 + E2E_PROOF_TOLERANCE):
            return TTFT_MISS

    busiest_rate = rate_of(busiest)
    other_rate = rate_of(q) if r else busiest_rate
    mean = (r * busiest_rate + (copies - r) * other_rate) / copies
    if mean >= found.requests_per_second:
        return queued_at_capacity(request, found, busiest)
    # the busiest copies' latencies: below the capacity found was priced at, so within its limits
    closed = _detail(model, cluster, request, memo, *combination, max_model_len, load_rate=busiest_rate)
    if isinstance(closed, str):  # `found`, at capacity, where it met the limits there (unchecked: not)
        return found if checked else closed
    if busiest_rate >= found.requests_per_second:  # the busiest copies full, the rest not: their
        # clients beyond it queue (a review: 141 clients on two Llama-3.1-70B copies, 71 on the
        # busiest past its 70.5 in flight, showed E2E 11.56 s for 71 / 6.10 = 11.64 s)
        closed = queued_at_capacity(request, closed, busiest)
        if isinstance(closed, str):
            return closed
    if copies == 1:
        split = ""
    elif r:
        split = f" ({q + 1:,} client{'s' if q else ''} on {r} of them, {q:,} on the rest)"
    else:
        split = f" ({q:,} client{'s' if q > 1 else ''} each)"
    note = (f"Client-bound: --max-concurrency {request.max_concurrency:,} over {copies} "
            f"cop{'ies' if copies > 1 else 'y'}{split} keep {mean:.2f} req/s per copy on average of the "
            f"{found.requests_per_second:.2f} the plan loads one to (Little's law: clients = rate x E2E, "
            f"{seconds_to_ms(closed.e2e_seconds):,.0f} ms on the busiest)")
    return replace(closed, requests_per_second=mean, rate=replace(closed.rate, requests_per_second=mean),
                   plan_gpus=found.plan_gpus, gpus_per_node=found.gpus_per_node, notes=(*closed.notes, note))


CLIENT_BOUND_STEPS = 2
"""clients_rate_bound's steps of R = min(capacity, clients / E2E(R)) from R = 0 (an even count:
each even step is above the fixed point)."""


E2E_PROOF_TOLERANCE = 2.0**-20
"""client_bound rejects a combination by its rate's bounds only where they miss --max-e2e-ms
(or --max-ttft-ms) by more than this share (the bound and the closed loop's rate agree to rounding at
the fixed point)."""


def e2e_proved_over(clients: int, upper_per_s: float, request: ServeRequest) -> bool:
    """Whether `clients` closed-loop clients on a copy whose rate is at most `upper_per_s` miss
    --max-e2e-ms for sure: by Little's law their E2E is clients over their rate, at least clients
    / upper (beyond E2E_PROOF_TOLERANCE)."""
    limit = request.max_e2e_seconds
    return limit is not None and clients / upper_per_s > limit * (1 + E2E_PROOF_TOLERANCE)


def clients_rate_bound(clients: int, copies: int, capacity_per_s: float,
                       e2e_seconds: Callable[[float], float], steps: int = CLIENT_BOUND_STEPS) -> float:
    """Above what `clients` closed-loop clients over `copies` copies complete (client_bound's
    split: clients = q copies + r, r copies hold q + 1, the rest q), given `e2e_seconds`, a lower
    bound on a copy's E2E at a rate that grows with it. A copy held at R by c clients has R =
    c / E2E(R) (Little's law) <= g(R) = min(capacity, c / e2e_seconds(R)), so R is at most g's
    fixed point R^, and since g falls with R, g(0) >= R^, g(g(0)) <= R^, g(g(g(0))) >= R^: an even
    number of steps of R -> g(R) from 0 stays above R^ and tightens with each pair. What the
    search orders combinations by under --max-concurrency (with E2E's floor: no steps needed),
    and tests before pricing one (e2e_lower_bound_seconds, CLIENT_BOUND_STEPS): by capacity alone
    a looser --max-tpot-ms let more capacious deployments fill the priced rows that their clients
    kept slower (Llama-3.1-8B on 1x8 H100 at 4 clients: 142.6 tok/s per GPU at TPOT 6.5 ms, 106.1
    at 7.3; a review sweep)."""
    assert steps % 2 == 0
    q, r = divmod(clients, copies)

    def copy_rate(held: int) -> float:
        rate = 0.0
        for _ in range(steps + 1):  # g(0), then the steps
            rate = min(capacity_per_s, held / e2e_seconds(rate))
        return rate

    return r * copy_rate(q + 1) + (copies - r) * (copy_rate(q) if q else 0.0)


def queued_at_capacity(request: ServeRequest, found: DisaggEstimate, clients: int) -> DisaggEstimate | str:
    """`found` at its capacity R under `clients` closed-loop clients a copy (the busiest copies'):
    at R a copy holds R x E2E requests (Little's law); the clients beyond them are sent all the
    same (vllm bench serve's --max-concurrency caps what is in flight, not what the server
    queues), so each request's E2E is clients / R and the difference waits for the prefill
    workers, in TTFT. The busiest copies' latencies are the estimate's, as below capacity; a
    limit the wait breaks rejects it. 64 clients on one copy taking 2.18 req/s at an 8.77 s E2E
    (19 in flight): E2E 64 / 2.18 = 29.4 s, TTFT + 20.6 s (found by a CLI read: the aggregated
    layouts of the same plan queued their clients, the disaggregated ones did not)."""
    rate = found.requests_per_second
    queue_seconds = clients / rate - found.e2e_seconds if rate > 0 else 0.0
    if queue_seconds <= 0:
        return found
    ttft, e2e = found.ttft_seconds + queue_seconds, found.e2e_seconds + queue_seconds
    for limit, value, name in ((request.max_ttft_seconds, ttft, "TTFT"), (request.max_e2e_seconds, e2e, "E2E")):
        if limit is not None and value > limit:
            return (f"{name} over the limit with --max-concurrency {request.max_concurrency:,}: its clients queue "
                    f"for the prefill workers at capacity")
    note = (f"Client-bound at capacity: {clients:,} client{'s' if clients > 1 else ''} a copy keep more in flight "
            f"than the {rate * found.e2e_seconds:.1f} it serves at {rate:.2f} req/s; the rest queue for the prefill "
            f"workers, {seconds_to_ms(queue_seconds):,.0f} ms of TTFT (Little's law: E2E = clients / rate)")
    return replace(found, ttft_seconds=ttft, e2e_seconds=e2e, notes=(*found.notes, note))


def rate_overload_miss(request: ServeRequest) -> str:
    """Why a deployment behind a sent rate is rejected under a TTFT or E2E limit (rate_bound),
    naming the limits set."""
    return (f"falls behind --request-rate: its queue grows for as long as requests keep coming, in TTFT and E2E "
            f"alike, so no {' or '.join(request.queue_limit_flags)} holds at that rate")


RATE_TTFT_MISS = "TTFT exceeds --max-ttft-ms at the --request-rate sent"
RATE_E2E_MISS = "E2E latency exceeds --max-e2e-ms at the --request-rate sent"


def rate_bound(model, cluster, request, memo, found: DisaggEstimate, combination: tuple,
               max_model_len: int) -> DisaggEstimate | str:
    """`found` under a finite --request-rate R spread over its k copies: each at R / k, its
    latencies those of that load (_loaded_latency: the prefill workers' M/D/1 wait, the decode
    ranks' Little's-law concurrency), binding "request-rate". found's own rate is the one the plan
    loads a copy to (its prefill workers at most MAX_PREFILL_UTILIZATION of their capacity, a
    policy for a rate the plan chooses); a rate the user sends runs up to the copy's capacity
    (rate_capacity_per_second: the prefill workers' full capacity, the decode workers' rate
    within the TPOT limit, the KV links'), priced at that load where it meets the limits. At or
    above the capacity, found marked overloaded (its queue grows); between found's rate and the
    capacity where the load misses a latency limit, found marked overloaded too (it keeps up,
    outside the SLA); either way unless --max-concurrency clients hold the excess back (then
    found as client_bound left it). Overloaded, it is credited with its capacity
    (requests_per_second, which its goodput and the comparisons read), its times those of
    found's load. Under a TTFT or E2E limit either is a miss (rate_overload_miss, RATE_TTFT_MISS,
    RATE_E2E_MISS), as an aggregated layout's (serve.overload_rejection): the queue of a
    deployment behind the rate is in both, and one that takes the rate past the limit has
    nothing to give up but the rate."""
    rate = request.offered_rate_per_s
    per_copy = rate / found.copies
    copies = "its one copy" if found.copies == 1 else f"each of its {found.copies} copies"
    of_copies = f"over {found.copies} cop{'ies' if found.copies > 1 else 'y'}"
    capacity_per_s = rate_capacity_per_second(model, cluster, request, memo, combination)
    if per_copy >= found.requests_per_second:
        if request.max_concurrency is not None:  # the clients hold the rest back (client_bound)
            return found
        if per_copy >= capacity_per_s:
            if request.queue_limit_flags:
                return rate_overload_miss(request)
            # it completes its capacity (what the comparisons credit it with, as an overloaded
            # aggregated layout its own); the times stay those of the load found was priced at
            note = (f"Overloaded: --request-rate {rate:g}/s {of_copies} asks {plain(per_copy)} req/s of each, which "
                    f"completes at most {plain(capacity_per_s)} req/s: requests queue for as long as they keep coming (the "
                    f"times are at {plain(found.requests_per_second)} req/s, before that queue)")
            return replace(found, overloaded=True, requests_per_second=capacity_per_s, notes=(*found.notes, note),
                           rate_shortfall=f"at most {plain(capacity_per_s)} req/s per copy")
    loaded = _detail(model, cluster, request, memo, *combination, max_model_len, load_rate=per_copy,
                     binding="request-rate")
    if loaded in (TTFT_MISS, E2E_MISS):
        return RATE_TTFT_MISS if loaded == TTFT_MISS else RATE_E2E_MISS
    if isinstance(loaded, str):  # it takes the rate, outside the limits (Poisson arrivals' slot waits
        # can put a rate below found's, whose load was priced without them, over a TTFT limit)
        note = (f"SLA-bound: --request-rate {rate:g}/s {of_copies} asks {plain(per_copy)} req/s of each, which it "
                f"takes (up to {plain(capacity_per_s)} req/s) but not within the limits: {loaded} (the times are at "
                f"{plain(found.requests_per_second)} req/s without Poisson arrivals' waits)")
        return replace(found, overloaded=True, notes=(*found.notes, note),
                       rate_shortfall=f"outside the limits at {plain(per_copy)} req/s per copy")
    note = (f"Rate-bound: --request-rate {rate:g}/s gives {copies} {plain(per_copy)} req/s of the "
            f"{plain(capacity_per_s)} one can take")
    return replace(loaded, plan_gpus=found.plan_gpus, gpus_per_node=found.gpus_per_node,
                   notes=(*loaded.notes, note))


def rate_capacity_per_second(model, cluster, request, memo, combination: tuple) -> float:
    """The requests/s one copy of a combination (p_key, N_p, d_key, N_d, same) completes at the
    most: N_p prefill workers at their full capacity (PrefillWorker.capacity_requests_per_second,
    the M/D/1's rho = 1; not the MAX_PREFILL_UTILIZATION a plan loads them to), each no faster
    than its KV links, and N_d decode workers at the rate _pairing gives them (their concurrency
    cap, within the TPOT limit, and their KV links)."""
    p_key, n_p, d_key, n_d, same = combination
    pairing = _pairing(model, cluster, request, memo, p_key, d_key, same)
    assert not isinstance(pairing, str)  # found was priced on this pairing
    kv = _transfer(model, cluster, request, memo, p_key, d_key, same)
    prefill = min(memo.prefill[p_key][0].capacity_requests_per_second,
                  kv_link_requests_per_second(kv, memo.prefill_shapes[p_key].num_gpus))
    return min(n_p * prefill, n_d * pairing[1])


def check_disaggregated_gpus(request: ServeRequest, cluster: ClusterSpec) -> None:
    """--mode disaggregated on fewer GPUs than a prefill and a decode worker: a usage error
    (`plan` and `plan explain` alike)."""
    gpus = request.num_gpus or cluster.num_gpus
    if gpus < MIN_DISAGGREGATED_GPUS:
        raise SpecError(f"--mode disaggregated: needs at least {MIN_DISAGGREGATED_GPUS} GPUs (a prefill and a "
                        f"decode worker); the plan has {gpus}")


def largest_worker_reason(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                          sizes: list[tuple[int, int, int]], max_model_len: int) -> str | None:
    """Why the largest worker tried does not fit: its memory's first reason (weights, no room for
    the KV cache, or a cache short of one --max-model-len sequence); None where none is given."""
    tp, pp, dp = max(sizes, key=lambda size: (size[0] * size[1] * size[2], size[0]))
    found = worker_memory(model, cluster, request, tp, pp, dp)
    reasons = [] if found is None else memory_reasons(found[1], max_model_len)
    return f"tp={tp} pp={pp}" + ("" if dp == 1 else f" dp={dp}") + f": {reasons[0]}" if reasons else None


def why_no_deployment(request: ServeRequest, num_gpus: int, any_worker_fits: bool, any_rejected: bool,
                      largest_reason: str | None = None) -> str:
    """The clause that says why nothing came out: too few GPUs, no worker that fits (with the
    largest one's reason: a KV cache short of one --max-model-len sequence read as the weights
    not fitting, found by a CLI read), the SLA, or no prefill + decode pairing that tiles the GPUs."""
    if num_gpus < MIN_DISAGGREGATED_GPUS:
        return (f"it needs at least {MIN_DISAGGREGATED_GPUS} GPUs (a prefill and a decode worker); "
                f"this plan has {num_gpus}")
    if not any_worker_fits:
        largest = max(powers_of_two_below(num_gpus), default=1)
        why = "" if largest_reason is None else f"; the largest, {largest_reason}"
        return (f"no prefill or decode worker fits in memory on up to {plural(largest, 'GPU')} (the {num_gpus} GPUs "
                f"must hold one of each){why}")
    if any_rejected and request.has_sla:
        return "none meets the SLA"
    if any_rejected:
        return "every prefill + decode pairing was rejected"
    return f"no prefill and decode workers fit the {num_gpus} GPUs together"


def rank_key(e: DisaggEstimate) -> tuple:
    """Those that keep up with a finite --request-rate first; goodput per planned GPU (to the
    token/s; idle GPUs count), then lower TTFT (to the ms; under a request rate, mean E2E)
    and TPOT, then the same service on fewer GPUs (more per GPU used), then the shapes."""
    p, d = e.prefill, e.decode
    # at a request rate they keep up with they serve alike: the workload's mean E2E decides
    latency = e.e2e_seconds if e.binding == "request-rate" else e.ttft_seconds
    return (e.overloaded, -round(e.plan_goodput_per_gpu), round(seconds_to_ms(latency)), e.tpot_seconds,
            -round(e.goodput_per_gpu), p.tp, p.pp, p.workers, d.tp, d.pp, d.dp, d.workers)


def _counts(cluster: ClusterSpec, num_gpus: int, p: WorkerShape, d: WorkerShape, balance: float):
    """(N_p, N_d, same_node) that fit the GPUs, tiled on shared nodes or on separate nodes.
    For each N_p only the N_d around the rate balance N_p * r_p / r_d (`balance` = r_p / r_d)
    and the most that fit: goodput per GPU min(N_p r_p, N_d r_d) / GPUs peaks there."""
    gpn = cluster.gpus_per_node
    for n_p in range(1, (num_gpus - d.num_gpus) // p.num_gpus + 1):
        most = (num_gpus - n_p * p.num_gpus) // d.num_gpus
        even = n_p * balance
        for n_d in sorted({max(1, min(most, n)) for n in (math.floor(even), math.ceil(even), most)}):
            if same_node_groups(n_p, p.num_gpus, n_d, d.num_gpus, cluster):
                yield n_p, n_d, True
            elif cluster.num_nodes > 1 and nodes_apart(n_p, p.num_gpus, gpn) + nodes_apart(
                    n_d, d.num_gpus, gpn) <= math.ceil(num_gpus / gpn):
                yield n_p, n_d, False


def _transfer(model, cluster, request, memo, p_key, d_key, same) -> KvTransfer:
    key = (p_key[:2], d_key[:2], same)
    if key not in memo.transfers:
        link = kv_link(cluster, same)
        curve = cluster.allreduce_curve(link.scope, 2)
        memo.transfers[key] = kv_transfer(
            prompt_kv_layers(model, kv_cache_format(model, cluster.gpu, request.kv_cache_dtype), request.input_len),
            p_key[0], d_key[0], link, curve, model.is_mla, prefill_pp=p_key[1], decode_pp=d_key[1])
    return memo.transfers[key]


def decode_rounds(model, cluster, request, memo, shape_d: WorkerShape) -> Callable[[float], float]:
    """T_d(C) of this decode shape (decode_round_seconds) with its step constants and
    round_time's memo kept per shape in `memo`: every pairing, bound and bisection of a search
    prices its rounds through it."""
    decoding = role_request(request, "decode")
    if shape_d.key not in memo.constants:
        memo.constants[shape_d.key] = step_constants(model, cluster, shape_d.layout, decoding.all2all_backend,
                                                     decoding.enable_dbo, decoding)
    constants, priced = memo.constants[shape_d.key], memo.priced.setdefault(shape_d.key, {})
    rounds = memo.rounds.setdefault(shape_d.key, {})  # by concurrency: the caps and one sequence recur

    def round_seconds(concurrency: float) -> float:
        if concurrency not in rounds:
            rounds[concurrency] = decode_round_seconds(model, cluster, shape_d, concurrency,
                                                       request.decode_context_tokens, decoding, constants, priced)
        return rounds[concurrency]

    return round_seconds


def _pairing(model, cluster, request, memo, p_key, d_key, same) -> tuple[float, float] | str:
    """(r_p, r_d) per worker for this pairing, or why the prefill cannot meet TTFT (pairing_rates
    at the decode key's load cap)."""
    key = (p_key, d_key, same)
    if key not in memo.pairing:
        memo.pairing[key] = pairing_rates(model, cluster, request, memo, p_key, memo.shapes[d_key],
                                          load_cap(memo, d_key), same)
    return memo.pairing[key]


def pairing_rates(model, cluster, request, memo, p_key, shape_d: WorkerShape, c_d: float,
                  same) -> tuple[float, float] | str:
    """(r_p, r_d) per worker with the decode ranks of `shape_d` running `c_d` sequences, or why
    the prefill cannot meet TTFT: the first token waits for a decode round at c_d, so the prefill
    gets what --max-ttft-ms leaves after it (max_prefill_rate), and a rank completes c_d / (O T_d)
    requests/s (decode_requests_per_second); neither more than the KV links carry. Under
    --max-concurrency the clients set the load, and the round the first token waits for is at
    the sequences they keep in flight, not at the cap: the prefill's budget is priced with a lone
    sequence's round (the least; r_p an upper bound), and client_bound checks TTFT at the clients'
    own load. (Priced at the cap, deployments that met the limit at that load were rejected as
    full: Llama-3.1-8B on 1x8 H100 at 64 clients, TTFT 43.07 ms without a limit, found nothing
    at --max-ttft-ms 44; a review.)"""
    rounds = decode_rounds(model, cluster, request, memo, shape_d)
    t_d = rounds(c_d)
    t_first = t_d if request.max_concurrency is None else rounds(min(c_d, 1.0))
    kv = _transfer(model, cluster, request, memo, p_key, shape_d.key, same)
    limit = request.max_ttft_seconds
    if limit is not None:  # the first token waits for whole decode rounds (e tokens of T_d each)
        limit -= first_token_seconds(request) + kv.exposed_seconds + t_first * speculation_shape(
            request.speculation)[0] * decode_rounds_before_first_token(request)
    worker, seconds = memo.prefill[p_key]
    if limit is not None and limit <= 0:
        return (f"KV transfer over {kv.link_kind} ({seconds_to_ms(kv.exposed_seconds):.1f} ms) and the "
                f"first decode step leave no TTFT budget")
    r_p = max_prefill_rate(worker, limit, seconds, memo.prefill_grid.setdefault(p_key, {}))
    r_d = shape_d.dp * decode_requests_per_second(c_d, request.output_len, t_d)
    # neither side moves more KV than its links carry
    r_p = min(r_p, kv_link_requests_per_second(kv, memo.prefill_shapes[p_key].num_gpus))
    r_d = min(r_d, kv_link_requests_per_second(kv, shape_d.num_gpus))
    return "a lone prompt's prefill misses --max-ttft-ms" if r_p <= 0 else (r_p, r_d)


E2E_MISS = "E2E latency exceeds --max-e2e-ms"
TTFT_MISS = ("TTFT exceeds --max-ttft-ms at the rate matched (the prefill's budget priced the decode round at "
             "the rank's cap, and a round at the load it gets can be longer: CUDA-graph padding)")
TPOT_MISS = ("TPOT exceeds --max-tpot-ms at the load the rate gives the decode ranks: their round is longer "
             "there than at the cap it was checked at (a round need not grow with the load: vLLM fuses each "
             "TP all-reduce with the next RMSNorm only up to a message size, and the fused kernel is the slower)")
TPOT_CHECK_TOLERANCE = 2.0**-30
"""Relative slack of _detail's TPOT check (the fractional load cap meets the limit to rounding)."""
E2E_REFINEMENTS = 8
"""The best-ranked pairings (at most this many) whose decode concurrency misses --max-e2e-ms are
also tried at every concurrency below it, by bisection (_largest_meeting_e2e), beyond the
halvings all pairings get (decode_caps): a cap between two halvings can meet the limit with
more goodput (70B on two H100 nodes at 3 s: 6 sequences, 32.9 tok/s per GPU, where the halving
to 4 gave 22 and lost to aggregated)."""


def _largest_meeting_e2e(model, cluster, request, memo, p_key, n_p, d_key, n_d, same,
                         max_model_len) -> DisaggEstimate | str:
    """The pairing at the largest decode concurrency below d_key's that meets --max-e2e-ms
    (E2E grows with it: longer rounds, and more requests per second for the prefill), by
    bisection over whole sequences; E2E_MISS where even one sequence misses."""
    shape, low, high = memo.shapes[d_key], 0, memo.decode[d_key]
    best: DisaggEstimate | str = E2E_MISS
    if request.batch is not None:  # a fixed --batch: no fewer sequences are tried
        return best
    while high - low > 1:
        middle = (low + high) // 2
        key = _cap_key(memo, shape, middle)
        tried = _detail(model, cluster, request, memo, p_key, n_p, key, n_d, same, max_model_len)
        if isinstance(tried, str):
            if tried != E2E_MISS:
                return tried
            high = middle
        else:
            low, best = middle, tried
    return best


E2E_BINDING = "e2e"
"""DisaggEstimate.binding of a deployment run below its matched rate to meet --max-e2e-ms."""
E2E_RATE_TOLERANCE = 2.0**-12
"""e2e_limited's rate is within this share of the ceiling below the largest that meets the limit..."""
E2E_RATE_ROUNDS = 24
"""...found by false position in at most this many pricings (about 6 for E2E's smooth rise)."""
E2E_CEILING_TOLERANCE = 2.0**-4
"""e2e_rate_ceiling's rate is within this share of itself above the largest its bound meets (a
bound need not be sharp: the search only orders and prunes by it)..."""
E2E_CEILING_FLOOR = 2.0**-20
"""...searched down to this share of the matched rate (below it: that, a bound that prunes)."""


def e2e_rate_ceiling(model, cluster, request, memo, p_key, n_p, d_key, n_d, same) -> float:
    """Above what e2e_limited finds, cheaply: the largest rate up to the matched one at which
    e2e_lower_bound_seconds (a few Little's-law rounds, no bisection) meets --max-e2e-ms, by
    bisection; what the search tests a combination's E2E-limited goodput against before
    pricing it."""
    matched = matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same).requests_per_second

    def excess_seconds(rate: float) -> float:
        return e2e_lower_bound_seconds(model, cluster, request, memo, p_key, d_key, same,
                                       loads_at(memo, n_p, d_key, n_d, rate),
                                       E2E_CEILING_ITERATIONS) - request.max_e2e_seconds

    if excess_seconds(matched) <= 0:
        return matched
    # bisection in log space (the bound has kinks, the fixed point's cap, where false position
    # crawls; a ceiling far below the matched rate took some 13 halvings of the rate)
    low, high = matched * E2E_CEILING_FLOOR, matched
    if excess_seconds(low) > 0:
        return low
    while high > low * (1 + E2E_CEILING_TOLERANCE):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if excess_seconds(middle) <= 0 else (low, middle)
    return high


def replaces(found: DisaggEstimate, earlier: DisaggEstimate) -> bool:
    """Whether `found` replaces `earlier`, the same deployment (or a multiple of it) found at
    another decode cap: more goodput per planned GPU (a multiple's copies differ: per copy its
    rate does) beyond e2e_limited's tolerance, or as much at a lower cap (the launch cap a burst
    can fill: no more than the rate needs)."""
    margin = 2 * E2E_RATE_TOLERANCE * earlier.plan_goodput_per_gpu
    if abs(found.plan_goodput_per_gpu - earlier.plan_goodput_per_gpu) > margin:
        return found.plan_goodput_per_gpu > earlier.plan_goodput_per_gpu
    return found.decode.max_num_seqs < earlier.decode.max_num_seqs


def e2e_limited(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, max_model_len,
                ceiling_per_s: float) -> DisaggEstimate | str:
    """The combination at the largest rate up to `ceiling_per_s` (e2e_rate_ceiling's, at most its
    matched rate) whose E2E meets --max-e2e-ms (binding E2E_BINDING), by false position (E2E
    grows with the rate: both workers' loads); E2E_MISS where even no load meets it
    (e2e_floor_seconds). The SLA search an aggregated layout gets: the most load within every
    limit. Without it a pairing ran at its TTFT-limited rate or not at all, so a looser
    --max-ttft-ms (a higher matched rate, E2E missed there) lost goodput: Mixtral-8x7B on 2x8
    A100 at E2E 1.5 s, 17.0 -> 14.0 tok/s per GPU from TTFT 200 to 300 ms (a review)."""
    if e2e_floor_seconds(model, cluster, request, memo, p_key, d_key, same) > request.max_e2e_seconds:
        return E2E_MISS

    def excess_seconds(rate: float) -> float:
        return _loaded_latency(model, cluster, request, memo, p_key, n_p, d_key, n_d, same,
                               rate).e2e_seconds - request.max_e2e_seconds

    low, _ = false_position_bracket(0.0, ceiling_per_s, excess_seconds, E2E_RATE_TOLERANCE, E2E_RATE_ROUNDS)
    if low <= 0:
        return E2E_MISS
    found = _detail(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, max_model_len, load_rate=low,
                    binding=E2E_BINDING)
    if isinstance(found, str):
        return found
    matched = matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same)
    at_matched = _loaded_latency(model, cluster, request, memo, p_key, n_p, d_key, n_d, same,
                                 matched.requests_per_second).e2e_seconds
    note = (f"E2E-bound: at the {matched.requests_per_second:.3g} req/s its {matched.binding} workers take within "
            f"the other limits, E2E would be {at_matched:.2f} s, over --max-e2e-ms "
            f"{seconds_to_ms(request.max_e2e_seconds):g}; the plan loads it to {low:.3g} req/s, where E2E is "
            f"{found.e2e_seconds:.2f} s")
    return replace(found, notes=(*found.notes, note))


CROSSING_CANDIDATES_PER_ROW = 4
"""The crossing cap (crossing_key) is sought, best upper bound first, until a count pair's bound
falls below the (4 x shown)-th value found (crossing_entries): the pricing loop rarely reaches
further down (a miss of the E2E limit or TTFT at load), and bisecting every pair tripled the
search's time (Qwen3-30B-A3B on 4x8 H200: 0.24 -> 0.9 s). Pruned and unpruned agreed in about
4,600 comparisons (a review's sweep)."""


def crossing_entries(model, cluster, request, memo, pairs: dict, bounds: list,
                     served_per_gpu: Callable[..., float], candidates: int):
    """((p_key, N_p, crossing key, N_d, link), the workers' rates there, the count pair's best
    halving key or None) for the count pairs of the search (`pairs`: each with one of its
    halvings' keys, whether or not that cap left the prefill a TTFT budget; `bounds`: the
    Combinations priced at the halvings' caps) that could rank among the first `candidates`,
    best upper bound first (branch and bound): a pair's rate is at most min(N_p r_p(1), N_d
    r_d(c_max)) a copy (r_p falls and r_d rises with the cap; c_max the TPOT limit's cap, or the
    E2E limit's implied one where lower: O rounds of T_d(c) fit in E2E only up to it; N_p r_p(1)
    alone where no prefill meets the TTFT limit at c_max), times `served_per_gpu`; pairs stop
    once that is below the `candidates`-th value found (the halvings' bounds count as found
    without an E2E limit, which holds most of them far below their rate-matched value). A pair
    every halving of whose cap left no TTFT budget is sought too (Qwen3-235B fp8 at TTFT 100 ms:
    TPOT 40 ms found a deployment at 29 sequences, 50 ms none, its halvings all above 29; a
    review). Nothing where crossing_key does not apply."""
    if not pairs or not crossing_applies(request):
        return
    best: dict[tuple, Combination] = {}  # per count pair, its best halving entry
    for entry in sorted(bounds):
        best.setdefault((entry.p_key, memo.shapes[entry.d_key].key, entry.n_p, entry.n_d, entry.same), entry)
    found = [] if request.max_e2e_seconds is not None else \
        heapq.nlargest(candidates, (-b.neg_tokens_per_second_per_gpu for b in bounds))
    heapq.heapify(found)
    ranked = []
    for pair, d_key in pairs.items():
        p_key, shape_key, n_p, n_d, same = pair
        halving = best.get(pair)
        d_key = d_key if halving is None else halving.d_key
        shape = memo.shapes[d_key]
        top_cap = memo.top_cap.get(shape_key, 0)
        lone = _pairing(model, cluster, request, memo, p_key, _cap_key(memo, shape, 1), same)
        if top_cap <= 1 or isinstance(lone, str):
            continue
        # Little's law runs a decode rank at a fractional concurrency, so the E2E limit's implied
        # cap (whole sequences) bounds it only once raised by one (a review: an implied cap of 1
        # beaten by 1.25x at 1.27 sequences a rank)
        top = min(top_cap, memo.e2e_cap.get(shape_key, math.inf) + 1)
        # a crossing may lie up to the TPOT limit's fractional load above its whole cap (balanced_key)
        above = (*shape_key, top + 1)
        full = _pairing(model, cluster, request, memo, p_key,
                        above if top == top_cap and above in memo.load_cap else _cap_key(memo, shape, top), same)
        upper = n_p * lone[0] if isinstance(full, str) else min(n_p * lone[0], n_d * full[1])
        if request.max_e2e_seconds is not None:
            upper = min(upper, n_p * e2e_prefill_rate(model, cluster, request, memo, p_key, shape, same))
        scale = served_per_gpu(p_key, n_p, d_key, n_d, same)
        ranked.append((scale * upper, scale, (p_key, n_p, d_key, n_d, same), halving is not None))
    ranked.sort(key=lambda r: -r[0])
    for upper_served, scale, (p_key, n_p, d_key, n_d, same), priced in ranked:
        if upper_served <= 0 or len(found) >= candidates and upper_served < found[0]:
            break  # (none beyond meets the E2E limit at any load: e2e_prefill_rate)
        crossed = crossing_key(model, cluster, request, memo, p_key, n_p, d_key, n_d, same)
        if crossed is None or crossed == d_key:
            continue
        rate = _pairing(model, cluster, request, memo, p_key, crossed, same)
        if isinstance(rate, str):
            continue
        served = scale * rate_match(rate[0], n_p, rate[1], n_d).requests_per_second
        (heapq.heappush if len(found) < candidates else heapq.heappushpop)(found, served)
        yield (p_key, n_p, crossed, n_d, same), rate, d_key if priced else None


def e2e_prefill_rate(model, cluster, request, memo, p_key, shape: WorkerShape, same) -> float:
    """The most requests/s a prefill worker of p_key takes with --max-e2e-ms met beside a decode
    worker of `shape` at any cap: its prefill may take what E2E leaves after the first-token
    cost, the KV transfer and every decode round at a lone sequence's T_d(1) (latency_seconds;
    no load makes a round shorter), and max_prefill_rate gives the rate at that budget. An upper
    bound crossing_entries ranks the count pairs by (TTFT's alone let an E2E-limited Mixtral
    search bisect 299 pairs' crossings)."""
    key = (p_key, shape.key, same)
    if key not in memo.e2e_prefill_rate:
        d_key = _cap_key(memo, shape, 1)
        kv = _transfer(model, cluster, request, memo, p_key, d_key, same)
        lone = latency_seconds(request, 0.0, kv.exposed_seconds, decode_rounds(model, cluster, request, memo, shape)(1.0))
        worker, seconds = memo.prefill[p_key]
        budget = request.max_e2e_seconds - lone[1]
        memo.e2e_prefill_rate[key] = 0.0 if budget <= 0 else max_prefill_rate(
            worker, budget, seconds, memo.prefill_grid.setdefault(p_key, {}))
    return memo.e2e_prefill_rate[key]


def crossing_applies(request: ServeRequest) -> bool:
    """crossing_key's condition: a TTFT or E2E limit, and the load the search's own (no fixed
    --batch, no sent rate, no client count)."""
    return ((request.max_ttft_seconds is not None or request.max_e2e_seconds is not None) and request.batch is None
            and request.offered_rate_per_s is None and request.max_concurrency is None)


def crossing_key(model, cluster, request, memo, p_key, n_p, d_key, n_d, same) -> tuple | None:
    """With a TTFT or E2E limit, the decode cap (at most the TPOT limit's, memo.top_cap) at which
    N_p prefill and N_d decode workers complete the most requests/s within the limits, as the key
    of memo.decode; None where it does not apply (crossing_applies). The first token waits for a
    decode round at the cap, so a higher cap lowers what the prefill workers take within the limit (N_p r_p(c) falls with c) while it
    raises what the decode workers take (N_d r_d(c) rises): the most is where they cross. Found
    by bisection over whole sequences (the largest c at which the decode side still binds) with
    rate_match alone, then its neighbours and the top two caps compared (r_d steps a little
    where whole rows and experts round the decode round: not strictly monotone). The search
    ranks and prices every count pair there, so a looser --max-tpot-ms (a higher top cap, the
    same crossing) never ranks a deployment lower: the halvings of the TPOT limit's cap tried
    alone landed on either side of the crossing (Qwen3-235B fp8 on 2x8 H200 at TTFT 500 ms:
    1,127 tok/s per GPU at TPOT 95.1 ms, 1,121 at 133.9). With an E2E limit, the largest cap up to
    the crossing that meets it (E2E grows with the cap there), by bisection: the halvings and
    quarters tried (decode_caps, e2e_caps) lost goodput as the TPOT limit loosened too (Qwen3-235B
    at E2E 8 s, TTFT 800 ms: 896.3 -> 838.7 from TPOT 45 to 50 ms)."""
    if not crossing_applies(request):
        return None
    shape = memo.shapes[d_key]
    top = memo.top_cap.get(shape.key, 0)
    if top <= 1:
        return None
    memo_key = (p_key, shape.key, n_p, n_d, same)
    if memo_key not in memo.crossing:
        memo.crossing[memo_key] = _crossing(model, cluster, request, memo, p_key, shape, n_p, n_d, same, top)
    return memo.crossing[memo_key]


def load_cap(memo, d_key: tuple) -> float:
    """The most sequences a decode rank of `d_key` runs on average: its cap, or below it where the
    cap is one above the TPOT limit's (memo.load_cap)."""
    return memo.load_cap.get(d_key, memo.decode[d_key])


TPOT_LOAD_BISECTIONS = 20
"""tpot_load_cap's bisection steps over one sequence (to about 1e-6 of one)."""
TPOT_LOAD_MIN_GAIN = 0.01
"""tpot_load_cap is used where it runs at least this share more sequences than the whole cap: below
some 100 sequences, where the fraction of one more is worth an extra combination to price (under
--max-concurrency any gain: there it costs none)."""


def tpot_load_cap(model, cluster, request: ServeRequest, memo, shape: WorkerShape, cap: int,
                  engine_cap: int) -> float | None:
    """Where --max-tpot-ms stops a decode rank at `cap` whole sequences below what its engine runs
    (`engine_cap`: the KV cache, max_num_seqs, the token budget), the most it may run on average,
    C* in [cap, cap + 1) with T_d(C*) <= the limit (by bisection: T_d grows with the load, priced
    at fractional loads as a mean over whole rows, serving_time.dense_gemm_shape_utilization): a
    rank launched at cap + 1 and handed no more than C* on average meets the limit, as an E2E-bound
    deployment run below its cap does. None where the fraction gains less than TPOT_LOAD_MIN_GAIN.
    Mixtral-8x7B on 2x8 A100 at TPOT 5.7 ms: T_d(1) 4.5 ms, T_d(2) 5.72 ms, so C* = 1.98 where the
    whole cap was 1 (14.0 -> 20.5 output tok/s per GPU)."""
    limit = request.max_tpot_seconds
    if limit is None or cap < 1 or cap >= engine_cap:
        return None
    rounds = decode_rounds(model, cluster, request, memo, shape)
    low, high = float(cap), cap + 1.0
    if rounds(low) > limit or rounds(high) <= limit:  # not the TPOT limit's whole cap
        return None
    for _ in range(TPOT_LOAD_BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if rounds(middle) <= limit else (low, middle)
    # (under --max-concurrency whatever the gain: the clients' order bounds only a deployment's
    # highest cap, so the fraction costs no extra pricing, and a whole cap below the load the
    # clients keep makes them queue; Llama-3.1-8B on 1x8 H100 at 64 clients and TPOT 5.19 ms,
    # 62.2 sequences a rank where 62 was kept: 1,495.8 tok/s per GPU for 1,499.2, a review)
    gain = 0.0 if request.max_concurrency is not None else TPOT_LOAD_MIN_GAIN
    return low if low > cap * (1 + gain) else None


def _cap_key(memo, shape: WorkerShape, cap: int) -> tuple:
    """memo.decode's key of `shape` run at `cap` sequences a rank (registered)."""
    key = (*shape.key, cap)
    memo.shapes[key], memo.decode[key] = shape, cap
    return key


def _crossing(model, cluster, request, memo, p_key, shape: WorkerShape, n_p, n_d, same, top: int) -> tuple | None:
    """crossing_key's key (None: no cap leaves the prefill a TTFT budget): a whole cap's, or
    balanced_key's fractional load between the two whole caps the sides cross between."""

    def matched(c: int):
        rate = _pairing(model, cluster, request, memo, p_key, _cap_key(memo, shape, c), same)
        return None if isinstance(rate, str) else rate_match(rate[0], n_p, rate[1], n_d)

    def decode_binds(c: int) -> bool:
        at = matched(c)
        return at is not None and at.binding == "decode"

    # the largest cap at which the decode side still binds (the TPOT limit's cap where it binds there)
    low = top if decode_binds(top) else _largest_where(decode_binds, top)
    rates = {c: m.requests_per_second for c in {low - 1, low, low + 1, top - 1, top} if 1 <= c <= top
             for m in [matched(c)] if m is not None}
    best = max(rates, key=lambda c: (rates[c], c)) if rates else None
    limit = request.max_e2e_seconds

    def meets_e2e(c: int | tuple) -> bool:
        """E2E at the matched rate of cap c (or key c) within --max-e2e-ms (_loaded_latency, as
        _detail prices it)."""
        key = c if isinstance(c, tuple) else _cap_key(memo, shape, c)
        rate = _pairing(model, cluster, request, memo, p_key, key, same)
        if isinstance(rate, str):
            return False
        rate = rate_match(rate[0], n_p, rate[1], n_d).requests_per_second
        # the bound's few rounds before Little's law's solve
        return e2e_lower_bound_seconds(model, cluster, request, memo, p_key, key, same,
                                       loads_at(memo, n_p, key, n_d, rate)) <= limit and \
            _loaded_latency(model, cluster, request, memo, p_key, n_p, key, n_d, same, rate).e2e_seconds <= limit

    if best is None:
        return None
    if best in (low, low + 1):  # at the crossing: between the two whole caps, a fractional load
        balanced = balanced_key(model, cluster, request, memo, p_key, shape, n_p, n_d, same, low, top)
        if balanced is not None and balanced[1] > rates[best] and (limit is None or meets_e2e(balanced[0])):
            return balanced[0]
    if limit is None or meets_e2e(best):
        return _cap_key(memo, shape, best)
    # up to the crossing E2E grows with c (more requests/s, longer rounds): the largest c below
    # it that meets the limit; above it the prefill binds and the rate falls with c, and E2E with
    # it: the smallest c above that meets it. The one of the two that completes more (a review:
    # Qwen3-235B fp8 at 4,096-token prompts, TTFT 300 ms, E2E 3 s: cap 2 below at 1.54 req/s,
    # caps 127-134 above at 1.90)
    below = _largest_where(meets_e2e, best)
    # the caps up to which a lone prompt still meets TTFT (the round at the cap takes its budget)
    budgeted = top if matched(top) is not None else _largest_where(lambda c: matched(c) is not None, top)
    above = _smallest_where(meets_e2e, best, budgeted) if budgeted > best else 0
    met = {c: matched(c).requests_per_second for c in (below, above) if c}
    return _cap_key(memo, shape, max(met, key=lambda c: (met[c], c))) if met else None


BALANCE_BISECTIONS = 12
"""balanced_key's bisection steps over one sequence (to about 1/4,000 of one)."""


def balanced_key(model, cluster, request, memo, p_key, shape: WorkerShape, n_p, n_d, same, low: int,
                 top: int) -> tuple[tuple, float] | None:
    """(memo.decode's key, the requests/s a copy completes there) of the fractional load x in
    (low, low + 1) at which N_p prefill and N_d decode workers take the same rate, where the decode
    side binds at `low` whole sequences a rank and the prefill side one above (at the TPOT limit's
    cap `top`: at its fractional load, tpot_load_cap). The first token waits for a decode round at
    the load the ranks run, so a rank loaded to x leaves the prefill the TTFT budget of T_d(x):
    whole caps alone leave the rate between N_d r_d(low) and N_p r_p(low + 1), below the crossing's,
    and the one above is priced as if its ranks ran full while the prefill keeps them below it
    (helper-154: Qwen3-235B fp8 on 2x8 H200, 1,024-token prompts, TTFT 150 ms: 135.8 output tok/s
    per GPU at TPOT 18.7 ms, 133.3 at 19.0, as the cap the crossing lay below rose from 6.82 to 7).
    The ranks are launched at the whole cap above x (no sequence over it runs on average: Little's
    law at the crossing's rate). By bisection on x over the whole step (r_p falls and r_d rises
    with x; the same x at any TPOT limit that leaves it below C*); None where the sides do not
    cross below C* or low + 1, or at low < 1."""
    if low < 1 or low > top:
        return None
    above = (*shape.key, top + 1) if low == top else _cap_key(memo, shape, low + 1)
    if above not in memo.load_cap and low == top:
        return None
    high_load = load_cap(memo, above)

    def decode_binds(load: float) -> bool | None:
        rate = pairing_rates(model, cluster, request, memo, p_key, shape, load, same)
        return None if isinstance(rate, str) else rate_match(rate[0], n_p, rate[1], n_d).binding == "decode"

    if decode_binds(float(low)) is not True or decode_binds(high_load) is not False:
        return None
    below, over = float(low), low + 1.0  # the whole step, so its answer does not move with C*
    for _ in range(BALANCE_BISECTIONS):
        middle = (below + over) / 2
        below, over = (middle, over) if decode_binds(middle) else (below, middle)
    key = (*shape.key, memo.decode[above], below)
    memo.shapes[key], memo.decode[key], memo.load_cap[key] = shape, memo.decode[above], below
    memo.balanced.add(key)
    rate = _pairing(model, cluster, request, memo, p_key, key, same)
    return key, rate_match(rate[0], n_p, rate[1], n_d).requests_per_second


def _largest_where(holds: Callable[[int], bool], above: int) -> int:
    """The largest whole c below `above` where `holds` (true up to some c, false from there), by
    bisection; 0 where it holds nowhere."""
    low, high = 0, above
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if holds(middle) else (low, middle)
    return low


def _smallest_where(holds: Callable[[int], bool], below: int, top: int) -> int:
    """The smallest whole c in (below, top] where `holds` (false up to some c, true from there to
    top), by bisection; 0 where it does not hold at top."""
    if not holds(top):
        return 0
    low, high = below, top
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle, high)
    return high


def decode_rounds_before_first_token(request: ServeRequest) -> int:
    """A disaggregated request's decode rounds up to its first token: its own, and under async
    scheduling the one the decode worker had scheduled when the KV transfer's end came back in a
    step's output (Scheduler._update_from_kv_xfer_finished in update_from_output, then the next
    schedule(): vllm/v1/core/sched/scheduler.py, EngineCore.step_with_batch_queue, 0.33.0)."""
    return 2 if request.schedules_ahead else 1


def latency_seconds(request: ServeRequest, prefill_seconds: float, kv_exposed_seconds: float,
                    round_seconds: float) -> tuple[float, float]:
    """(TTFT, E2E) of a disaggregated request: the first-token cost, its prefill, the exposed KV
    transfer, then a whole decode round before its first token (e tokens of T_d each under
    speculative decoding), and a round per further output token. Under async scheduling
    (ServeRequest.schedules_ahead) the decode worker learns that the KV has arrived from a
    step's output, when its next step is already scheduled: one more round before the request's
    first (decode_rounds_before_first_token)."""
    ttft = (first_token_seconds(request) + prefill_seconds + kv_exposed_seconds
            + round_seconds * speculation_shape(request.speculation)[0] * decode_rounds_before_first_token(request))
    return ttft, ttft + (request.output_len - 1) * round_seconds


def e2e_floor_seconds(model, cluster, request, memo, p_key, d_key, same) -> float:
    """The pairing's E2E at no load, below its E2E at any rate (worker_loads: it grows with both
    workers' loads): the first-token cost, one prompt's prefill alone on its worker, the KV
    transfer, then a lone sequence's decode rounds. Above --max-e2e-ms, every count pair of the
    pairing misses it, and no lower decode cap helps (a lone sequence is the least load)."""
    key = (p_key, d_key, same)
    if key not in memo.e2e_floor:
        memo.e2e_floor[key] = lone_latencies(model, cluster, request, memo, p_key, d_key, same)[1]
    return memo.e2e_floor[key]


def lone_latencies(model, cluster, request, memo, p_key, d_key, same) -> tuple[float, float]:
    """(TTFT, E2E) of one request alone on the pairing (latency_seconds): its prompt's prefill
    with no queue, the KV transfer, a lone sequence's decode rounds."""
    worker, seconds = memo.prefill[p_key]
    t_d = decode_rounds(model, cluster, request, memo, memo.shapes[d_key])(1.0)
    kv = _transfer(model, cluster, request, memo, p_key, d_key, same)
    return latency_seconds(request, prefill_at_rate(worker, 0.0, seconds).prefill_seconds, kv.exposed_seconds, t_d)


E2E_BOUND_ITERATIONS = 2
"""Fixed-point steps of e2e_lower_bound_seconds' decode concurrency from below..."""
E2E_CEILING_ITERATIONS = 4
"""...and of e2e_rate_ceiling's (each step tightens the bound; a ceiling is priced once per
combination, and a tighter one spares e2e_limited's pricing)."""


def e2e_lower_bound_seconds(model, cluster, request, memo, p_key, d_key, same, loads: tuple[float, float],
                            iterations: int = E2E_BOUND_ITERATIONS, whole: bool = False) -> float:
    """A lower bound on the E2E _detail prices at these worker loads, from a few rounds instead of
    decode_concurrency_at_rate's false position: Little's law C = r O T(C) with T growing in C has its
    solutions at or above every step of the iteration C_(k+1) = r O T(C_k) from C_0 = 1 (each step
    stays below any fixed point), and the solve keeps one of them, so T at C_2 (capped where
    its bracket ends) is at most the decode round _detail uses; the prefill and KV terms
    are _detail's own. `whole`: each round at the whole sequences below its load, T(floor C) <= T(C),
    a looser bound from rounds the memo keeps (the clients' order bounds thousands of combinations
    at loads that recur nowhere else: Qwen3-30B-A3B on 2x8 H200 at 64 clients, TTFT 300 ms, priced
    some 50,000 rounds)."""
    prefill_rate, decode_rate = loads
    worker, seconds = memo.prefill[p_key]
    cap = load_cap(memo, d_key)
    exact_rounds = decode_rounds(model, cluster, request, memo, memo.shapes[d_key])
    round_seconds = (lambda load: exact_rounds(float(math.floor(load)))) if whole else exact_rounds
    rate = decode_rate * request.output_len
    ceiling = min(cap, rate * round_seconds(cap))
    concurrency = 1.0
    for _ in range(iterations):
        concurrency = min(ceiling, rate * round_seconds(max(1.0, concurrency)))
    t_d = round_seconds(max(1.0, concurrency))
    kv = _transfer(model, cluster, request, memo, p_key, d_key, same)
    return latency_seconds(request, prefill_at_rate(worker, prefill_rate, seconds).prefill_seconds,
                           kv.exposed_seconds, t_d)[1]


def worker_loads(model, cluster, request, memo, p_key, n_p, d_key, n_d, same) -> tuple[float, float]:
    """(requests/s per prefill worker, per decode rank) at the pairing's rate-matched load. For one
    (prefill shape, decode shape and cap, link) E2E grows with both (a prefill worker's M/D/1 wait
    and service, prefill_at_rate; a decode rank's Little's-law concurrency, hence its round,
    decode_concurrency_at_rate), so a count pair at or above both loads of one that missed
    --max-e2e-ms misses too: the search skips it without pricing it (an E2E-limited search of
    Qwen3-30B on 128 H200 priced some 26,000 pairings, 72 s; found by a CLI sweep)."""
    rate = matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same).requests_per_second
    return loads_at(memo, n_p, d_key, n_d, rate)


def loads_at(memo, n_p: int, d_key: tuple, n_d: int, rate_per_s: float) -> tuple[float, float]:
    """(requests/s per prefill worker, per decode rank) when the combination takes `rate_per_s`."""
    return rate_per_s / n_p, rate_per_s / (n_d * memo.shapes[d_key].dp)


def matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same) -> RateMatch:
    """The combination's rate match: what its N_p prefill and N_d decode workers take within the
    limits (_pairing's per-worker rates), the smaller side binding."""
    r_p, r_d = _pairing(model, cluster, request, memo, p_key, d_key, same)
    return rate_match(r_p, n_p, r_d, n_d)


class Combination(NamedTuple):
    """One deployment the disaggregated search may price: n_p prefill workers of one shape and
    n_d decode workers of another, on one node or across (`same`), with the bound it is ordered
    by (tuple order: the most goodput per planned GPU first, then the most requests/s per GPU
    the workers use)."""

    neg_tokens_per_second_per_gpu: int
    """-(output tokens/s per planned GPU, rounded), at the workers' matched rates."""
    neg_requests_per_second_per_gpu: float
    """-(requests/s per GPU of the workers)."""
    p_key: tuple
    n_p: int
    d_key: tuple
    n_d: int
    same: bool
    """Prefill and decode workers on the same node (KV over NVLink) or not."""
    requests_per_second: float
    """What the plan's copies of the deployment complete at their matched rates."""
    capacity_per_second: float
    """At a sent --request-rate, what they complete at the most (rate_capacity_per_second), the
    rate it runs them up to, so whether they keep up with it; without one, requests_per_second."""


class LoadedLatency(NamedTuple):
    """_loaded_latency's answer: what the combination runs at one rate."""

    prefill: PrefillLoad
    decode_concurrency: float
    round_seconds: float
    kv: KvTransfer
    ttft_seconds: float
    e2e_seconds: float


def _loaded_latency(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, rate: float,
                    clients: int | None = None) -> LoadedLatency:
    """The combination handed `rate` requests/s: prefill at R / N_p (prefill_at_rate), each decode
    rank at the C_d' that Little's law gives it, C_d' = R / (N_d d) * O * T_d(C_d')
    (decode_concurrency_at_rate), the KV transfer, and the TTFT and E2E they make. Under
    --max-concurrency a copy holding `clients` of them (None: the busiest copy's, the clients
    over the combination's copies rounded up) runs no more than those. Memoized per combination,
    rate and clients (memo.loaded): a client-bound search prices the same rates for its bound
    (clients_rate_bound) and its closed loop's bracket."""
    if request.max_concurrency is not None and clients is None:
        clients = -(-request.max_concurrency // combination_copies(cluster, request, memo, p_key, n_p, d_key, n_d,
                                                                    same)[1])
    key = (p_key, n_p, d_key, n_d, same, rate, clients)
    if key not in memo.loaded:
        memo.loaded[key] = _loaded_latency_at(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, rate,
                                              clients)
    return memo.loaded[key]


def _loaded_latency_at(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, rate: float,
                       clients: int | None) -> LoadedLatency:
    """_loaded_latency, not memoized."""
    shape_d = memo.shapes[d_key]
    worker, seconds = memo.prefill[p_key]
    round_seconds = decode_rounds(model, cluster, request, memo, shape_d)
    ranks, most = n_d * shape_d.dp, load_cap(memo, d_key)
    if clients is not None:
        # no more sequences decode than the copy has clients: where a decode round shortens as the
        # load grows (past vLLM's fused all-reduce size), Little's law had a root above them, which
        # the closed loop took where its bracket held it (a review: Qwen3-235B fp8 on 2x8 H200 at 64
        # clients priced at 64.0 sequences decoding, 188.7 tok/s per GPU, where 62.9 run, 182.5;
        # with several copies, each copy's own clients, not all of them)
        most = min(most, clients / ranks)
    c_actual = decode_concurrency_at_rate(rate / ranks, request.output_len, round_seconds, most)
    t_d = round_seconds(max(1.0, c_actual))
    load = prefill_at_rate(worker, rate / n_p, seconds)
    kv = _transfer(model, cluster, request, memo, p_key, d_key, same)
    ttft, e2e = latency_seconds(request, load.prefill_seconds, kv.exposed_seconds, t_d)
    return LoadedLatency(load, c_actual, t_d, kv, ttft, e2e)


def client_bound_rate(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, clients: float) -> float:
    """disaggregated.closed_loop_rate of the combination: its rate-matched capacity, E2E at a rate
    from _loaded_latency."""
    capacity = matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same).requests_per_second

    def e2e_at(rate: float) -> float:
        return _loaded_latency(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, rate,
                               math.ceil(clients)).e2e_seconds

    # (clients_rate_bound's upper bound brackets the closed loop's search)
    upper = client_rate_upper(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, clients) \
        if clients >= 1 else None
    return closed_loop_rate(clients, capacity, e2e_at, upper)


def client_rate_upper(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, clients: float) -> float:
    """Above the rate `clients` closed-loop clients keep one copy of the combination at
    (clients_rate_bound with the E2E _loaded_latency prices, memoized per rate)."""
    capacity = matched_load(model, cluster, request, memo, p_key, n_p, d_key, n_d, same).requests_per_second
    return clients_rate_bound(math.ceil(clients), 1, capacity, lambda rate: _loaded_latency(
        model, cluster, request, memo, p_key, n_p, d_key, n_d, same, rate, math.ceil(clients)).e2e_seconds)


def _detail(model, cluster, request, memo, p_key, n_p, d_key, n_d, same, max_model_len,
            load_rate: float | None = None, binding: str = "clients",
            check_limits: bool = True) -> DisaggEstimate | str:
    """The combination at its rate-matched load (_loaded_latency at R = rate_match's); with
    `load_rate`, the lower rate closed-loop clients keep it at (client_bound; binding
    "clients") or a finite --request-rate sends (rate_bound; binding "request-rate").
    `check_limits` False: TTFT and E2E are not checked (client_bound checks them at the clients'
    load)."""
    r_p, r_d = _pairing(model, cluster, request, memo, p_key, d_key, same)
    match = rate_match(r_p, n_p, r_d, n_d)
    if load_rate is not None:
        match = replace(match, requests_per_second=load_rate, binding=binding)
    shape_p, shape_d = memo.prefill_shapes[p_key], memo.shapes[d_key]
    worker, c_d = memo.prefill[p_key][0], memo.decode[d_key]
    load, c_actual, t_d, kv, ttft, e2e = _loaded_latency(model, cluster, request, memo, p_key, n_p, d_key, n_d,
                                                         same, match.requests_per_second)
    decode_wait_seconds = 0.0
    if binding == "request-rate" and request.max_concurrency is None:
        # Poisson arrivals find every decode slot (--max-num-seqs C_d a rank) taken now and then
        # and wait for one, each holding it O rounds of the rank's decode at the sequences it runs
        # (continuous_batching.pooled_slot_wait_seconds, the ranks' slots one queue behind the
        # proxy's routing)
        ranks, slots = n_d * shape_d.dp, math.floor(c_d)
        if slots >= 1:
            rounds_of = decode_rounds(model, cluster, request, memo, shape_d)
            held = on_geometric_grid(lambda n: request.output_len * rounds_of(float(n)), slots)
            decode_wait_seconds = pooled_slot_wait_seconds(c_actual, slots, ranks, request.output_len * t_d, held,
                                                           request.output_len_cv2)
        if not math.isfinite(decode_wait_seconds):  # at the slots' capacity: rate_match's, not a queue
            decode_wait_seconds = 0.0
        ttft, e2e = ttft + decode_wait_seconds, e2e + decode_wait_seconds
    if check_limits and request.max_e2e_seconds is not None and e2e > request.max_e2e_seconds:
        return E2E_MISS
    if check_limits and request.max_ttft_seconds is not None and ttft > request.max_ttft_seconds:
        return TTFT_MISS
    if request.max_tpot_seconds is not None and t_d > request.max_tpot_seconds * (1 + TPOT_CHECK_TOLERANCE):
        return TPOT_MISS
    nodes = unit_nodes(n_p, shape_p.num_gpus, n_d, shape_d.num_gpus, same, cluster)
    notes = []
    caps = {"prefill": kv_link_requests_per_second(kv, shape_p.num_gpus),
            "decode": kv_link_requests_per_second(kv, shape_d.num_gpus)}
    if match.binding in caps and (r_p, r_d)[match.binding == "decode"] == caps[match.binding]:
        notes.append(f"the KV link binds: a {match.binding} worker's links move at most {caps[match.binding]:.2f} "
                     f"prompts/s ({kv.bytes_per_request / BYTES_PER_MIB:,.0f} MiB of KV each over "
                     f"{kv.link_kind}), below what its GPUs compute")
    full = decode_rounds(model, cluster, request, memo, shape_d)(float(c_d))
    if d_key in memo.load_cap and request.max_tpot_seconds is not None and full > request.max_tpot_seconds:
        why = ("where the prefill workers' rate within --max-ttft-ms (less a decode round at that load) meets the "
               "decode ranks'" if d_key in memo.balanced else "the most whose rounds meet --max-tpot-ms")
        notes.append(f"TPOT-bound: each decode rank is launched at --max-num-seqs {c_d:g} and loaded to at most "
                     f"{memo.load_cap[d_key]:.2f} sequences on average (it runs {c_actual:.2f}), {why}; with all "
                     f"{c_d:g} running, a round takes {ms_above(full, request.max_tpot_seconds, 2, 6)} ms, over --max-tpot-ms "
                     f"{seconds_to_ms(request.max_tpot_seconds):g}, so a burst that fills them runs over it while it lasts")
    if decode_wait_seconds >= SLOT_WAIT_NOTE_FRACTION * ttft:
        notes.append(f"Slot-bound: with at most {math.floor(c_d):,} sequence(s) running per decode rank (its "
                     f"--max-num-seqs), arrivals find every slot busy at times and wait {seconds_to_ms(decode_wait_seconds):,.0f} "
                     f"ms for one on average (a queue in front of ranks that slow as they fill), in TTFT and E2E latency")
    busy = tokenizer_utilization(request, match.requests_per_second, n_p, n_d)
    if busy >= TOKENIZER_NOTE_UTILIZATION:
        notes.append(f"Tokenizer-bound: at {match.requests_per_second:.3g} req/s the busiest server's tokenizer "
                     f"thread is busy {busy:.0%} of the time ({request.input_len:,}-token prompts, one at a time; its "
                     f"queue is not in the TTFT shown"
                     + ("; past 100% it grows as long as requests come" if busy >= 1 else "")
                     + f"): more threads per server (--renderer-num-workers, now {request.tokenizer_workers}) or "
                       f"prompts sent as token ids")
    if not same:
        notes.append(f"prefill and decode on different nodes: the KV transfer over {kv.link_kind} adds "
                     f"{seconds_to_ms(kv.exposed_seconds):.1f} ms to TTFT "
                     + (f"(TTFT {seconds_to_ms(ttft):.0f} ms within --max-ttft-ms {seconds_to_ms(request.max_ttft_seconds):g})"
                        if request.max_ttft_seconds is not None else "(no TTFT limit)"))
    # vLLM refuses max_num_seqs above the step's token budget
    seqs = min(default_max_num_seqs(cluster, request.engine_versions.vllm_release),
               max_num_batched_tokens(cluster, role_request(request, "prefill"), shape_p.layout))

    def plan(shape: WorkerShape, workers: int, concurrency: float, round_s: float, max_seqs: int) -> WorkerPlan:
        mem = max(s.weights_bytes + s.kv_cache_bytes for s in shape.stages)
        return WorkerPlan(shape.tp, shape.pp, workers, concurrency, round_s, shape.kv_cache_tokens, max_seqs, mem,
                          shape.stages, shape.dp)

    return DisaggEstimate(
        prefill=plan(shape_p, n_p, load.prompts_per_step, load.round_seconds, seqs),
        decode=plan(shape_d, n_d, c_actual, t_d, c_d),
        kv=kv, same_node=same, ttft_seconds=ttft, tpot_seconds=t_d, e2e_seconds=e2e,
        requests_per_second=match.requests_per_second, binding=match.binding,
        max_model_len=max_model_len, num_nodes_used=nodes, notes=tuple(notes),
        output_len=request.output_len, prefill_load=load, steps_per_prompt=worker.steps_per_prompt,
        first_token_seconds=first_token_seconds(request), rate=match,
        decode_rounds_before_first_token=decode_rounds_before_first_token(request))
