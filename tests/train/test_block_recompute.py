"""Block recompute (Megatron's --recompute-granularity full --recompute-method block
--recompute-num-layers k: the first k layers of each model chunk rerun their forward, the others
keep every activation; docs/cost-model.md#training-partial-recompute): hand-worked memory and
time, the search's choice of k, the command, and the invariants."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.emit.megatron import megatron_steps
from planner.layout import TrainConfig
from planner.requests import LayoutFilter, TrainRequest
from planner.train import TrainEstimate, estimate, recomputed_layers, stage_memories
from planner.train_search import search
from tests.train.test_formulas import B_MICRO, TINY, S

runner = CliRunner()


def tiny_config(recompute: str, k: int | None = None) -> TrainConfig:
    """TINY (4 layers, h = 64) at t = 4 with SP, one stage, flash attention."""
    return TrainConfig(4, 1, 1, B_MICRO, "1f1b", 1, recompute, True, 0, attention="flash", recompute_num_layers=k)


def test_recomputed_layers_per_chunk():
    """k counts per model chunk: a 16-layer stage in v = 2 chunks of 8 reruns 2*3 = 6 layers at
    k = 3 and all 16 at k = 8 or more; a middle stage of 0 (pp <= 2) reruns none; without full
    recompute nothing reruns, with every layer all of them."""
    config = TrainConfig(2, 2, 2, 1, "interleaved", 2, "full", True, 1, recompute_num_layers=3)
    assert recomputed_layers(config, (16, 0, 16)) == (6, 0, 6)
    assert recomputed_layers(config.with_(recompute_num_layers=9), (16, 0, 16)) == (16, 0, 16)
    assert recomputed_layers(config.with_(recompute_num_layers=None), (16, 0, 16)) == (16, 0, 16)
    assert recomputed_layers(config.with_(recompute="selective", recompute_num_layers=None), (16, 0, 16)) == (0, 0, 0)


def test_block_memory_by_hand():
    """TINY, t = 4, SP, flash, one micro-batch in flight. Per layer (test_formulas): 140,288 B
    kept whole (no recompute), 8,192 B recomputed (its input, sharded by SP); rerunning a layer
    materialises the rest of it, 140,288 - 8,192 = 132,096 B. Besides the layers: the
    embedding's dropout mask s*b*h/t = 4,096 and the logits (2 + 4) * s*b * ceil(V/t) =
    6 * 256 * 250 = 384,000: 388,096.
      none:  4 * 140,288 = 561,152                               -> 949,248
      every layer: 4 * 8,192 + 132,096 (rerun working set) = 164,864 -> 552,960
      k = 1: 8,192 + 3 * 140,288 = 429,056; the rerun of layer 0 comes after the backward freed
             layers 1-3 (3 * 140,288 >= 132,096): no working set above that -> 817,152
      k = 3: 3 * 8,192 + 140,288 = 164,864                       -> 552,960
    (k = 3 holds what every layer holds: the kept last layer's activations are freed before the
    first rerun makes as much.)"""
    def activations(recompute: str, k: int | None = None) -> float:
        (memory,) = stage_memories(TINY, tiny_config(recompute, k), S, 1)
        return memory.activation_bytes

    assert activations("none") == 949_248
    assert activations("full") == 552_960
    assert activations("full", 1) == 817_152
    assert activations("full", 2) == 685_056  # 2 * 8,192 + 2 * 140,288 + 388,096
    assert activations("full", 3) == 552_960


def test_block_time_is_the_rerun_layers_share():
    """One stage, no DP (TINY on 4 H100, t = 4): every time term is the layers times a per-layer
    figure, so k of 4 layers rerunning costs k/4 of what rerunning all four adds to none's step:
    (step(k) - step(none)) / (step(every layer) - step(none)) = 0.25, 0.5, 0.75. The TFLOP/s
    counts the rerun share of the recomputed forward: model FLOPs + k/4 of eq. 3's extra."""
    cluster, request = resolve_cluster("1x4xH100"), TrainRequest(global_batch=4, seq_len=S)
    steps = {}
    for k in (None, 1, 2, 3):
        result = estimate(TINY, cluster, tiny_config("full", k), request)
        assert isinstance(result, TrainEstimate)
        steps[k] = result
    none = estimate(TINY, cluster, tiny_config("none"), request)
    assert isinstance(none, TrainEstimate)
    added = steps[None].step_time_seconds - none.step_time_seconds
    assert added > 0
    for k in (1, 2, 3):
        assert (steps[k].step_time_seconds - none.step_time_seconds) / added == pytest.approx(k / 4, rel=1e-9)
        model_flops = steps[k].model_tflops_per_gpu * steps[k].step_time_seconds
        every = steps[None]
        rerun_flops = every.tflops_per_gpu * every.step_time_seconds - every.model_tflops_per_gpu * every.step_time_seconds
        assert steps[k].tflops_per_gpu * steps[k].step_time_seconds == pytest.approx(model_flops + k / 4 * rerun_flops)
        assert steps[k].rerun_layers == k


@settings(max_examples=12, deadline=None, derandomize=True)
@given(k=st.integers(min_value=1, max_value=7), b=st.sampled_from([1, 2]), v=st.sampled_from([1, 2]))
def test_more_rerun_layers_never_faster_nor_larger(k: int, b: int, v: int):
    """Llama-3.1-8B on 8 H100 (tp 2, pp 2, 8K tokens), memory lifted: one layer more per chunk
    rerunning never shortens the step and never adds activation memory on any stage."""
    model = resolve_model("llama-3.1-8b")
    cluster = resolve_cluster("1x8xH200")
    request = TrainRequest(global_batch=32, seq_len=8192)
    schedule = "interleaved" if v > 1 else "1f1b"
    config = TrainConfig(2, 2, 2, b, schedule, v, "full", True, 1, recompute_num_layers=k)
    fewer, more = (estimate(model, cluster, config, request),
                   estimate(model, cluster, config.with_(recompute_num_layers=k + 1), request))
    assert isinstance(fewer, TrainEstimate) and isinstance(more, TrainEstimate)
    assert more.step_time_seconds >= fewer.step_time_seconds * (1 - 1e-12)
    for a, c in zip(fewer.stage_memories, more.stage_memories, strict=True):
        assert c.activation_bytes <= a.activation_bytes * (1 + 1e-12)


def test_the_search_takes_the_least_k_that_fits():
    """Llama-3.1-8B on 8 H100 at 8K tokens, tp = 1, dp = 8, ZeRO-2, b = 1: no recompute is 0.9 GiB
    over; the search recomputes the fewest layers that fit, block 1 (78.9 of 79.1 GiB), faster
    than every layer (6.04 s a step against 7.72 s). It leaves under 3% free, but the least
    roomier k (3, 76.5 GiB) runs 1.8% slower, beyond the 1% tie: block 1 stays (and the plan
    says the margin is thin)."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    request = TrainRequest(global_batch=64, seq_len=8192, layout=LayoutFilter(tp=1, pp=1, cp=1), micro_batch=1,
                           zero_stage=2)
    best = search(model, cluster, request).layouts[0]
    assert (best.config.recompute, best.config.recompute_num_layers) == ("full", 1)
    every = estimate(model, cluster, best.config.with_(recompute_num_layers=None), request)
    none = estimate(model, cluster, best.config.with_(recompute="none", recompute_num_layers=None), request)
    roomier = estimate(model, cluster, best.config.with_(recompute_num_layers=3), request)
    two = estimate(model, cluster, best.config.with_(recompute_num_layers=2), request)
    assert isinstance(every, TrainEstimate) and isinstance(roomier, TrainEstimate) and isinstance(two, TrainEstimate)
    assert not isinstance(none, TrainEstimate)
    tight = 0.03 * best.capacity_per_gpu_bytes
    assert best.capacity_per_gpu_bytes - best.memory_per_gpu_bytes < tight
    assert two.capacity_per_gpu_bytes - two.memory_per_gpu_bytes < tight
    assert roomier.capacity_per_gpu_bytes - roomier.memory_per_gpu_bytes >= tight
    assert roomier.tokens_per_second < 0.99 * best.tokens_per_second
    assert best.step_time_seconds == pytest.approx(6.037, rel=1e-3)
    assert every.step_time_seconds == pytest.approx(7.722, rel=1e-3)
    # --recompute full keeps its meaning: every layer (as the 2021 Megatron runs recomputed)
    pinned = search(model, cluster, TrainRequest(global_batch=64, seq_len=8192, layout=LayoutFilter(tp=1, pp=1, cp=1),
                                                 micro_batch=1, zero_stage=2, recompute="full")).layouts[0]
    assert pinned.config.recompute_num_layers is None


def test_the_command_and_json_name_the_block():
    """--recompute-num-layers 5 (the NeMo 25.11 H100 8B FP8-CS recipe's setting) fixes k: the
    command says --recompute-method block --recompute-num-layers 5 and the JSON
    recompute_num_layers 5; the table says "full (block 5)"."""
    args = ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "128",
            "--seq-len", "8192", "--recompute-num-layers", "5"]
    out = runner.invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    best = json.loads(out.output)["recommended"]
    assert (best["recompute"], best["recompute_num_layers"]) == ("full", 5)
    argv = best["command"][0]["argv"]
    i = argv.index("--recompute-method")
    assert argv[i - 2:i + 4] == ["--recompute-granularity", "full", "--recompute-method", "block",
                                 "--recompute-num-layers", "5"]
    table = runner.invoke(app, args)
    assert "full (block 5)" in table.output


def test_a_block_beyond_a_chunk_is_the_chunk():
    """--recompute-num-layers counts the layers of one model chunk to rerun; Megatron's block
    method checkpoints the first N of the chunk's layers, every one where N is more. Llama-3.1-8B
    at pp = 2 with 2 virtual stages: 32 / 2 / 2 = 8 layers a chunk, so 20 is 8 (it had been
    emitted and shown as "block 20"); 5 stays 5."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    for asked, kept in ((20, 8), (5, 5)):
        request = TrainRequest(global_batch=128, seq_len=8192, layout=LayoutFilter(tp=1, pp=2, cp=1),
                               virtual_stages=2, recompute_num_layers=asked)
        best = search(model, cluster, request).layouts[0]
        assert (best.config.recompute, best.config.recompute_num_layers) == ("full", kept)


def test_every_layer_stays_uniform():
    """Full recompute of every layer is emitted as before: uniform, one layer a unit."""
    model = resolve_model("llama-3.1-8b")
    request = TrainRequest(global_batch=64, seq_len=8192, recompute="full")
    e = search(model, resolve_cluster("1x8xH100"), request).layouts[0]
    (step,) = megatron_steps(model, resolve_cluster("1x8xH100"), e.config, 64, 8192)
    assert "--recompute-method uniform --recompute-num-layers 1" in step.shell()


@pytest.mark.parametrize(("extra", "message"), [
    (["--recompute-num-layers", "0"], "--recompute-num-layers: must be positive (got 0)"),
    (["--recompute-num-layers", "4", "--recompute", "selective"],
     "--recompute-num-layers: only with --recompute full (got --recompute selective)"),
    (["--recompute-num-layers", "4", "--engine", "torchtitan"],
     "--recompute-num-layers: only with --engine megatron"),
])
def test_bad_block_requests_are_one_line_errors(extra, message):
    out = runner.invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                              "--global-batch", "64", "--seq-len", "8192", *extra])
    assert out.exit_code == 2
    assert message in out.output and "Traceback" not in out.output


def test_torchtitan_checkpoints_every_nth_block():
    """torchtitan's layer-level selective checkpointing (activation_checkpoint.py v0.2.2
    `_apply_layer_sac`: a per-process block counter, block i (from 1) wrapped where i % N == 0)
    reruns floor(n/N) of a rank's n blocks whatever its chunks: 8 blocks at N = 3 -> 2, at N = 2
    -> 4; 7 at N = 2 -> 3. Its working set stands above the n mod N blocks after the last rerun
    one (8 at N = 3: 2; at N = 2: none)."""
    from planner.train import kept_after_last_rerun

    config = TrainConfig(8, 4, 1, 1, "1f1b", 1, "full", True, 0, engine="torchtitan", recompute_every=3)
    assert recomputed_layers(config, (8, 8, 7)) == (2, 2, 2)
    assert recomputed_layers(config.with_(recompute_every=2), (8, 8, 7)) == (4, 4, 3)
    assert config.recompute_label == "full (every 3)"
    assert kept_after_last_rerun(config, 8, 2) == 2
    assert kept_after_last_rerun(config.with_(recompute_every=2), 8, 4) == 0
    # Megatron's block method: a chunk's first k rerun, its other (n - r)/v layers free before them
    megatron = TrainConfig(2, 2, 2, 1, "interleaved", 2, "full", True, 1, recompute_num_layers=3)
    assert kept_after_last_rerun(megatron, 16, 6) == 5


def test_torchtitan_job_config_for_every_nth_block():
    """Llama-3.1-405B on 128x8 H100, tp 8 pp 16, 1F1B, 1,024 x 8,192 (the torchtitan golden): no
    recompute and the per-op level do not fit; every block recomputed does, and so does every
    second block (4 of 8 a stage), which runs faster: the job config asks for layer-level
    selective checkpointing, mode "selective" with selective_ac_option "2"."""
    from planner.emit.torchtitan import job_sections

    model, cluster = resolve_model("llama-3.1-405b"), resolve_cluster("128x8xH100")
    request = TrainRequest(global_batch=1024, seq_len=8192, engine="torchtitan", schedule="1f1b",
                           layout=LayoutFilter(tp=8, pp=16, cp=1))
    best = search(model, cluster, request).layouts[0]
    assert (best.config.recompute, best.config.recompute_every) == ("full", 2)
    every = estimate(model, cluster, best.config.with_(recompute_every=None), request)
    assert isinstance(every, TrainEstimate) and best.tokens_per_second > every.tokens_per_second
    sections = job_sections(model, best.config, 1024, 8192)
    assert sections["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    out = runner.invoke(app, ["--workload", "train", "--engine", "torchtitan", "--model", "llama-3.1-405b",
                              "--cluster", "128x8xH100", "--global-batch", "1024", "--seq-len", "8192",
                              "--schedule", "1f1b", "--layout", "tp=8,pp=16,cp=1", "--json"])
    recommended = json.loads(out.output)["recommended"]
    assert (recommended["recompute"], recommended["recompute_every"], recommended["recompute_num_layers"]) == (
        "full", 2, None)


def test_megatron_never_reruns_the_mtp_blocks_under_block():
    """Megatron's block method skips the MTP modules ("recompute_method == 'block' is not
    supported for MTP yet. Skipping recompute.", multi_token_prediction.py core_v0.14.0 and
    core_v0.19.0), whatever k: DeepSeek-V3 (61 layers + 1 MTP) at tp 4, ep 256, one stage, block
    61 or 64 reruns every decoder layer but keeps the MTP block's activations (more memory than
    uniform, which reruns it too) and skips its rerun (a shorter step)."""
    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("32x8xH100")
    request = TrainRequest(global_batch=64, seq_len=4096)
    config = TrainConfig(4, 1, 64, 1, "1f1b", 1, "full", True, 2, ep=256)
    uniform = estimate(model, cluster, config, request)
    assert isinstance(uniform, TrainEstimate)
    for k in (61, 64):
        block = estimate(model, cluster, config.with_(recompute_num_layers=k), request)
        assert isinstance(block, TrainEstimate)
        assert block.memory.activation_bytes > uniform.memory.activation_bytes
        assert block.step_time_seconds < uniform.step_time_seconds


def test_margin_advice_names_a_larger_block_only_where_one_keeps_a_layer():
    """Qwen3-30B-A3B on 8 H100 at 8K tokens runs block 47 of its 48 layers: one more is every
    layer, which holds as much, so the margin line does not offer --recompute-num-layers above 47."""
    out = runner.invoke(app, ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100",
                              "--global-batch", "32", "--seq-len", "8192"])
    assert out.exit_code == 0, out.output
    flat = " ".join(out.output.split())
    assert "recompute full (block 47)" in flat and "Memory margin" in flat
    assert "--recompute-num-layers above 47" not in flat
