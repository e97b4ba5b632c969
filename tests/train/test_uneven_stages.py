"""Uneven pipeline stages (Megatron's --decoder-first/last-pipeline-num-layers): the split
rule, memory per stage, the search for llama-3.1-405b (126 layers) and the emitted flags."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import stage_split as split
from planner.cost.stage_split import StageSeconds
from planner.explain_train import explain_training
from planner.layout import Rejected, TrainConfig
from planner.render.explain import render_explanation
from planner.requests import LayoutFilter, TrainRequest
from planner.train import (
    TrainEstimate,
    estimate,
    memory_per_gpu,
    stage_memories,
    train_rates,
    with_stage_split,
)
from planner.train_search import search

LLAMA_405B = resolve_model("llama-3.1-405b")
H100_128 = resolve_cluster("128x8xH100")
LOGITS_HEAVY = StageSeconds(seconds_per_layer=1.0, first_extra_seconds=0.01, last_extra_seconds=0.26)
"""405B on H100 at tp=8, b=1, s=8192, full recompute: the embedding's accumulation is 0.011
of a layer, the LM head + loss 0.263 (planner.cost.training_time.stage_seconds)."""


def test_126_layers_over_4_stages():
    """U = 126, p = 4: bound ceil(126/4) + 1 = 33. Middle c = 32 leaves 126 - 2*32 = 62 for
    first + last: (31, 31) -> slowest max(31.01, 32, 31.26) = 32; (32, 30) ties at 32 but has
    the heavier first stage; (30, 32) -> 32.26. c = 31 leaves 64: at best (33, 31) -> 33.01.
    c = 33 leaves 60: (30, 30) -> 33. So 31 | 32 32 | 31."""
    assert split.best_split(126, 4, 1, LOGITS_HEAVY) == (31, 31)
    assert split.layers_per_stage(126, 4, (31, 31)) == (31, 32, 32, 31)


def test_126_layers_over_8_stages():
    """p = 8: c = 16 leaves 126 - 6*16 = 30: (15, 15) -> slowest 16 (a middle stage);
    (16, 14) ties with a heavier first; (14, 16) -> 16.26. c = 15 leaves 36 -> at best
    (18, 18) -> 18.26; c = 17 leaves 24 -> (12, 12), slowest 17. So 15 | 16 x6 | 15."""
    assert split.best_split(126, 8, 1, LOGITS_HEAVY) == (15, 15)


def test_126_layers_over_16_stages_is_llamas():
    """p = 16: c = 8 leaves 126 - 14*8 = 14: (7, 7) -> slowest 8; c = 7 leaves 28 -> (14, 14)
    is over the bound ceil(126/16) + 1 = 9 and (9, 19) too. So 7 | 8 x14 | 7, the split Meta
    ran Llama 3 405B with (one layer fewer on the first and the last stage)."""
    assert split.best_split(126, 16, 1, LOGITS_HEAVY) == (7, 7)


def test_interleaved_split_is_in_chunks():
    """v = 2, p = 16: U = 63 units, c = 4 units leaves 63 - 14*4 = 7 units: (4, 3) units ->
    slowest max(8.01, 8, 6.26) = 8.01; (3, 4) -> 8.26. So 8 | 8 x14 | 6 layers, each a multiple
    of 2; v = 4 does not divide 126, so no split (Megatron needs every stage divisible by v)."""
    assert split.best_split(126, 16, 2, LOGITS_HEAVY) == (8, 6)
    assert not split.has_split(126, 16, 4)


def test_the_model_picks_the_hand_worked_splits():
    rates = train_rates(LLAMA_405B, H100_128)
    for pp, expected in ((4, (31, 31)), (8, (15, 15)), (16, (7, 7))):
        config = TrainConfig(8, pp, 1, 1, "1f1b", 1, "full", True, 1)
        assert with_stage_split(LLAMA_405B, H100_128, config, 8192, rates).first_last_layers == expected


def test_even_split_when_p_divides_the_layers():
    rates = train_rates(LLAMA_405B, H100_128)
    config = TrainConfig(8, 2, 1, 1, "1f1b", 1, "full", True, 1)
    assert with_stage_split(LLAMA_405B, H100_128, config, 8192, rates).first_last_layers is None
    assert split.layers_per_stage(126, 2, None) == (63, 63)


def test_pp2_uneven_split_for_odd_layers():
    """p = 2, L = 81: no middle stage, first + last = 81; (41, 40) -> max(41.01, 40.26),
    (40, 41) -> 41.26: the lighter last stage carries the LM head."""
    assert split.best_split(81, 2, 1, LOGITS_HEAVY) == (41, 40)


def test_no_balanced_split_is_a_reason():
    """80 layers over 32 stages: c <= 2 leaves >= 20 for first + last, over the bound of
    ceil(80/32) + 1 = 4 layers; the first/last flags cannot balance it."""
    model = resolve_model("llama-3.1-70b")
    config = TrainConfig(8, 32, 1, 1, "1f1b", 1, "full", True, 0)
    result = estimate(model, resolve_cluster("32x8xH100"), config, TrainRequest(global_batch=64, seq_len=4096))
    assert isinstance(result, Rejected)
    assert "no uneven first/last split" in result.reasons[0]


def test_an_explicit_split_megatron_refuses_is_rejected():
    config = TrainConfig(8, 16, 8, 1, "1f1b", 1, "full", True, 1, (6, 6))
    result = estimate(LLAMA_405B, H100_128, config, TrainRequest(global_batch=1024, seq_len=4096))
    assert isinstance(result, Rejected) and "do not divide over 14 middle stages" in result.reasons[0]


def test_interleaving_needs_a_split_divisible_by_v_or_a_layout_string():
    """126 layers, p = 16, v = 3: 42 units, c <= 4 (the bound) leaves at least 42 - 56 < 0 or,
    at c = 2, 14 > 2*4 for first + last; p*v = 48 does not divide 128: neither flag splits it,
    and a layout string does (a stage of 7 or 8 layers holds 3 chunks), so it runs as one. At
    p = 32 (126 = 30 x 4 + 2 x 3) v = 4 leaves the 3-layer stages a chunk empty and v = 5 every
    stage: refused, naming all three ways. (v = 4 at p = 16 runs: 128 units over 64 chunks, the
    embedding and loss counted as layers.)"""
    request = TrainRequest(global_batch=1024, seq_len=4096)
    config = TrainConfig(8, 16, 8, 1, "interleaved", 3, "full", True, 1)
    laid_out = estimate(LLAMA_405B, H100_128, config, request)
    assert not isinstance(laid_out, Rejected) and laid_out.config.first_last_layers is not None
    assert split.needs_layout(laid_out.num_layers_per_stage, 3)
    deep = TrainConfig(4, 32, 8, 1, "interleaved", 5, "full", True, 1)
    refused = estimate(LLAMA_405B, H100_128, deep, request)
    assert isinstance(refused, Rejected) and "multiple of v=5" in refused.reasons[0]
    assert "--pipeline-model-parallel-layout" in refused.reasons[0]
    runs = estimate(LLAMA_405B, H100_128, replace(config, virtual_stages=4), request)
    assert not isinstance(runs, Rejected) and runs.config.account_for_embedding_and_loss


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    pp=st.sampled_from([3, 4, 5, 8, 16, 32]),
    schedule_v=st.sampled_from([("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("interleaved", 3)]),
    m=st.sampled_from([1, 3, 16, 64]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    tp=st.sampled_from([1, 8]),
    data=st.data(),
)
def test_worst_stage_memory_never_undercounts_a_stage(pp, schedule_v, m, recompute, tp, data):
    """Every stage's memory, for every split Megatron accepts, is at most memory_per_gpu."""
    schedule, v = schedule_v
    candidates = list(split.candidate_splits(126, pp, v))
    if not candidates:
        return
    first, _, last = data.draw(st.sampled_from(candidates))
    config = TrainConfig(tp, pp, 1, 1, schedule, v, recompute, tp > 1, 0, (first, last))
    worst = memory_per_gpu(LLAMA_405B, config, 4096, m)
    for stage in range(pp):
        assert stage_memories(LLAMA_405B, config, 4096, m, (stage,))[0].total_bytes <= worst.total_bytes * (1 + 1e-12)


def test_the_second_stage_can_be_the_worst():
    """7 | 8 x14 | 7 under 1F1B: stage 0 holds 16 micro-batches of 7 layers (112), stage 1
    15 of 8 (120): with full recompute the activations put stage 1 first."""
    config = TrainConfig(8, 16, 8, 1, "1f1b", 1, "full", True, 1, (7, 7))
    worst = memory_per_gpu(LLAMA_405B, config, 8192, 128)
    assert worst.stage == 1 and worst.num_layers == 8


def test_405b_on_16_nodes_uses_uneven_stages():
    """128 H100s, B = 1024, s = 4096: pp = 4, 8 and 16 (126 layers) all have feasible layouts."""
    plan = search(LLAMA_405B, resolve_cluster("16x8xH100"), TrainRequest(global_batch=1024, seq_len=4096))
    feasible = {e.config.pp for e in plan.layouts}
    assert {4, 8, 16} <= feasible
    for e in plan.layouts:
        assert sum(e.num_layers_per_stage) == 126 and len(e.num_layers_per_stage) == e.config.pp
        uneven = e.config.first_last_layers is not None or e.config.account_for_embedding_and_loss
        assert uneven or 126 % e.config.pp == 0
        assert e.config.first_last_layers is None or 126 % e.config.pp


def test_uneven_stages_in_json():
    result = CliRunner().invoke(app, ["--workload", "train", "--json", "--model", "llama-3.1-405b", "--cluster",
                                      "128x8xH100", "--global-batch", "1024", "--seq-len", "8192",
                                      "--layout", "tp=8,pp=16", "--schedule", "1f1b"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    assert best["num_layers_per_stage"] == [7] + [8] * 14 + [7]
    argv = best["command"][0]["argv"]
    assert argv[argv.index("--decoder-first-pipeline-num-layers") + 1] == "7"
    assert argv[argv.index("--decoder-last-pipeline-num-layers") + 1] == "7"


def test_explain_renders_uneven_stages_with_their_own_layers():
    request = TrainRequest(global_batch=1024, seq_len=8192, layout=LayoutFilter(tp=8, pp=16), schedule="1f1b",
                           micro_batch=1, recompute="full", zero_stage=1, sequence_parallel=True)
    e = explain_training(LLAMA_405B, H100_128, request, None)
    assert [bar.stages for bar in e.memory] == [(0,), (1,), (15,)]
    assert [bar.note.split(" layers")[0] for bar in e.memory] == ["7", "8", "7"]
    out = Console(file=io.StringIO(), width=120, record=True)
    render_explanation(e, out)
    assert "Pipeline timeline" in out.export_text()


def test_estimate_reports_the_split_it_used():
    config = TrainConfig(8, 16, 8, 1, "1f1b", 1, "full", True, 1)
    result = estimate(LLAMA_405B, H100_128, config, TrainRequest(global_batch=1024, seq_len=8192))
    assert isinstance(result, TrainEstimate)
    assert result.config.first_last_layers == (7, 7) and result.slowest_stage == 1


def test_bubble_quantities_are_schedule_quantities():
    """Unchanged by the split: (p-1)/(m+p-1) and (p-1)/m."""
    config = TrainConfig(8, 16, 8, 1, "1f1b", 1, "full", True, 1)
    e = estimate(LLAMA_405B, H100_128, config, TrainRequest(global_batch=1024, seq_len=8192))
    assert isinstance(e, TrainEstimate)
    assert e.bubble_fraction == pytest.approx(15 / (128 + 15))
    assert e.bubble_over_compute_ratio == pytest.approx(15 / 128)


@given(st.sampled_from([2, 3, 4, 8, 16, 32]), st.sampled_from([1, 2, 3]),
       st.floats(0.0, 1.0), st.floats(0.0, 5.0), st.floats(0.0, 5.0))
def test_fastest_split_prices_its_split_as_slowest_does(pp: int, v: int, w: float, first: float,
                                                         last: float) -> None:
    """The seconds fastest_split reports (its scan's max, with c = 0 at pp = 2) are
    costs.slowest of the split it picks, which with_stage_split compares with the account split."""
    costs = StageSeconds(w, first, last)
    found = split.fastest_split(costs, split.candidate_splits(126, pp, v))
    if found is None:
        assert split.best_split(126, pp, v, costs) is None
        return
    seconds, ends = found
    assert ends == split.best_split(126, pp, v, costs)
    assert seconds == costs.slowest(*split.stage_triple(126, pp, ends), pp)


def test_layout_string_by_hand():
    """Megatron's --pipeline-model-parallel-layout lists the p*v chunks with chunk j of stage i
    at entry j*p + i (pipeline_parallel_layer_layout.py, core_v0.19.0). Two stages of 3 layers,
    v = 2: stage 0's chunks (2, 1) at entries 0 and 2, stage 1's (2, 1) at 1 and 3, the
    embedding first and the loss last: "Ett|tt|t|tL"."""
    from planner.cost.stage_split import chunk_layers, megatron_layout

    assert chunk_layers(7, 4) == (2, 2, 2, 1)
    assert chunk_layers(8, 4) == (2, 2, 2, 2)
    assert megatron_layout((3, 3), 2) == "Ett|tt|t|tL"


def parse_megatron_layout(layout: str, pp: int) -> list[list[str]]:
    """Megatron's reading of the string, per pipeline rank: its chunks' layer letters."""
    entries = layout.replace(",", "").split("|")
    assert len(entries) % pp == 0
    v = len(entries) // pp
    return [[entries[j * pp + i] for j in range(v)] for i in range(pp)]


@given(st.integers(2, 130), st.integers(2, 16), st.sampled_from([2, 3, 4, 8]))
@settings(max_examples=150, deadline=None)
def test_every_layout_split_is_a_layout_megatron_accepts(num_layers, pp, v):
    """Every split layout_splits offers writes a string Megatron validates: p*v chunks, the
    embedding opening and the loss closing it, exactly L decoder layers, at least one per chunk,
    each stage's own layer count, no stage above ceil(L/p) + 1 layers."""
    from planner.cost.stage_split import layers_per_stage, layout_splits, megatron_layout

    for first, _, last in layout_splits(num_layers, pp, v):
        layers = layers_per_stage(num_layers, pp, (first, last))
        ranks = parse_megatron_layout(megatron_layout(layers, v), pp)
        flat = [chunk for j in range(v) for chunk in (rank[j] for rank in ranks)]
        assert flat[0].startswith("E") and flat[-1].endswith("L")
        assert "".join(flat).count("t") == num_layers
        assert all(chunk.count("t") >= 1 for chunk in flat)
        assert [sum(chunk.count("t") for chunk in rank) for rank in ranks] == list(layers)
        assert max(layers) <= -(-num_layers // pp) + 1


def test_deepseek_v3_interleaves_at_pp8_through_a_layout_string():
    """61 layers on 8 stages: no first/last split of multiples of v exists for any v, and
    61 + 2 is not a multiple of 8v, so Megatron's flags cannot interleave it; the layout string
    can (v = 2 or 4, dividing ceil(61/8) = 8), and the search now offers it; so can torchtitan's
    module_fqns_per_model_part, one module list per model part."""
    from planner.requests import TrainRequest
    from planner.train_search import schedule_options

    model = resolve_model("deepseek-v3")
    request = TrainRequest(global_batch=4096, seq_len=4096)
    assert ("interleaved", 2) in schedule_options(model, request, 8)
    assert ("interleaved", 4) in schedule_options(model, request, 8)
    titan = TrainRequest(global_batch=4096, seq_len=4096, engine="torchtitan")
    assert {("interleaved", 2), ("interleaved", 4)} <= set(schedule_options(model, titan, 8))


def test_the_estimate_takes_the_fastest_split_that_fits():
    """Qwen3-235B-A22B (94 layers) over 8 stages on 32 H200 at 8,192 tokens, t = 2, ep = 2, b = 2,
    full recompute, 1F1B: the fastest split, 12 | 12 x6 | 10 (the first stage's embedding
    accumulation costs less than the last's LM head), puts a layer more on the first stage, which
    holds all 8 micro-batches in flight, and runs out of memory; 11 | 12 x6 | 11 fits (137.2 of
    139.8 GiB), so the estimate runs that one instead of rejecting the layout."""
    model, cluster = resolve_model("qwen3-235b-a22b"), resolve_cluster("8x8xH200")
    request = TrainRequest(global_batch=512, seq_len=8192, moe_comm_overlap=False, moe_dispatcher="deepep")
    config = TrainConfig(tp=2, pp=8, dp=4, micro_batch_size=2, schedule="1f1b", virtual_stages=1, recompute="full",
                         sequence_parallel=True, zero_stage=1, ep=2, moe_dispatcher="deepep")
    rates = train_rates(model, cluster)
    assert with_stage_split(model, cluster, config, 8192, rates).first_last_layers == (12, 10)
    fastest = estimate(model, cluster, config.with_(first_last_layers=(12, 10)), request)
    assert isinstance(fastest, Rejected) and fastest.over_bytes > 0
    chosen = estimate(model, cluster, config, request)
    assert isinstance(chosen, TrainEstimate)
    assert chosen.config.first_last_layers == (11, 11)
    assert chosen.num_layers_per_stage == (11, 12, 12, 12, 12, 12, 12, 11)
    assert chosen.memory_per_gpu_bytes <= chosen.capacity_per_gpu_bytes
    assert chosen.memory_fallback and chosen.faster_split is not None
    assert chosen.faster_split.num_layers_per_stage == (12, 12, 12, 12, 12, 12, 12, 10)
    assert chosen.faster_split.stage == 0 and chosen.faster_split.over_bytes == pytest.approx(fastest.over_bytes)
    text = CliRunner().invoke(app, [
        "--workload", "train", "--model", "qwen3-235b-a22b", "--cluster", "8x8xH200", "--global-batch", "512",
        "--seq-len", "8192", "--no-moe-comm-overlap", "--moe-dispatcher", "deepep", "--layout", "tp=2,pp=8,dp=4,ep=2",
        "--micro-batch", "2", "--recompute", "full", "--zero", "1", "--schedule", "1f1b"]).output
    assert "Stage split 11 | 12 x6 | 11: the faster 12 | 12 x6 | 10 does not fit (stage 0 over by 1.1 GiB)." in (
        " ".join(text.split()))


def test_more_recompute_is_tried_where_less_fits_only_on_a_slower_split():
    """Qwen3-235B-A22B over 4 stages (94 layers) on 64 H200, tp 2, ep 8, b 1, 1F1B: the fastest
    split is 24 | 24 24 | 22; without recompute only 21 | 25 25 | 23 fits (2.672 s per step);
    with the outputs recompute level 23 | 24 24 | 23 fits, closer to the fastest, and the step
    is 2.561 s. The search keeps the faster (train_search._first_fitting), where "the least
    recompute that fits" would have kept the slower."""
    model, cluster = resolve_model("qwen3-235b-a22b"), resolve_cluster("8x8xH200")
    fixed = dict(global_batch=32, seq_len=4096, layout=LayoutFilter(tp=2, pp=4, dp=8, ep=8), micro_batch=1,
                 schedule="1f1b")
    none = search(model, cluster, TrainRequest(**fixed, recompute="none")).layouts[0]
    assert none.memory_fallback and none.num_layers_per_stage == (21, 25, 25, 23)
    best = search(model, cluster, TrainRequest(**fixed)).layouts[0]
    assert best.config.recompute == "outputs"
    assert best.num_layers_per_stage == (23, 24, 24, 23)
    assert best.step_time_seconds < none.step_time_seconds


@pytest.mark.parametrize("engine", ["megatron", "torchtitan"])
def test_even_stages_that_v_does_not_divide_run_through_a_per_chunk_split(engine):
    """80 layers on 4 stages at v = 3: 20 a stage are not 3 equal chunks and neither flag splits
    them (80 is no multiple of 3; 80 + 2 = 82 no multiple of p*v = 12), but Megatron's layout
    string (get_num_layers_to_build reads it, core_v0.19.0) and torchtitan's module lists name
    every chunk, so it runs: a stage of 20 layers in chunks of 7, 7, 6 (larger first), of 19 in
    7, 6, 6, of 21 in 7, 7, 7; whatever balanced split is fastest, the emitted chunks hold
    exactly its stage layers. At v = 21 a 20-layer stage would leave a chunk empty: refused."""
    from planner.emit.megatron import parallel_args
    from planner.emit.torchtitan import pipeline_keys

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("8x8xH100")
    request = TrainRequest(global_batch=64, seq_len=4096, engine=engine)
    config = TrainConfig(8, 4, 2, 2, "interleaved", 3, "none", True, 1)  # dp = 2: torchtitan's mixed precision
    result = estimate(model, cluster, config, request)
    assert not isinstance(result, Rejected), result
    layers = result.num_layers_per_stage
    assert sum(layers) == 80 and split.needs_layout(layers, 3)
    assert split.chunk_layers(20, 3) == (7, 7, 6) and split.chunk_layers(19, 3) == (7, 6, 6)
    if engine == "megatron":
        args = parallel_args(model, result.config, 64)
        layout = args[args.index("--pipeline-model-parallel-layout") + 1]
        ranks = parse_megatron_layout(layout, 4)
        assert [sum(chunk.count("t") for chunk in rank) for rank in ranks] == list(layers)
        assert all(len(rank) == 3 and all(chunk.count("t") >= 1 for chunk in rank) for rank in ranks)
        assert "--num-layers-per-virtual-pipeline-stage" not in args
    else:
        parts = pipeline_keys(model, result.config)["module_fqns_per_model_part"]
        assert len(parts) == 12  # part k is chunk k // 4 of stage k % 4
        per_stage = [sum(sum(name.startswith("layers.") for name in parts[j * 4 + i]) for j in range(3))
                     for i in range(4)]
        assert per_stage == list(layers)
    refused = estimate(model, cluster, replace(config, virtual_stages=21), request)
    assert isinstance(refused, Rejected)
    assert any("layers per stage 20 not divisible by v=21, nor spread over 21 chunks" in r for r in refused.reasons)


def test_a_prime_stage_size_still_interleaves_in_a_few_chunks():
    """61 layers on 2 stages: ceil(61/2) = 31 is prime, so its divisors offered only v = 31; the
    layout string takes v = 2, 3 and 4 as well (32 | 29 as 16+16 | 15+14 at v = 2), which
    --virtual-stages 2 already ran, and the search now tries (LAYOUT_SPLIT_MIN_CHUNKS)."""
    from planner.requests import TrainRequest
    from planner.train_search import schedule_options

    model = resolve_model("deepseek-v3")
    pairs = set(schedule_options(model, TrainRequest(global_batch=512, seq_len=4096), 2))
    assert {("interleaved", 2), ("interleaved", 3), ("interleaved", 4)} <= pairs
