"""The training planner through the CLI: JSON shape, the 4-stage bubble, errors, golden commands,
and the published anchors."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.engines import EngineVersions
from planner.train_search import TP_ACROSS_NODES_MARGIN

GOLDEN = Path(__file__).parent.parent / "golden" / f"megatron-{EngineVersions().megatron}"
"""Goldens for the default Megatron-LM release; UPDATE_GOLDEN=1 rewrites them (review the diff)."""
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
LAYOUT_KEYS = {
    "tp", "pp", "dp", "rank", "micro_batch_size", "num_micro_batches", "schedule", "virtual_stages",
    "recompute", "sequence_parallel", "zero_stage", "memory_per_gpu_bytes", "capacity_per_gpu_bytes",
    "memory", "step_time_seconds", "tokens_per_second", "tflops_per_gpu", "mfu", "bubble_fraction",
    "bubble_over_compute_ratio", "tp_allreduce_seconds_per_layer", "tp_link", "time_breakdown_seconds",
    "command", "num_layers_per_stage", "ep", "alltoall_seconds_per_layer", "alltoall_link",
}


def plan_json(*args: str) -> dict:
    result = CliRunner().invoke(app, ["--workload", "train", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_four_stage_bubble_through_the_cli():
    """4 stages, 4 micro-batches (B=4, b=1, dp=1): 7 units, busy 4 -> idle 3/7; ratio 3/4."""
    out = plan_json("--model", "llama-3.1-8b", "--cluster", "1x4xA100", "--layout", "tp=1,pp=4",
                    "--schedule", "gpipe", "--global-batch", "4", "--micro-batch", "1", "--seq-len", "2048")
    best = out["recommended"]
    assert best["bubble_fraction"] == 3 / 7
    assert best["bubble_over_compute_ratio"] == 3 / 4
    assert (best["tp"], best["pp"], best["dp"], best["schedule"]) == (1, 4, 1, "gpipe")


def test_json_shape():
    out = plan_json("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536", "--seq-len", "2048")
    assert out["workload"] == "train" and out["model"] == "gpt3-175b"
    assert LAYOUT_KEYS <= set(out["recommended"])
    assert set(out["recommended"]["memory"]) >= {"weights_bytes", "gradient_bytes", "optimizer_bytes",
                                                 "activation_bytes", "overhead_bytes"}
    assert set(out["recommended"]["time_breakdown_seconds"]) == {"compute", "bubble", "tp_comm", "pp_comm",
                                                                 "dp_comm_exposed", "ep_comm", "cp_comm", "host"}
    assert [layout["rank"] for layout in out["layouts"][:3]] == [1, 2, 3]
    assert all({"tp", "pp", "dp", "reasons"} <= set(r) and r["reasons"] for r in out["rejected"])
    assert any("attention heads 96 not divisible by tp=128" in r["reasons"] for r in out["rejected"])


def test_175b_on_16_nodes_combines_tp8_with_pipeline():
    """Narayanan et al. 2021 sec. 3.2, Takeaway #1, from the cost model: TP inside the node,
    PP across nodes."""
    out = plan_json("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536", "--seq-len", "2048")
    for layout in out["layouts"][:3]:
        assert layout["tp"] == 8 and layout["pp"] > 1


def test_model_on_two_nodes_keeps_tp_inside_a_node():
    out = plan_json("--model", "llama-3.1-8b", "--cluster", "2x8xA100", "--global-batch", "256", "--seq-len", "4096")
    assert out["recommended"]["tp"] <= 8 and out["recommended"]["tp_link"] in ("nvlink", None)


def test_anchor_narayanan_145b_fixed_layout():
    """Narayanan et al. 2021 (SC21) Table 1: 145.6B GPT on 1536 A100-80GB, t=8, p=8, B=2304,
    b=2, full recompute, interleaved (5 layers per virtual stage): 148 TFLOP/s per GPU measured,
    with the materialized attention of the 2021 code."""
    out = plan_json("--model", "gpt-145.6b", "--cluster", "192x8xA100", "--layout", "tp=8,pp=8",
                    "--micro-batch", "2", "--recompute", "full", "--schedule", "interleaved",
                    "--virtual-stages", "2", "--global-batch", "2304", "--seq-len", "2048",
                    "--attention", "materialized")
    assert out["recommended"]["tflops_per_gpu"] == pytest.approx(148, rel=0.15)
    paper = plan_json("--model", "gpt-145.6b", "--cluster", "192x8xA100", "--layout", "tp=8,pp=8",
                      "--micro-batch", "2", "--recompute", "full", "--schedule", "interleaved",
                      "--virtual-stages", "2", "--global-batch", "2304", "--seq-len", "2048",
                      "--no-sequence-parallel", "--zero", "0", "--attention", "materialized")  # 2021
    assert paper["recommended"]["tflops_per_gpu"] == pytest.approx(148, rel=0.15)


def test_anchor_145b_full_search_keeps_tp_in_node():
    out = plan_json("--model", "gpt-145.6b", "--cluster", "192x8xA100", "--global-batch", "2304", "--seq-len", "2048")
    assert out["recommended"]["tp"] <= 8


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", "--workload", "train", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [
    ("--model", "gpt3-175b", "--cluster", "16x8xA100", "--seq-len", "2048"),
    ("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536"),
    ("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1002", "--seq-len", "2048",
     "--layout", "tp=8,pp=8", "--micro-batch", "2"),
    ("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "6", "--seq-len", "2048",
     "--micro-batch", "4"),
])
def test_bad_training_inputs_exit_2_with_one_line(args):
    result = run_module(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "named"), [
    (("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--virtual-stages", "20"),  # 32 layers: 16 a stage at most
     "--virtual-stages 20: no configuration runs"),
    (("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--zero", "3", "--layout", "tp=1,pp=2"),
     "--layout tp=1,pp=2 --zero 3: no configuration runs"),
    (("--model", "qwen3-32b", "--cluster", "2x8xH100", "--engine", "torchtitan", "--layout", "pp=2"),
     "cannot pipeline qwen3"),
])
def test_flags_that_rule_out_every_configuration_exit_2_naming_them(args, named):
    """The request's own flags leave nothing to run, with no configuration out of memory: a mistake
    in the input (exit 2, one line naming the flags and why), not "nothing fits" (exit 1)."""
    result = run_module(*args, "--global-batch", "64", "--seq-len", "4096")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.stderr


def test_flags_with_a_layout_out_of_memory_still_exit_1():
    """Narrowed by --layout but failing on memory: more GPUs, recompute or ZeRO would change that,
    so it is "nothing fits" with what would fit (exit 1)."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-70b", "--cluster", "1x2xH100",
                                      "--layout", "tp=2", "--global-batch", "8", "--seq-len", "4096"])
    assert result.exit_code == 1


def test_nothing_fits_says_how_many_gpus_would():
    """70B on one H100 needs its model states sharded or split: doubling the GPUs (2, 4, 8 in a
    node, then nodes of 8) the first size with a configuration is 16 GPUs, and the plan says so,
    with the configuration, in the text and in JSON; that cluster's own plan has it."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import TrainRequest
    from planner.train_search import search

    args = ["--workload", "train", "--model", "llama-3.1-70b", "--cluster", "1x1xH100", "--global-batch", "64",
            "--seq-len", "4096"]
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 1 and "What would fit: 16 GPUs (2x8xH100-SXM5-80GB" in " ".join(text.output.split())
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert data["suggestions"] and data["suggestions"][0].startswith("16 GPUs")
    bigger = search(resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100"),
                    TrainRequest(global_batch=64, seq_len=4096))
    c = bigger.layouts[0].config
    assert f"tp={c.tp} cp={c.cp} pp={c.pp} dp={c.dp}" in data["suggestions"][0]


def test_what_would_fit_keeps_the_request_as_asked():
    """--layout tp=8,pp=1 on one H100 node: the suggestion searches bigger clusters with dp free
    (the request as asked, not dp fixed to this cluster's 1), and --gpus 8 of 16 nodes doubles
    from the 8 planned, not from the cluster's 128."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import LayoutFilter, TrainRequest
    from planner.train_search import search

    fixed = search(resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100"),
                   TrainRequest(global_batch=128, seq_len=4096, layout=LayoutFilter(tp=8, pp=1)))
    assert not fixed.layouts and fixed.suggestions[0].endswith("(sizes tried by doubling)")
    assert "tp=8 cp=1 pp=1" in fixed.suggestions[0]
    subset = search(resolve_model("llama-3.1-405b"), resolve_cluster("16x8xH100"),
                    TrainRequest(global_batch=512, seq_len=8192, num_gpus=8))
    # more of the cluster first, in its own words: plan with --gpus (not a catalog cluster of that size)
    gpus = int(subset.suggestions[0].split("--gpus ")[1].rstrip("."))
    assert f"on {gpus} GPUs of this cluster" in subset.suggestions[0]
    assert gpus <= 128 and search(resolve_model("llama-3.1-405b"), resolve_cluster("16x8xH100"),
                                  TrainRequest(global_batch=512, seq_len=8192, num_gpus=gpus)).layouts


def test_what_would_fit_for_a_gpu_the_catalog_cannot_grow(tmp_path):
    """A profile's own GPU has no catalog node to build bigger clusters of: the plan says so
    rather than that nothing fits."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import TrainRequest
    from planner.train_search import search

    profile = tmp_path / "mine.yaml"
    profile.write_text("name: mine\nnum_nodes: 1\ngpus_per_node: 4\n"
                       "gpu: {name: MyGPU-48GB, memory_gib: 48, hbm_bandwidth_gb_per_s: 3000, "
                       "peak_tflops: {bf16: 500}}\n"
                       "intra_node: {kind: nvlink, bandwidth_gb_per_s: 300, latency_us: 1.0}\n")
    plan = search(resolve_model("llama-3.1-70b"), resolve_cluster(str(profile)),
                  TrainRequest(global_batch=128, seq_len=4096))
    assert not plan.layouts and plan.suggestions[0].startswith("the catalog cannot build a larger cluster of MyGPU")


def test_no_feasible_layout_exits_1():
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "gpt3-175b", "--cluster", "1x8xA100",
                                      "--global-batch", "8", "--seq-len", "2048"])
    assert result.exit_code == 1
    assert "out of memory on stage" in result.output


@pytest.mark.parametrize("name, args", [
    ("gpt3-175b_16x8xA100", ("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536",
                             "--seq-len", "2048")),
    ("llama-3.1-8b_1x4xA100_gpipe", ("--model", "llama-3.1-8b", "--cluster", "1x4xA100", "--layout", "tp=1,pp=4",
                                     "--schedule", "gpipe", "--global-batch", "4", "--micro-batch", "1",
                                     "--seq-len", "2048")),
    ("gpt-145.6b_192x8xA100", ("--model", "gpt-145.6b", "--cluster", "192x8xA100", "--layout", "tp=8,pp=8",
                               "--micro-batch", "2", "--recompute", "full", "--schedule", "interleaved",
                               "--virtual-stages", "2", "--global-batch", "2304", "--seq-len", "2048")),
    # uneven stages: 126 layers as 7 | 8 x14 | 7 (Llama 3 405B's split)
    ("llama-3.1-405b_128x8xH100_pp16", ("--model", "llama-3.1-405b", "--cluster", "128x8xH100", "--layout",
                                        "tp=8,pp=16,cp=1", "--schedule", "1f1b", "--global-batch", "1024",
                                        "--seq-len", "8192")),
    # interleaved, the embedding and loss counted as layers: 128 units over 64 chunks of 2,
    # 3 | 4 x30 | 3 (beats the first/last split 4 | 4 x30 | 2: a lighter first stage)
    ("llama-3.1-405b_128x8xH100_pp32_interleaved", ("--model", "llama-3.1-405b", "--cluster", "128x8xH100",
                                                    "--layout", "tp=8,pp=32,cp=1", "--schedule", "interleaved",
                                                    "--virtual-stages", "2", "--global-batch", "1024",
                                                    "--seq-len", "8192")),
    # NeMo / Megatron-Bridge's 405B recipe (tp 8, pp 8, cp 2, vp 8): --account-for-embedding/loss
    # -in-pipeline-split, 15 | 16 x6 | 15, v named by --num-virtual-stages-per-pipeline-rank
    ("llama-3.1-405b_128x8xH100_pp8_vp8_account", ("--model", "llama-3.1-405b", "--cluster", "128x8xH100",
                                                   "--layout", "tp=8,pp=8,cp=2", "--virtual-stages", "8",
                                                   "--micro-batch", "1", "--global-batch", "1536",
                                                   "--seq-len", "8192", "--precision", "fp8")),
    # uneven and interleaved: 12 | 14 x4 | 12 in chunks of 2 (80 + 2 does not divide over 12
    # chunks), named by --num-virtual-stages-per-pipeline-rank; b = 3 gives m = 160, not a
    # multiple of 6: Megatron's micro-batch groups of 7 (160 % 7 = 6)
    ("llama-3.1-70b_12x8xH100_pp6_interleaved", ("--model", "llama-3.1-70b", "--cluster", "12x8xH100",
                                                 "--layout", "tp=8,pp=6", "--schedule", "interleaved",
                                                 "--virtual-stages", "2", "--global-batch", "960",
                                                 "--seq-len", "4096")),
    # MoE: experts, top-k, expert FFN size, RoPE base 1e6
    ("mixtral-8x7b_4x8xH100", ("--model", "mixtral-8x7b", "--cluster", "4x8xH100", "--global-batch", "512",
                               "--seq-len", "4096")),
    # the question: DeepSeek-V3 with expert parallelism (whole experts per GPU, alltoall
    # dispatcher, grouped GEMMs) and pipeline parallelism, MLA and the MoE architecture flags
    ("deepseek-v3_256x8xH100_ep", ("--model", "deepseek-v3", "--cluster", "256x8xH100", "--global-batch", "4096",
                                   "--seq-len", "4096")),
    # FP8 through Transformer Engine: hybrid format, delayed scaling, 1024-step amax history (max)
    ("llama-3.1-8b_1x8xH100_fp8", ("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256",
                                   "--seq-len", "8192", "--precision", "fp8")),
    # FP8 current scaling: --fp8-recipe tensorwise, no amax-history flags
    ("llama-3.1-8b_1x8xH100_fp8_tensorwise", ("--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                              "--global-batch", "256", "--seq-len", "8192", "--precision", "fp8",
                                              "--fp8-recipe", "tensorwise")),
    # MXFP8 block scaling on Blackwell: --fp8-recipe mxfp8
    ("llama-3.1-70b_4x8xB200_mxfp8", ("--model", "llama-3.1-70b", "--cluster", "4x8xB200",
                                      "--global-batch", "256", "--seq-len", "8192", "--precision", "fp8",
                                      "--fp8-recipe", "mxfp8")),
    # context parallelism for a long sequence: --context-parallel-size, --cp-comm-type p2p
    ("llama-3.1-70b_32x8xH100_cp", ("--model", "llama-3.1-70b", "--cluster", "32x8xH100", "--global-batch", "64",
                                    "--seq-len", "131072")),
    # context parallelism with expert parallelism: the EP group folds over the 8 CP ranks of a
    # node (--context-parallel-size 8 with --expert-model-parallel-size 8)
    ("qwen3-30b-a3b_4x8xH100_cp_ep", ("--model", "qwen3-30b-a3b", "--cluster", "4x8xH100", "--global-batch", "128",
                                      "--seq-len", "32768")),
    # FlashAttention-2 pinned (--attention-backend flash --flash-attention-version 2), as NeMo
    # 24.03's long-sequence runs ran at: Llama-2-7B at 128K tokens on tp 4 x cp 4 (their row)
    ("llama-2-7b_16x8xH100_cp_fa2", ("--model", "llama-2-7b", "--cluster", "16x8xH100", "--layout", "tp=4,cp=4",
                                     "--global-batch", "32", "--seq-len", "131072", "--precision", "fp8",
                                     "--attention-kernel", "fa2")),
    # a two-matrix squared-ReLU MLP (--squared-relu; Megatron's default there is GELU) and
    # LayerNorm: Nemotron-4 340B as NeMo trained it, tp 8 pp 12 on 96 nodes' worth of GPUs
    ("nemotron-4-340b_12x8xH100", ("--model", "nemotron-4-340b", "--cluster", "12x8xH100", "--layout", "tp=8,pp=12",
                                   "--global-batch", "768", "--seq-len", "4096")),
    # bf16 main gradients and bf16 Adam moments (the precision-aware optimizer: TE's FusedAdam
    # inside the distributed optimizer), as NeMo's 340B config keeps them: 128 GPUs then fit
    # tp 8 pp 8 with no recompute (fp32 states need full recompute there)
    ("nemotron-4-340b_16x8xH100_bf16_states", ("--model", "nemotron-4-340b", "--cluster", "16x8xH100",
                                               "--layout", "tp=8,pp=8", "--global-batch", "32", "--seq-len", "4096",
                                               "--precision", "fp8", "--grad-reduce", "bf16",
                                               "--optimizer-states", "bf16")),
    # q/k/v biases; ZeRO-3 as Megatron-FSDP: fsdp_dtensor checkpoints, no CUDA_DEVICE_MAX_CONNECTIONS
    ("qwen2.5-72b_4x8xH100_zero3", ("--model", "qwen2.5-72b", "--cluster", "4x8xH100", "--global-batch", "512",
                                    "--seq-len", "4096", "--zero", "3")),
])
def test_megatron_golden(name, args):
    """The default Megatron-LM release's argv (env prefix, torchrun, pretrain_gpt.py), shown with shlex.join."""
    recommended = plan_json(*args)["recommended"]
    (step,) = recommended["command"]
    assert isinstance(step["argv"], list) and all(isinstance(a, str) for a in step["argv"])
    argv = step["argv"]
    num_nodes = int(argv[argv.index("--nnodes") + 1]) if "--nnodes" in argv else 1
    assert step["role"] == "all" and (step["nodes"]["first"], step["nodes"]["count"]) == (0, num_nodes)
    assert shlex.join(step["argv"]) == step["shell"]
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        (GOLDEN / f"{name}.txt").write_text(step["shell"] + "\n")
    assert step["shell"] + "\n" == (GOLDEN / f"{name}.txt").read_text()


def test_sequence_parallelism_needs_the_sequence_divisible_by_tp():
    """Megatron splits each CP rank's s/cp tokens over the TP group (its reduce-scatter asserts
    divisibility): 4,097 tokens at tp=8 cannot (4097 = 8 * 512 + 1), 4,096 can; with cp=2,
    8,200 / 2 = 4,100 = 8 * 512 + 4 cannot."""
    from planner.layout import TrainConfig
    from planner.train import sequence_parallel_reasons

    config = TrainConfig(tp=8, pp=2, dp=1, micro_batch_size=1, schedule="1f1b", virtual_stages=1,
                         recompute="full", sequence_parallel=True, zero_stage=1)
    assert "seq-len 4097 not divisible by tp=8" in sequence_parallel_reasons(config, 4097)[0]
    assert sequence_parallel_reasons(config, 4096) == []
    assert sequence_parallel_reasons(replace(config, sequence_parallel=False), 4097) == []
    assert "4100 not divisible by tp=8" in sequence_parallel_reasons(replace(config, cp=2), 8200)[0]
    data = plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len", "4097",
                     "--layout", "tp=8")
    assert data["recommended"] is not None and not data["recommended"]["sequence_parallel"]


def test_a_training_launcher_plans_under_its_engine():
    """`--emit torchtitan` alone plans as `--engine torchtitan` (its config is the plan's); naming
    the other engine with --engine is refused."""
    data = plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len", "4096",
                     "--emit", "torchtitan")
    assert data["engine"] == "torchtitan"
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--global-batch", "64", "--seq-len", "4096", "--engine", "megatron",
                                      "--emit", "torchtitan"])
    assert result.exit_code == 2 and "--emit torchtitan" in result.output


def test_the_closest_rejected_layouts_are_the_smallest_overshoot():
    """Llama-3.1-405B on 64 H100 at 8K fits nowhere. A layout whose every configuration runs
    out of memory carries its smallest overshoot, so the table's "closest" are the layouts
    that come nearest (tp=8 pp=8 misses by about 35 GiB; tp=1 layouts by 86 GiB and more),
    not the first in tp order."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.render.common import closest_misses
    from planner.requests import TrainRequest
    from planner.train_search import search

    plan = search(resolve_model("llama-3.1-405b"), resolve_cluster("8x8xH100"),
                  TrainRequest(global_batch=256, seq_len=8192))
    assert plan.recommended is None
    shown, _ = closest_misses(plan.rejected, 12)
    overshoots = [r.over_bytes for r in shown]
    assert all(o > 0 for o in overshoots) and overshoots == sorted(overshoots)
    tp8_pp8 = next(r for r in plan.rejected if (r.layout.tp, r.layout.pp, r.layout.cp) == (8, 8, 1))
    assert tp8_pp8 in shown
    assert all(r.layout.tp > 1 for r in shown[:3])


def test_moe_training_says_how_far_its_times_are_calibrated():
    """An MoE plan warns that its times are calibrated loosely (docs/cost-model.md, Known
    limitations: NVIDIA's published MoE runs are 13% off at the median, mostly slower); a dense
    plan does not."""
    moe = CliRunner().invoke(app, ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100",
                                   "--global-batch", "512", "--seq-len", "4096"])
    dense = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                     "--global-batch", "256", "--seq-len", "4096"])
    assert moe.exit_code == 0 and dense.exit_code == 0, moe.output + dense.output
    assert "MoE training times are calibrated loosely" in " ".join(moe.output.split())
    assert "calibrated loosely" not in dense.output
    # and with the numbers wherever they go: JSON `notes`, plan explain's notes
    moe_json = plan_json("--model", "qwen3-30b-a3b", "--cluster", "2x8xH100", "--global-batch", "512",
                         "--seq-len", "4096")
    assert any("calibrated loosely" in note for note in moe_json["notes"])
    assert plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256",
                     "--seq-len", "4096")["notes"] == []
    from planner.catalog import resolve_cluster, resolve_model
    from planner.explain_train import explain_training
    from planner.requests import TrainRequest

    explained = explain_training(resolve_model("qwen3-30b-a3b"), resolve_cluster("2x8xH100"),
                                 TrainRequest(global_batch=512, seq_len=4096), settings=None)
    assert any("calibrated loosely" in note for note in explained.notes)


def test_moe_comm_overlap_typed_for_a_dense_model_is_refused():
    """--moe-comm-overlap asks for an MoE-only mechanism: for a dense model it would be dropped
    silently, so it is a one-line error (exit 2); the default and --no-moe-comm-overlap pass."""
    args = ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256",
            "--seq-len", "4096"]
    refused = CliRunner().invoke(app, [*args, "--moe-comm-overlap"])
    assert refused.exit_code == 2
    assert "--moe-comm-overlap: llama-3.1-8b has no experts" in refused.output
    assert CliRunner().invoke(app, [*args, "--no-moe-comm-overlap"]).exit_code == 0


def test_a_wide_bubble_says_the_batch_is_small_for_the_gpus():
    """Llama-3.1-8B, global batch 7 on 64 H100s with TP kept in the node and no CP (--layout
    tp=8,cp=1): the best the GPUs allow is pp 8 with 7 micro-batches, (8-1)/(7+8-1) = 50% of
    compute + bubble, 48% of the step beside its TP and PP sends; the summary says so (the share
    of the step, as the Why line and the table's column give it) and names --global-batch and --gpus. (With CP searched, tp=8 cp=2 pp=4
    takes the ranks at a 4% bubble.) At a batch that fills the pipeline (1,024) there is no such line."""
    small = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "8x8xH100",
                                     "--global-batch", "7", "--seq-len", "4096", "--layout", "tp=8,cp=1"])
    assert small.exit_code == 0, small.output
    text = " ".join(small.output.split())
    assert "Bubble: 48% of the step the pipeline idles, with only 7 micro-batches over 8 stages" in text
    as_json = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "8x8xH100",
                                       "--global-batch", "7", "--seq-len", "4096", "--layout", "tp=8,cp=1", "--json"])
    best = json.loads(as_json.output)["recommended"]
    assert best["bubble_fraction"] == pytest.approx(7 / 14)
    share = best["time_breakdown_seconds"]["bubble"] / best["step_time_seconds"]
    assert best["bubble_share_of_step"] == pytest.approx(share) and round(share, 2) == 0.48
    assert f"{share:.1%}" in small.output and "bubble 48%" in text  # the table's column, the Why line
    assert "--global-batch" in text and "(--gpus)" in text
    full = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "8x8xH100",
                                    "--global-batch", "1024", "--seq-len", "4096"])
    assert full.exit_code == 0 and "Bubble:" not in full.output


LONG_CONTEXT_8B = ("--model", "llama-3.1-8b", "--cluster", "256x8xH100", "--global-batch", "256",
                   "--seq-len", "131072")
"""308 candidate layouts (context parallelism from dp): the table's search is bounded
(train_search.bounded_evaluation)."""


def test_the_table_says_what_its_bound_left_out_and_json_top_matches_it():
    """The table shows 10 rows and how many configurations were not estimated; --json --top 10
    bounds alike and lists the same ten; --json without --top and --show-rejected estimate
    everything (num_configs_bounded 0, every rejection)."""
    table = CliRunner().invoke(app, ["--workload", "train", *LONG_CONTEXT_8B])
    assert table.exit_code == 0, table.output
    assert "more not estimated: bounded below row 10" in " ".join(table.output.split())
    top = plan_json(*LONG_CONTEXT_8B, "--top", "10")
    everything = plan_json(*LONG_CONTEXT_8B)
    assert top["num_configs_bounded"] > 0 and everything["num_configs_bounded"] == 0
    assert len(everything["layouts"]) > 10 * len(top["layouts"]) > 0
    key = lambda layout: (layout["tp"], layout["cp"], layout["pp"], layout["dp"], layout["micro_batch_size"],  # noqa: E731
                          layout["schedule"], layout["virtual_stages"], layout["recompute"], layout["zero_stage"],
                          layout["sequence_parallel"], layout["tokens_per_second"])
    assert [key(x) for x in top["layouts"]] == [key(x) for x in everything["layouts"][:10]]
    assert len(top["rejected"]) < len(everything["rejected"])
    shown = CliRunner().invoke(app, ["--workload", "train", *LONG_CONTEXT_8B, "--show-rejected"])
    assert "not estimated" not in shown.output
    assert f"Rejected layouts ({len(everything['rejected']):,})" in shown.output


def test_tp_across_nodes_names_the_fastest_in_node_row():
    """Mixtral-8x7B on 128x8 A100 at 120 sequences of 4,096 tokens, materialized attention: the
    batch starves 1,024 GPUs, and tp=32 over InfiniBand beats TP inside a node by 16%, more than
    TP_ACROSS_NODES_MARGIN. The plan says so and names the first row whose TP stays in the node;
    JSON in_node_alternative points at that row."""
    args = ("--model", "mixtral-8x7b", "--cluster", "128x8xA100", "--global-batch", "120", "--seq-len", "4096",
            "--attention", "materialized")
    plan = plan_json(*args)
    best = plan["recommended"]
    assert best["tp"] > 8 and best["tp_link"] == "infiniband" and plan["tp_across_nodes_passed_over"] is None
    alt = plan["in_node_alternative"]
    rank = alt["rank"]
    rows = plan["layouts"]
    assert all(row["tp"] > 8 for row in rows[:rank - 1]) and rows[rank - 1]["tp"] <= 8
    assert alt["tp"] == rows[rank - 1]["tp"]
    assert alt["slower_fraction"] == pytest.approx(1 - rows[rank - 1]["tokens_per_second"] / best["tokens_per_second"])
    assert alt["slower_fraction"] > TP_ACROSS_NODES_MARGIN
    table = CliRunner().invoke(app, ["--workload", "train", *args], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())
    assert f"the fastest with TP inside a node is row {rank}: tp={alt['tp']}" in text
    assert f"(--layout tp={alt['tp']} keeps it)" in text


def test_tp_across_nodes_within_the_margin_is_passed_over():
    """GPT-OSS-120B with a global batch of 256 on 1,024 H100s: a host-bound corner (1,024 tokens
    per GPU) where tp=16 over InfiniBand prices 0.5% more tokens/s than tp=8 inside a node, under
    TP_ACROSS_NODES_MARGIN (3%): the plan recommends tp=8, says what it passed over and why, and
    lists the tp=16 row second; in_node_alternative has nothing to say."""
    args = ("--model", "gpt-oss-120b", "--cluster", "128x8xH100", "--global-batch", "256", "--seq-len", "4096")
    plan = plan_json(*args)
    best, over = plan["recommended"], plan["tp_across_nodes_passed_over"]
    assert best["tp"] <= 8 and best["tp_link"] == "nvlink" and plan["in_node_alternative"] is None
    assert over["tp"] > 8 and over["tp_link"] == "infiniband"
    assert 1 < over["tokens_per_second"] / best["tokens_per_second"] < 1 + TP_ACROSS_NODES_MARGIN
    assert plan["layouts"][1]["tokens_per_second"] == pytest.approx(over["tokens_per_second"])
    table = CliRunner().invoke(app, ["--workload", "train", *args], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())
    assert "Why: highest tokens/s with TP inside a node that fits" in text
    assert f"TP kept inside a node: tp={over['tp']}" in text and f"(--layout tp={over['tp']} takes it)" in text


def test_tp_inside_the_node_already_says_nothing():
    plan = plan_json("--model", "llama-3.1-70b", "--cluster", "16x8xH100", "--global-batch", "256", "--seq-len", "4096")
    assert plan["in_node_alternative"] is None and plan["tp_across_nodes_passed_over"] is None


def test_what_would_fit_skips_sizes_that_cannot_hold_the_states(monkeypatch):
    """Llama-3.1-70B's 70,553,706,496 parameters need 2 + 4 + 12 = 18 bytes each somewhere:
    1.27e12 bytes, more than 8 H100s hold (8 x 79.7 GiB of CUDA-visible memory = 6.85e11), so
    the suggestion searches no size below 16 GPUs, and still finds 16."""
    from planner import train_search
    from planner.catalog import resolve_cluster, resolve_model
    from planner.cost.training_memory import least_total_model_state_bytes
    from planner.requests import TrainRequest

    states = least_total_model_state_bytes(70_553_706_496, 4)
    assert states == 18 * 70_553_706_496 == 1_269_966_716_928
    h100 = resolve_cluster("1x1xH100")
    assert 8 * h100.gpu.cuda_visible_memory_bytes < states < 16 * h100.gpu.cuda_visible_memory_bytes
    searched = []
    real_search = train_search.search

    def counting(model, cluster, request, *args, **kwargs):
        searched.append(cluster.num_gpus)
        return real_search(model, cluster, request, *args, **kwargs)

    monkeypatch.setattr(train_search, "search", counting)
    found = train_search.more_gpus_suggestion(resolve_model("llama-3.1-70b"), h100,
                                              TrainRequest(global_batch=64, seq_len=4096))
    assert found.startswith("16 GPUs (2x8xH100-SXM5-80GB")
    assert searched == [16]


def test_json_schedule_is_null_without_pipelining():
    """pp = 1 runs no pipeline schedule (Megatron's forward_backward_no_pipelining; the table
    prints "no PP"): JSON's schedule is null there and names the schedule where pp > 1."""
    data = plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len", "4096")
    schedules = {(row["pp"], row["schedule"]) for row in data["layouts"]}
    assert {s for p, s in schedules if p == 1} == {None}
    assert {s for p, s in schedules if p > 1} <= {"1f1b", "interleaved", "gpipe"}
    assert any(p > 1 for p, _ in schedules)


@pytest.mark.parametrize(("update", "refused"), [
    ({"gated_mlp": False, "mlp_activation": "xielu"}, "this model's xielu MLP"),
    ({"mlp_activation": "gelu"}, "this model's gated gelu MLP"),  # GeGLU: --swiglu would be SiLU
    ({"gated_mlp": False, "mlp_activation": "squared_relu"}, None),
    ({}, None),
])
def test_megatron_builds_only_the_activations_it_has_flags_for(update, refused):
    from planner.catalog import resolve_model
    from planner.emit.megatron import model_refusals
    from planner.engines import parse_engine_versions

    model = resolve_model("llama-3.1-8b").model_copy(update=update)
    reasons = model_refusals(model, parse_engine_versions(None).megatron_release)
    assert (refused in reasons[0]) if refused else reasons == []


@pytest.mark.parametrize("update", [{"mlp_activation": "silu"}, {"gated_mlp": False, "mlp_activation": "gelu"}])
def test_the_usual_activation_spelled_out_still_launches(update):
    from planner.catalog import resolve_model
    from planner.emit.megatron import model_refusals
    from planner.engines import parse_engine_versions

    model = resolve_model("llama-3.1-8b").model_copy(update=update)
    assert model_refusals(model, parse_engine_versions(None).megatron_release) == []


def test_nothing_fits_under_the_flags_says_what_these_gpus_run_without_them():
    """--micro-batch 64 for Llama-3.1-8B at 8,192 tokens on 8 H100: 64 x 8,192 tokens of
    activations per GPU do not fit whatever the layout. The plan offered only more GPUs (16,
    still at micro-batch 64); with the fixed flags searched the same 8 GPUs train it, and that
    comes first. A request whose flags fix nothing gets no such line."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import TrainRequest
    from planner.train_search import search

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    fixed = search(model, cluster, TrainRequest(global_batch=512, seq_len=8192, micro_batch=64))
    free = search(model, cluster, TrainRequest(global_batch=512, seq_len=8192))
    assert not fixed.layouts and free.layouts
    c = free.layouts[0].config
    first = fixed.suggestions[0]
    assert first.startswith(f"these GPUs run tp={c.tp} cp={c.cp} pp={c.pp} dp={c.dp}")
    assert first.endswith(f"micro-batch {c.micro_batch_size} with --micro-batch 64 searched instead")
    assert any(s.endswith("(sizes tried by doubling)") for s in fixed.suggestions[1:])
    big = search(resolve_model("llama-3.1-70b"), resolve_cluster("1x1xH100"), TrainRequest(global_batch=64, seq_len=4096))
    assert not any("searched instead" in s for s in big.suggestions)


def test_a_pinned_schedule_that_no_pipelined_layout_survives_says_so():
    """Llama-3.1-70B on 32 H100, 512 x 4,096 tokens, --schedule gpipe: GPipe holds every
    micro-batch's activations, so each layout with stages runs out of memory and every row is
    pp = 1. The plan says the pin ruled the pipelines out (it printed Megatron's no-GPipe note
    about a plan without a pipeline; found by a CLI sweep)."""
    args = ["--workload", "train", "--model", "llama-3.1-70b", "--cluster", "4x8xH100", "--global-batch", "512",
            "--seq-len", "4096", "--schedule", "gpipe"]
    out = CliRunner().invoke(app, args).output
    assert "Note: --schedule gpipe: no layout with pipeline stages is feasible under it" in out
    assert "no GPipe schedule" not in out
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert {row["pp"] for row in data["layouts"]} == {1}
    assert any(row["pp"] > 1 and "out of memory" in row["reasons"][0] for row in data["rejected"])


def test_rotary_positions_beyond_the_model_are_trained_with_a_note_and_full_recompute_counts_both_ways():
    """Llama-3.1-8B (131,072 rotary positions) at --seq-len 262,144 on 1x8 H100 plans, and says
    the positions past 131,072 are outside the trained range; at the model's own length it says
    nothing. Where the plan recomputes every layer, the TFLOP/s line gives the 2021 paper's count
    and the model FLOPs the MFU counts: the first is the larger."""
    args = ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "8"]
    beyond = CliRunner().invoke(app, [*args, "--seq-len", "262144"])
    assert beyond.exit_code == 0, beyond.output
    text = " ".join(beyond.output.split())
    assert "Positions: --seq-len 262,144 is beyond llama-3.1-8b's 131,072" in text
    within = " ".join(CliRunner().invoke(app, [*args, "--seq-len", "8192"]).output.split())
    assert "Positions:" not in within
    best = plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "8", "--seq-len",
                     "262144")["layouts"][0]
    assert best["model_tflops_per_gpu"] <= best["tflops_per_gpu"]
    assert best["recompute"] == "full"  # 262,144 tokens a sequence on 8 GPUs
    count = text.split(" TFLOP/s per GPU (Narayanan et al. 2021's count")[0].split()[-1]
    model_count = text.split(" without it, the model FLOPs the MFU counts")[0].split()[-1]
    assert float(count) > float(model_count) == pytest.approx(best["model_tflops_per_gpu"], abs=0.5)


def test_table_says_what_tflops_counts_under_full_recompute():
    """The TFLOP/s column counts the rerun forward on full-recompute rows (Narayanan eq. 3) and
    model FLOPs elsewhere; the table's caption says so where such a row is shown, and not where
    none is (a CLI read found 602 TFLOP/s beside MFU 45.8% unexplained)."""
    args = ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
            "--seq-len", "4096"]
    full = CliRunner().invoke(app, [*args, "--recompute", "full"])
    none = CliRunner().invoke(app, [*args, "--recompute", "none"])
    assert full.exit_code == 0 and none.exit_code == 0
    assert "count the rerun layers' forward too" in " ".join(full.output.split())
    assert "rerun forward too" not in " ".join(none.output.split())


def test_json_says_which_peak_the_mfu_divides_by():
    """MFU is model FLOPs over the 16-bit dense peak, also for an fp8 plan (whose 0.85 would read
    as a share of the fp8 peak otherwise: a read); the JSON row names the basis."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--global-batch", "64", "--seq-len", "4096", "--precision", "fp8", "--json",
                                      "--top", "1"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    assert best["mfu_peak_basis"] == "16-bit dense"
    assert best["mfu"] == pytest.approx(best["model_tflops_per_gpu"] / 989, rel=1e-3)  # H100's bf16 peak


def test_a_pinned_zero_says_what_it_costs():
    """Llama-3.1-70B on 2x8 H100, 128 x 4,096, --zero 3: Megatron-FSDP takes no PP here and
    tp=8 dp=2 holds 18 B a parameter over 16 GPUs (79 GB), so the one fitting layout is tp=16 over
    InfiniBand at 65.7 s a step; without --zero the plan runs tp=8 pp=2 at 33.9 s. The plan says
    so (text and JSON notes); a --zero that costs under 20% gets no note."""

    args = ["--workload", "train", "--model", "llama-3.1-70b", "--cluster", "2x8xH100",
            "--global-batch", "128", "--seq-len", "4096"]
    text = CliRunner().invoke(app, [*args, "--zero", "3"])
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert "Note: --zero 3 costs 1.9x the step: without it the plan runs tp=8 pp=2 dp=1" in flat
    notes = json.loads(CliRunner().invoke(app, [*args, "--zero", "3", "--json"]).stdout)["notes"]
    assert notes[0].startswith("--zero 3 costs 1.9x the step")
    assert "--zero 1 costs" not in " ".join(CliRunner().invoke(app, [*args, "--zero", "1"]).output.split())


def test_a_torchtitan_plan_says_it_is_uncalibrated():
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--global-batch", "64", "--seq-len", "8192", "--engine", "torchtitan"])
    assert result.exit_code == 0, result.output
    assert "no torchtitan run is in the calibration set" in " ".join(result.output.split())


@pytest.mark.parametrize(("layout", "seq_len", "words"), [
    ("tp=8,pp=1", "4096", ("no pipeline boundaries (pp=1)", "no data-parallel group (dp=1)")),
    ("tp=2,pp=1,cp=4", "32768", ("no pipeline boundaries (pp=1)",
                                 "data parallel over the 4 ranks of dp x cp (the same weights) on nvlink")),
])
def test_the_summary_names_the_groups_a_layout_has(layout, seq_len, words):
    """The links line says what a layout lacks rather than "on -": dp = pp = 1 has no pipeline
    boundaries and no data-parallel group; at dp = 1 and cp = 4 the weights' data-parallel
    collectives (Megatron's distributed optimizer, FSDP) run over the dp x cp = 4 ranks (a CLI
    read: "data parallel on -" beside ZeRO-3, and "data parallel on infiniband" at dp=1)."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--global-batch", "8", "--seq-len", seq_len, "--layout", layout])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("TP group on"))
    for word in words:
        assert word in " ".join(result.output.split()), (word, line)
