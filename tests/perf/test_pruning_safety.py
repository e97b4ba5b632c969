"""The pruned training search never drops the optimum (docs/cost-model.md#training-search-and-pruning).

The reference enumerates every combination of the search space with itertools.product and
estimates each one, no pruning at all: every (tp, pp, dp), every micro-batch, 1F1B,
interleaved with every v, GPipe, every recompute level, sequence parallelism on and off,
every ZeRO stage, for an MoE model every expert-parallel degree the layouts offer
(layout.expert_parallel_degrees, over the CP and DP ranks), and every context-parallel degree of the search space
(train_search.cp_options: powers of two splitting dp, s divisible by 2*cp, at least
MIN_CP_CHUNK_TOKENS per rank), ZeRO-2/3 tried there too. The pruned search (planner/train_search.py) must then
  - rank first exactly the configuration the reference ranks first (same rank key);
  - keep, for every configuration it could reach (all but GPipe), precisely the least
    recomputation the reference finds to fit: so its whole feasible set, hence its top-k,
    is what the reference gives once more recomputation of a fitting configuration is
    dropped;
  - lose nothing by leaving GPipe out: a GPipe configuration runs in the time of the
    same 1F1B one and holds at least its memory (where its micro-batches in flight push it to
    a slower stage split that fits, the 1F1B one is faster).
No timing here: speed is measured by bench/bench_plan.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.layout import Rejected, TrainConfig, divisors, expert_parallel_degrees, factorizations
from planner.memo import Memo
from planner.requests import TrainRequest
from planner.search import Plan
from planner.specs import ClusterSpec, ModelSpec
from planner.train import TrainEstimate, estimate, train_rates, trained_model
from planner.train_search import (
    MAX_MICRO_BATCH_SIZE,
    MEMORY_TIE_FRACTION,
    RECOMPUTE_ORDER,
    TIGHT_MEMORY_FRACTION,
    cp_options,
    partial_recompute_configs,
    prefer_headroom,
    rank_key,
    schedule_options,
    search,
    step_seconds_floor,
)

MICRO_BATCHES = list(range(1, MAX_MICRO_BATCH_SIZE + 1))


def every_config(model: ModelSpec, num_gpus: int, attention: str = "flash",
                 gpus_per_node: int = 8, request: TrainRequest | None = None) -> Iterator[TrainConfig]:
    """The whole space, invalid combinations included (estimate rejects those); with a
    request, also its context-parallel degrees (cp ranks taken from dp)."""
    for layout in factorizations(num_gpus):
        for cp in [1] + (cp_options(request, layout.dp, layout.pp) if request is not None else []):
            yield from _every_config_of(model, layout.tp, layout.pp, layout.dp // cp, cp, attention,
                                        gpus_per_node)


def _every_config_of(model: ModelSpec, tp: int, pp: int, dp: int, cp: int, attention: str,
                     gpus_per_node: int) -> Iterator[TrainConfig]:
    eps = [1] + (expert_parallel_degrees(tp, dp * cp, gpus_per_node, model.num_local_experts, widest=True)
                 if model.is_moe else [])
    # every v that divides the layers (an uneven split needs v to divide each stage's
    # layers, an even one L/p) or the layers + 2 (the embedding and loss counted as layers);
    # estimate rejects the rest. Where stages cannot be even, estimate applies the split
    # rule (cost/stage_split.py): not a search dimension.
    L = model.num_hidden_layers
    schedules = [("1f1b", 1), ("gpipe", 1)]
    # and, p not dividing L, every v dividing ceil(L/p) (Megatron's layout string). With p dividing
    # L the search's space is the v dividing L/p (or (L + 2)/p): a --virtual-stages asked for may run
    # others through the layout string (20-layer stages at v = 3), which the search does not try
    if L % pp == 0:
        chunk_counts = set(divisors(L // pp)) | (set(divisors((L + 2) // pp)) if (L + 2) % pp == 0 else set())
    else:
        chunk_counts = set(divisors(L)) | set(divisors(L + 2)) | set(divisors(-(-L // pp)))
    schedules += [("interleaved", v) for v in sorted(chunk_counts) if v > 1]
    zeros = (0, 1, 2, 3) if dp * cp > 1 else (0,)  # sharding over one rank is no sharding
    for (schedule, v), b, recompute, sp, zero, ep in itertools.product(
            schedules, MICRO_BATCHES, RECOMPUTE_ORDER, (False, True), zeros, eps):
        yield TrainConfig(tp, pp, dp, b, schedule, v, recompute, sp, zero, attention=attention, ep=ep, cp=cp)


def exhaustive(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> list[TrainEstimate]:
    """Every fitting configuration; with full recompute also every block count k (Megatron's
    --recompute-method block: the first k layers of each chunk rerun) from 1 to K-1
    (train_search.partial_recompute_configs: K the most layers a chunk holds), where recomputing
    every layer fits or where K-1 does (a stage's memory only falls as k grows, up to K-1)."""
    rates = train_rates(model, cluster)
    configs = list(every_config(model, cluster.num_gpus, request.attention, cluster.gpus_per_node, request))
    results = [estimate(model, cluster, c, request, rates) for c in configs]
    fitting = [r for r in results if isinstance(r, TrainEstimate)]
    for config, full in zip(configs, results, strict=True):
        if config.recompute != "full" or isinstance(full, Rejected) and full.over_bytes <= 0:
            continue
        blocks = [estimate(model, cluster, partial, request, rates)
                  for partial in reversed(partial_recompute_configs(model, config, full))]
        if isinstance(full, Rejected) and blocks and not isinstance(blocks[0], TrainEstimate):
            continue  # out of memory keeping one layer a chunk: with fewer kept, too (checked below)
        fitting += [r for r in blocks if isinstance(r, TrainEstimate)]
    return sorted(fitting, key=rank_key)


def recompute_order(c: TrainConfig) -> tuple[int, float]:
    """Less recomputation first: the levels' order, block counts k (Megatron) or every N-th block
    from the largest N (torchtitan) before every layer."""
    if c.recompute_every is not None:
        return RECOMPUTE_ORDER.index(c.recompute), -c.recompute_every
    k = c.recompute_num_layers
    return RECOMPUTE_ORDER.index(c.recompute), float("inf") if k is None else k


def least_recompute(results: list[TrainEstimate]) -> dict[tuple, TrainEstimate]:
    """Per configuration apart from recompute: the fitting estimate with the least of it, or,
    where that one fits only by running something slower for memory (memory_fallback), the
    fastest of it and the levels after it up to the first that needs no fallback (a tie to the
    lesser recompute): what the search keeps (train_search._first_fitting)."""
    by_key: dict[tuple, list[TrainEstimate]] = {}
    for r in results:
        c = r.config
        key = (c.tp, c.cp, c.pp, c.dp, c.ep, c.micro_batch_size, c.schedule, c.virtual_stages,
               c.sequence_parallel, c.zero_stage)
        by_key.setdefault(key, []).append(r)
    best: dict[tuple, TrainEstimate] = {}
    for key, fitting in by_key.items():
        fitting.sort(key=lambda r: recompute_order(r.config))
        for r in fitting:
            if key not in best or r.tokens_per_second > best[key].tokens_per_second:
                best[key] = r
            if not r.memory_fallback:
                break
        chosen = best[key]
        if (chosen.config.recompute_num_layers is not None or chosen.config.recompute_every is not None) \
                and not roomy(chosen):
            # a block count at the edge of memory gives way to the least roomier one within the tie
            # (train_search.roomier_block)
            more = [r for r in fitting[fitting.index(chosen) + 1:]
                    if (r.config.recompute_num_layers, r.config.recompute_every) != (None, None) and roomy(r)]
            if more and more[0].tokens_per_second >= (1 - MEMORY_TIE_FRACTION) * chosen.tokens_per_second:
                best[key] = more[0]
    return best


def roomy(e: TrainEstimate) -> bool:
    """Whether the estimate leaves TIGHT_MEMORY_FRACTION of the GPU free."""
    return e.capacity_per_gpu_bytes - e.memory_per_gpu_bytes >= TIGHT_MEMORY_FRACTION * e.capacity_per_gpu_bytes


def check_pruning_is_safe(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                          reference: list[TrainEstimate] | None = None) -> None:
    """The pruned search's best rows against the exhaustive `reference` (computed when None)."""
    reference = exhaustive(model, cluster, request) if reference is None else reference
    pruned = search(model, cluster, request).layouts
    assert bool(reference) == bool(pruned)
    if not reference:
        return
    best = max(r.tokens_per_second for r in pruned)
    assert best == pytest.approx(max(r.tokens_per_second for r in reference), rel=1e-12)  # ties summed in another order

    expected = least_recompute(reference)
    reachable = {k: r for k, r in expected.items() if k[6] != "gpipe"}
    ranked = sorted(reachable.values(), key=rank_key)
    assert ranked[0] == reference[0]
    assert sorted(pruned, key=rank_key) == ranked
    # the search's order: rank_key's, then room in memory first within a near tie (single node here:
    # TP never leaves it, so prefer_tp_inside_a_node moves nothing)
    ordered = prefer_headroom(Plan(model=model, cluster=cluster, request=request, num_gpus=cluster.num_gpus,
                                   layouts=tuple(ranked), rejected=()), cluster).layouts
    assert list(ordered) == list(pruned)

    # the stage split is the estimate's (the fastest that fits), so GPipe, holding more micro-batches,
    # may run a slower split than the same 1F1B configuration: never a faster one
    # (and the token dispatcher: GPipe's micro-batches in flight can leave no room for DeepEP's
    # buffers where 1F1B's leave it, so it falls back to NCCL's all-to-all, slower)
    unsplit = {replace(r.config, first_last_layers=None, account_for_embedding_and_loss=False,
                       moe_dispatcher="alltoall"): r for r in reference}
    # (block recompute's k: each schedule's own range, from its own split; every layer compared)
    for gpipe in (r for r in reference if r.config.schedule == "gpipe" and r.config.recompute_num_layers is None):
        same_1f1b = unsplit[replace(gpipe.config, schedule="1f1b", first_last_layers=None,
                                    account_for_embedding_and_loss=False, moe_dispatcher="alltoall")]
        assert same_1f1b.tokens_per_second >= gpipe.tokens_per_second
        if (same_1f1b.config.first_last_layers, same_1f1b.config.moe_dispatcher) == (
                gpipe.config.first_last_layers, gpipe.config.moe_dispatcher):
            assert same_1f1b.tokens_per_second == gpipe.tokens_per_second
            assert same_1f1b.memory_per_gpu_bytes <= gpipe.memory_per_gpu_bytes


THIRTY_LAYERS = resolve_model("llama-3.1-8b").model_copy(update={"num_hidden_layers": 30,
                                                                 "name": "llama-3.1-8b-30-layers"})
"""30 layers: pp = 4, 8 and 16 need uneven first/last stages (8 | 7 7 | 8 ... 1 | 2 x14 | 1)."""

CASES = {
    # tight memory: no recompute, selective and full all win somewhere, larger b run out
    "llama-3.1-8b on 2x8xA100-40GB": ("llama-3.1-8b", "2x8xA100-40GB", 64, 4096),
    "gpt3-175b on 4x8xH100": ("gpt3-175b", "4x8xH100", 64, 2048),
    "mistral-7b on 8x8xA100": ("mistral-7b", "8x8xA100", 128, 4096),
    # MoE: expert-parallel degrees, SP required with TP, experts dividing ep, recompute "outputs"
    "qwen3-30b-a3b on 1x8xH100": ("qwen3-30b-a3b", "1x8xH100", 32, 2048),
    # MoE with CP: EP groups over the CP and DP ranks (cp 2 with ep 2, 4, 8)
    "qwen3-30b-a3b at 8K on 1x8xH100": ("qwen3-30b-a3b", "1x8xH100", 8, 8192),
    # context parallelism: cp 2 and 4 (4,096+ tokens per rank) against cp 1, tight memory
    "llama-3.1-8b at 16K on 2x8xA100-40GB": ("llama-3.1-8b", "2x8xA100-40GB", 16, 16384),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_pruned_search_keeps_the_optimum(case: str) -> None:
    """And, on the same enumeration (the costliest part of both checks), the bounded search's
    floor (check_the_floor)."""
    model_name, cluster_name, global_batch, seq_len = CASES[case]
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    request = TrainRequest(global_batch=global_batch, seq_len=seq_len)
    reference = exhaustive(model, cluster, request)
    check_pruning_is_safe(model, cluster, request, reference)
    if reference:  # nothing fits gpt3's case
        check_the_floor(model, cluster, request, reference)


def check_the_floor(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                    reference: list[TrainEstimate]) -> None:
    """Every configuration the search can reach (v up to the search's largest for its pp),
    MoE included, steps no faster than train_search.step_seconds_floor of its (layout, b, SP,
    recompute): what the bounded search (tests/perf/test_bounded_search.py) skips by."""
    assert trained_model(model, request) == model  # no MTP modules: the reference is the trained model's
    rates, memo = train_rates(model, cluster), Memo()
    checked = 0
    for e in reference:
        c = e.config
        v_max = max(v for _, v in schedule_options(model, request, c.pp))
        if c.virtual_stages > v_max:  # a v the search never tries
            continue
        floor = step_seconds_floor(model, cluster, request, c.layout, c.micro_batch_size, c.sequence_parallel,
                                   c.recompute, v_max, rates, memo)
        assert floor <= e.step_time_seconds * (1 + 1e-12), (c, floor, e.step_time_seconds)
        checked += 1
    assert checked > 50


@pytest.mark.parametrize(("cluster_name", "global_batch", "seq_len"), [
    ("2x8xA100-40GB", 64, 4096), ("2x8xH100", 32, 2048), ("4x4xA100", 48, 8192)])
def test_pruned_search_keeps_the_optimum_with_uneven_stages(cluster_name: str, global_batch: int,
                                                            seq_len: int) -> None:
    cluster = resolve_cluster(cluster_name)
    request = TrainRequest(global_batch=global_batch, seq_len=seq_len)
    check_pruning_is_safe(THIRTY_LAYERS, cluster, request)
    uneven = [e for e in search(THIRTY_LAYERS, cluster, request).layouts if e.config.first_last_layers]
    assert uneven, "the case must exercise uneven splits"


def test_the_cases_exercise_every_pruning_rule() -> None:
    """The first case has configurations that fit without recompute, some that need
    selective or full, and some out of memory even with full recompute. Materialized
    attention: with flash, selective recompute saves no memory (no scores are kept), so
    it is never the least recompute that fits."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("2x8xA100-40GB")
    request = TrainRequest(global_batch=64, seq_len=4096, attention="materialized")
    rates = train_rates(model, cluster)
    results = {c: estimate(model, cluster, c, request, rates)
               for c in every_config(model, cluster.num_gpus, "materialized")}
    fitting = least_recompute([r for r in results.values() if isinstance(r, TrainEstimate)])
    # "outputs" frees nothing in a dense GQA model and "op" is torchtitan's: neither is a level
    # of this Megatron request (estimate rejects both)
    assert {r.config.recompute for r in fitting.values()} == set(RECOMPUTE_ORDER) - {"outputs", "op"}
    assert all(isinstance(r, Rejected) for c, r in results.items() if c.recompute in ("outputs", "op"))
    assert any(isinstance(r, Rejected) and r.over_bytes > 0 and c.recompute == "full"
               for c, r in results.items())


def test_the_moe_case_exercises_the_outputs_level() -> None:
    """Qwen3-30B-A3B on 8 H100 at 2,048 tokens: some configurations fit first with "outputs"
    (Megatron's output-discarding checkpoints), others with none or full."""
    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("1x8xH100")
    reference = exhaustive(model, cluster, TrainRequest(global_batch=32, seq_len=2048))
    assert {r.config.recompute for r in least_recompute(reference).values()} >= {"none", "outputs", "full"}


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    model_name=st.sampled_from(["llama-3.1-8b", "mistral-7b", "llama-3.1-70b"]),
    nodes_x_gpus=st.sampled_from([(1, 8), (2, 4), (2, 8), (4, 4)]),
    gpu=st.sampled_from(["A100-40GB", "A100", "H100"]),
    global_batch=st.sampled_from([16, 32, 48, 96]),
    seq_len=st.sampled_from([1024, 4096, 8192]),
)
def test_pruning_is_safe_on_random_small_cases(model_name: str, nodes_x_gpus: tuple[int, int], gpu: str,
                                               global_batch: int, seq_len: int) -> None:
    num_nodes, gpus_per_node = nodes_x_gpus
    model = resolve_model(model_name)
    cluster = resolve_cluster(f"{num_nodes}x{gpus_per_node}x{gpu}")
    check_pruning_is_safe(model, cluster, TrainRequest(global_batch=global_batch, seq_len=seq_len))


def test_the_cp_case_exercises_context_parallelism() -> None:
    """The CP case has a cp > 1 configuration within 1% of the best (it ties tp=4 with
    Megatron-FSDP there) and keeps cp 2 and 4 with both no and full recomputation among the
    feasible ones (so the pruning rules act on CP layouts)."""
    model_name, cluster_name, global_batch, seq_len = CASES["llama-3.1-8b at 16K on 2x8xA100-40GB"]
    plan = search(resolve_model(model_name), resolve_cluster(cluster_name),
                  TrainRequest(global_batch=global_batch, seq_len=seq_len))
    best_cp = max(e.tokens_per_second for e in plan.layouts if e.config.cp > 1)
    assert best_cp >= 0.99 * plan.layouts[0].tokens_per_second
    assert {e.config.cp for e in plan.layouts} == {1, 2, 4}
    assert {e.config.recompute for e in plan.layouts if e.config.cp > 1} >= {"none", "full"}
