"""--grad-reduce bf16 (Megatron's --grad-reduce-in-bf16): main gradients in the parameters'
dtype, by hand in memory, data-parallel traffic and accumulation, and on the command line."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.training_memory import fsdp_unit_buffer_bytes, model_state_bytes
from planner.cost.training_time import _dp_ring_collectives
from planner.emit.megatron import megatron_steps
from planner.layout import GroupTopology, Link, Rejected, TrainConfig
from planner.requests import TrainRequest
from planner.train import estimate

LINK = Link("test", "intra_node", 100e9, 0.0)


def test_model_state_by_hand():
    """P = 1e9, d = 8: fp32 gradients 4e9 B, bf16 2e9 B (ZeRO-2: /8, 2.5e8); weights and the
    optimizer's 12 B/param unchanged. FSDP unit buffers at z = 3, 10 layers: 2 * 1e8 * (2 + 2)
    = 8e8 B (1.2e9 with fp32)."""
    assert model_state_bytes(1e9, 8, 0, 2).gradient_bytes == 2e9
    assert model_state_bytes(1e9, 8, 2, 2).gradient_bytes == 2.5e8
    assert model_state_bytes(1e9, 8, 1, 2).optimizer_bytes == model_state_bytes(1e9, 8, 1).optimizer_bytes
    assert fsdp_unit_buffer_bytes(1e9, 10, 3, 2) == pytest.approx(8e8)


def test_dp_traffic_halves():
    """d = 4 in one node at 77 GB/s effective: the ZeRO-1 reduce-scatter of 2e9 B of bf16
    gradients takes 3/4 * 2e9 / 77e9 = 19.5 ms (39.0 in fp32); the weight gather is the same."""
    group = GroupTopology(4, 4, 1, LINK, None)
    bf16 = _dp_ring_collectives(1e9, 1, group, 2)
    fp32 = _dp_ring_collectives(1e9, 1, group, 4)
    assert bf16.gradient_seconds == pytest.approx(0.75 * 2e9 / 77e9)
    assert bf16.gradient_seconds == pytest.approx(fp32.gradient_seconds / 2)
    assert bf16.gather_seconds == pytest.approx(fp32.gather_seconds)


def test_estimate_and_command():
    """Llama-3.1-70B tp=4 pp=8 on 64 H100s (the NeMo H100 FP8 recipe's layout): bf16
    gradients use less memory per GPU, never a longer step, and the command says
    --grad-reduce-in-bf16."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("8x8xH100")
    config = TrainConfig(4, 8, 2, 1, "interleaved", 5, "none", True, 1)
    fp32 = estimate(model, cluster, config, TrainRequest(global_batch=128, seq_len=8192, precision="fp8"))
    bf16 = estimate(model, cluster, config, TrainRequest(global_batch=128, seq_len=8192, precision="fp8",
                                                         grad_reduce="bf16"))
    assert not isinstance(bf16, Rejected)
    assert isinstance(fp32, Rejected) or (bf16.memory.total_bytes < fp32.memory.total_bytes
                                          and bf16.step_time_seconds <= fp32.step_time_seconds)
    (step,) = megatron_steps(model, cluster, bf16.config, 128, 8192)
    assert "--grad-reduce-in-bf16" in step.argv


def test_fp16_models_reduce_fp32_gradients_as_priced():
    """A float16 checkpoint (GPT-3 175B) trains with --fp16, under which Megatron keeps main
    gradients in fp16 unless --accumulate-allreduce-grads-in-fp32 (validate_args implies it only
    for --bf16). The plan prices 4 B/param fp32 gradients, so the command carries the flag;
    with --grad-reduce bf16 (16-bit gradients) it carries neither that flag nor
    --grad-reduce-in-bf16, a bf16-only flag; a bf16 model never carries it."""
    gpt3, llama = resolve_model("gpt3-175b"), resolve_model("llama-3.1-70b")
    cluster = resolve_cluster("16x8xA100")
    config = TrainConfig(8, 8, 2, 1, "1f1b", 1, "selective", True, 1)
    (fp32,) = megatron_steps(gpt3, cluster, config, 1536, 2048)
    assert "--fp16" in fp32.argv and "--accumulate-allreduce-grads-in-fp32" in fp32.argv
    (half,) = megatron_steps(gpt3, cluster, config.with_(grad_reduce="bf16"), 1536, 2048)
    assert "--accumulate-allreduce-grads-in-fp32" not in half.argv and "--grad-reduce-in-bf16" not in half.argv
    (bf16,) = megatron_steps(llama, cluster, config, 1536, 2048)
    assert "--bf16" in bf16.argv and "--accumulate-allreduce-grads-in-fp32" not in bf16.argv


def test_cli_flag_and_torchtitan_refusal(run_plan):
    ok = run_plan("--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                  "--global-batch", "64", "--seq-len", "4096", "--grad-reduce", "bf16")
    assert ok.returncode == 0, ok.stderr
    assert "--grad-reduce-in-bf16" in ok.stdout
    titan = run_plan("--workload", "train", "--engine", "torchtitan", "--model", "llama-3.1-8b",
                     "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len", "4096", "--grad-reduce", "bf16")
    assert titan.returncode == 2 and len(titan.stderr.strip().splitlines()) == 1
    assert "--grad-reduce" in titan.stderr


def test_fp16_checkpoint_says_its_16_bit_gradients_are_fp16(run_plan):
    """--grad-reduce bf16 on a float16 checkpoint: the command has no bf16 gradient flag (Megatron
    has none under --fp16), so the gradients are fp16; the Precision line says so instead of
    implying bf16 (a CLI read). Without it the line names the fp32 flag the command carries."""
    base = ("--workload", "train", "--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536",
            "--seq-len", "2048")
    half = run_plan(*base, "--grad-reduce", "bf16")
    line = next(row for row in half.stdout.splitlines() if row.startswith("Precision"))
    assert "fp16 main gradients" in " ".join(half.stdout.split()) and "fp32 main" not in line
    full = run_plan(*base)
    assert "fp32 main gradients: --accumulate-allreduce-grads-in-fp32" in " ".join(full.stdout.split())
