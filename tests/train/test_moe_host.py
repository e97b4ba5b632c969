"""The host behind Megatron's MoE layers: each dropless MoE layer syncs the host on its token
counts every forward, so the GPU waits out whatever of the host's time to issue the block's
forward (efficiency.MOE_LAYER_FORWARD_HOST_SECONDS) its own forward of the block does not cover
(training_time.moe_host_exposed_seconds). Hand-worked numbers; the fit in bench/moe_host_fit.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import efficiency
from planner.cost.moe import moe_layers_of
from planner.cost.training_time import (
    EpSeconds,
    LayerSeconds,
    TpSeconds,
    moe_forward_gpu_seconds,
    moe_host_exposed_seconds,
)
from planner.layout import TrainConfig
from planner.requests import TrainRequest
from planner.train import estimate
from planner.train_engines import MOE_FORWARD_HOST_SECONDS

QWEN3_30B = resolve_model("qwen3-30b-a3b")
B200_NODE = resolve_cluster("1x8xB200")


def qwen3_30b_config(micro_batch: int, recompute: str = "none") -> TrainConfig:
    """NeMo's Qwen3-30B-A3B recipe on one DGX-B200: EP 8 over the node's data-parallel ranks, routing
    balanced as NeMo forces it."""
    return TrainConfig(tp=1, pp=1, dp=8, micro_batch_size=micro_batch, schedule="1f1b", virtual_stages=1,
                       recompute=recompute, sequence_parallel=False, zero_stage=1, ep=8, moe_dispatcher="alltoall")


def qwen3_30b_estimate(micro_batch: int, recompute: str = "none"):
    request = TrainRequest(global_batch=512, seq_len=4096, moe_dispatcher="alltoall", moe_comm_overlap=False,
                           expert_imbalance=1.0)
    result = estimate(QWEN3_30B, B200_NODE, qwen3_30b_config(micro_batch, recompute), request)
    assert not hasattr(result, "reasons"), result
    return result


def test_the_wait_is_what_the_host_takes_beyond_the_gpus_forward():
    """H = 7.3 ms, W = 2 ms: the GPU waits 7.3 - 2 = 5.3 ms per micro-batch; with full
    recompute the rerun forward syncs again: 2 x 5.3 = 10.6 ms; W = 8 ms covers the host: 0."""
    assert moe_host_exposed_seconds(7.3e-3, 2e-3) == 5.3e-3
    assert abs(moe_host_exposed_seconds(7.3e-3, 2e-3, 2) - 10.6e-3) < 1e-15
    assert moe_host_exposed_seconds(7.3e-3, 8e-3) == 0.0


def test_the_gpus_window_between_two_syncs():
    """A block with 1 ms forward and 2 ms backward compute, 0.1 ms per forward TP collective (0.4
    ms exposed over the pass pair) and 0.3 ms per all-to-all. Megatron's 1F1B: the forward, its
    two TP collectives and its dispatch and combine, 1 + 2 x 0.1 + 2 x 0.3 = 1.8 ms. Combined
    1F1B (0.5 ms of the all-to-alls left exposed): the host issues the other micro-batch's
    backward between the syncs, so 1 + 2 + 0.4 + 0.5 = 3.9 ms."""
    layer = LayerSeconds(forward=1e-3, backward=2e-3, recompute=0.0)
    tp = TpSeconds(total=0.6e-3, exposed=0.4e-3, allreduce_seconds=0.1e-3)
    plain = EpSeconds(alltoall_seconds=0.3e-3, num_alltoalls=4, moe_layer_share=1.0)
    combined = EpSeconds(alltoall_seconds=0.3e-3, num_alltoalls=4, moe_layer_share=1.0,
                         exposed_seconds_per_moe_layer=0.5e-3)
    assert abs(moe_forward_gpu_seconds(layer, tp, plain) - 1.8e-3) < 1e-15
    assert abs(moe_forward_gpu_seconds(layer, tp, combined) - 3.9e-3) < 1e-15


def test_the_busiest_gpus_extra_expert_work_is_in_the_window():
    """Under skewed routing the busiest GPU's extra expert GEMMs (EpSeconds.imbalance_seconds,
    forward, backward and recompute passes) run in the window too: a third of 0.9 ms in the
    forward, 1.8 + 0.3 = 2.1 ms; a quarter with full recompute (4 passes), 1.8 + 0.225 =
    2.025 ms; all of it in the combined 1F1B's pair, 3.9 + 0.9 = 4.8 ms."""
    layer = LayerSeconds(forward=1e-3, backward=2e-3, recompute=0.0)
    tp = TpSeconds(total=0.6e-3, exposed=0.4e-3, allreduce_seconds=0.1e-3)
    plain = EpSeconds(alltoall_seconds=0.3e-3, num_alltoalls=4, imbalance_seconds=0.9e-3, moe_layer_share=1.0)
    combined = EpSeconds(alltoall_seconds=0.3e-3, num_alltoalls=4, imbalance_seconds=0.9e-3, moe_layer_share=1.0,
                         exposed_seconds_per_moe_layer=0.5e-3)
    assert abs(moe_forward_gpu_seconds(layer, tp, plain) - 2.1e-3) < 1e-15
    assert abs(moe_forward_gpu_seconds(layer, tp, plain, full_recompute=True) - 2.025e-3) < 1e-15
    assert abs(moe_forward_gpu_seconds(layer, tp, combined) - 4.8e-3) < 1e-15


def test_moe_host_ms_sets_the_hosts_time():
    """--moe-host-ms replaces the fitted 6.1 ms: 0 prices no wait, 6.1 the same plan as the
    default, 10 a longer wait; a negative or absurd value, or one for a dense model, exits 2."""
    args = ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xB200", "--global-batch", "512",
            "--seq-len", "4096", "--layout", "tp=1,pp=1,dp=8,ep=8", "--micro-batch", "1",
            "--moe-dispatcher", "alltoall", "--no-moe-comm-overlap", "--json"]
    runner = CliRunner()

    def host_of(*extra: str) -> float:
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["recommended"]["time_breakdown_seconds"]["host"]

    default = host_of()
    assert host_of("--moe-host-ms", "0") == 0.0
    assert host_of("--moe-host-ms", "6.1") == default > 0
    assert host_of("--moe-host-ms", "10") > default
    for bad in ("-1", "5000", "nan"):
        result = runner.invoke(app, [*args, "--moe-host-ms", bad])
        assert result.exit_code == 2 and "--moe-host-ms" in result.output, result.output
    dense = runner.invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xB200",
                                "--global-batch", "512", "--seq-len", "4096", "--moe-host-ms", "2"])
    assert dense.exit_code == 2 and "has no experts" in dense.output


def test_the_host_time_is_a_sensitivity_knob_for_moe_training_only():
    """plan explain moves the MoE host time +/-20% with the other uncertain inputs (MoE on
    Megatron only), and the step range covers what that alone does."""
    from planner.explain_train import train_knob_base
    from planner.sensitivity import knob_values

    request = TrainRequest(global_batch=512, seq_len=4096, moe_dispatcher="alltoall", moe_comm_overlap=False,
                           expert_imbalance=1.0)
    e = qwen3_30b_estimate(1)
    base = train_knob_base(QWEN3_30B, B200_NODE, e, request)
    assert base.moe_host_seconds == efficiency.MOE_LAYER_FORWARD_HOST_SECONDS
    assert knob_values(B200_NODE, base)["moe_host"] == (6.1, "ms per MoE block")
    dense = resolve_model("llama-3.1-8b")
    assert train_knob_base(dense, B200_NODE, e, request).moe_host_seconds is None
    assert train_knob_base(QWEN3_30B, B200_NODE, e, replace(request, moe_host_seconds=0.0)).moe_host_seconds is None


def test_the_step_carries_the_wait_of_every_moe_layer_and_micro_batch():
    """Qwen3-30B-A3B (48 MoE layers) on 8 B200, EP 8, micro-batch 1 of 4,096 tokens: the wait per
    layer is max(0, H - W) with W the block's forward window; the step holds m = 512 / (1 x 8)
    = 64 micro-batches of 48 layers of it, and the step time adds it."""
    e = qwen3_30b_estimate(1)
    terms = e.layer_terms
    window = moe_forward_gpu_seconds(terms.layer, terms.tp, terms.ep)
    host = MOE_FORWARD_HOST_SECONDS["megatron"]
    assert (terms.moe_host_seconds, terms.moe_gpu_seconds) == (host, window)
    assert host == efficiency.MOE_LAYER_FORWARD_HOST_SECONDS and window < host
    assert moe_layers_of(QWEN3_30B, 1) == 1.0
    assert terms.host_seconds_per_layer == host - window
    breakdown = e.time_breakdown_seconds
    assert abs(breakdown.host - 64 * 48 * (host - window)) < 1e-9
    assert abs(breakdown.total - e.step_time_seconds) < 1e-9


def test_a_larger_micro_batch_hides_the_host():
    """The GPU's forward grows with the micro-batch and the host's does not: the step's waits
    shrink from micro-batch 1 to 2 to 4 and the tokens per second grow, the shape of NeMo's
    Qwen3-30B rows on B200 (9,299-9,691 tokens/s per GPU at micro-batch 1, 26,695-27,136 at 4)."""
    estimates = [qwen3_30b_estimate(b) for b in (1, 2, 4)]
    waits = [e.time_breakdown_seconds.host for e in estimates]
    assert waits[0] > waits[1] > waits[2] >= 0
    rates = [e.tokens_per_second for e in estimates]
    assert rates[0] < rates[1] < rates[2]
    assert rates[2] / rates[0] > 1.5


def test_full_recompute_waits_twice():
    """Full recompute reruns each forward and syncs again: twice the wait per micro-batch."""
    none, full = qwen3_30b_estimate(1).layer_terms, qwen3_30b_estimate(1, "full").layer_terms
    assert abs(full.host_seconds_per_layer - 2 * none.host_seconds_per_layer) < 1e-12


def test_a_dense_model_never_waits():
    request = TrainRequest(global_batch=64, seq_len=4096)
    config = TrainConfig(tp=8, pp=1, dp=1, micro_batch_size=1, schedule="1f1b", virtual_stages=1, recompute="none",
                         sequence_parallel=True, zero_stage=0)
    e = estimate(resolve_model("llama-3.1-8b"), B200_NODE, config, request)
    assert e.layer_terms.host_seconds_per_layer == 0.0 and e.time_breakdown_seconds.host == 0.0


@given(host=st.floats(0, 0.05), window=st.floats(0, 0.05), more=st.floats(0, 0.05), n=st.sampled_from([1, 2]))
def test_the_wait_is_bounded_and_shrinks_with_the_gpus_work(host, window, more, n):
    wait = moe_host_exposed_seconds(host, window, n)
    assert 0.0 <= wait <= n * host
    assert moe_host_exposed_seconds(host, window + more, n) <= wait
    assert moe_host_exposed_seconds(host + more, window, n) >= wait


def test_the_plan_and_explain_show_the_wait():
    """The text's step shares name the host waits; explain says why and what hides them; JSON
    has time_breakdown_seconds.host."""
    args = ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xB200", "--global-batch", "512",
            "--seq-len", "4096", "--layout", "tp=1,pp=1,dp=8,ep=8", "--micro-batch", "1"]
    runner = CliRunner()
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "host waits (MoE syncs)" in " ".join(text.output.split())
    explained = runner.invoke(app, ["explain", *args])
    assert explained.exit_code == 0, explained.output
    flat = " ".join(explained.output.split())
    assert "syncs the host on its token counts" in flat and "A larger micro-batch, where memory allows" in flat
    said = re.search(r"the host takes ([\d.]+) ms to issue a block's forward and the GPU ([\d.]+) ms for the "
                     r"block's forward[^,]*, so the GPU waits ([\d.]+) ms per MoE layer and micro-batch:", flat)
    assert said, flat
    host, gpu, wait = (float(x) for x in said.groups())
    assert host == 6.1 and abs(host - gpu - wait) <= 0.1


def test_the_fit_lands_on_the_catalog_constant(bench_module):
    """bench/moe_host_fit.py over its default grid picks efficiency.MOE_LAYER_FORWARD_HOST_SECONDS,
    at 10.8% median |error| over the 34 NeMo MoE rows, 21 within 15% (41% at 0), and each family
    held out of the fit stays within 25%."""
    fit = bench_module("moe_host_fit").fit()
    assert abs(fit["best_ms"] * 1e-3 - efficiency.MOE_LAYER_FORWARD_HOST_SECONDS) < 1e-12
    best = next(p for p in fit["grid"] if p["host_ms"] == fit["best_ms"])
    assert best["median_abs"] < 0.12 and best["within_15"] >= 20
    assert all(h["median_abs_held_out"] < 0.25 for h in fit["held_out"])


def test_the_timeline_draws_the_wait_with_the_forward():
    """plan explain's schedule splits a micro-batch's stage time as one layer's time splits,
    the host wait with the forward it stalls: forward share (F + X) / (F + B + X)."""
    from planner.explain_train import train_timeline_seconds

    e = qwen3_30b_estimate(1)
    terms = e.layer_terms
    timeline = train_timeline_seconds(e, num_micro_batches=2)
    blocks = timeline.stages[0]
    forward = next(b for b in blocks if b.kind == "forward")
    backward = next(b for b in blocks if b.kind == "backward")
    share = (forward.end - forward.start) / (forward.end - forward.start + backward.end - backward.start)
    layer = terms.layer
    expected = (layer.forward + terms.host_seconds_per_layer) / (layer.total + terms.host_seconds_per_layer)
    assert terms.host_seconds_per_layer > 0 and abs(share - expected) < 1e-12


@settings(max_examples=25, deadline=None)
@given(low=st.floats(0, 0.012), more=st.floats(0, 0.012), micro_batch=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "full"]))
def test_a_slower_host_never_makes_a_step_faster(low, more, micro_batch, recompute):
    """For one configuration, the step time is non-decreasing in the host's time per MoE block
    (--moe-host-ms), and equal to the no-wait step plus the waits."""
    base = dict(global_batch=512, seq_len=4096, moe_dispatcher="alltoall", moe_comm_overlap=False,
                expert_imbalance=1.0)
    config = qwen3_30b_config(micro_batch, recompute)
    steps = []
    for host in (0.0, low, low + more):
        e = estimate(QWEN3_30B, B200_NODE, config, TrainRequest(**base, moe_host_seconds=host))
        steps.append((e.step_time_seconds, e.time_breakdown_seconds.host))
    (free, none), (slow, wait), (slower, _) = steps
    assert none == 0.0 and free <= slow <= slower
    assert abs(slow - (free + wait)) < 1e-9 * free


def test_the_fits_what_ifs_reprice_and_restore(bench_module):
    """bench/moe_host_fit.py's what-ifs wrap the planner's layer_terms for a run and put it back:
    pricing the combined 1F1B's pair at 2H lowers the row that ran it (more wait); the planner's
    own function is restored afterwards."""
    import planner.train as train

    fit = bench_module("moe_host_fit")
    calibration = bench_module("training_calibration")
    planned = train.layer_terms
    rows = {row.id: row for row in calibration.load_rows(calibration.MOE_FIXTURE)}
    row = rows["26.04 DGX-H100 Qwen3_235B_a22B fp8 (recipe not stated)"]
    assert row.recipe_a2a_overlap == "on"
    base = calibration.predict(row)["error"]
    try:
        fit.what_if(pair_issue=2.0)
        doubled = calibration.predict(row)["error"]
    finally:
        fit.what_if()
    assert train.layer_terms is planned
    assert doubled < base
    assert calibration.predict(row)["error"] == base
