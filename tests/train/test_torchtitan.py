"""torchtitan v0.2.2 as the training engine: the mapping of our configurations to its job config
(hand-checked), the CLI, the emitted TOML's keys against the release's dataclasses
(tests/engine_flags/torchtitan-v0.2.2.json, tools/torchtitan_fields.py), goldens, and a property:
every plan the search returns is one torchtitan runs."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost.params import param_counts
from planner.cost.training_memory import least_total_model_state_bytes
from planner.emit.torchtitan import job_sections, stage_modules, torchtitan_steps
from planner.engines import EngineVersions
from planner.layout import TrainConfig
from planner.requests import LayoutFilter, TrainRequest
from planner.train import config_reasons, least_state_bytes_per_param, memory_per_gpu
from planner.train_engines import (
    TORCHTITAN_AC_MODES,
    TORCHTITAN_RELEASE,
    TORCHTITAN_SCHEDULES,
    torchtitan_degrees,
    torchtitan_reasons,
    zero_stage_for,
)
from planner.train_search import search

ROOT = Path(__file__).resolve().parent.parent
FIELDS = json.loads((ROOT / "engine_flags" / f"torchtitan-{TORCHTITAN_RELEASE}.json").read_text())
GOLDEN = ROOT / "golden" / f"torchtitan-{TORCHTITAN_RELEASE}"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
BASE = ("--workload", "train", "--engine", "torchtitan")


def run(*args: str):
    return CliRunner().invoke(app, [*BASE, *args])


def plan_json(*args: str) -> dict:
    result = run("--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def key_problems(text: str) -> list[str]:
    """TOML sections and keys that torchtitan's JobConfig at the tag does not have."""
    problems = []

    def walk(table: dict, prefix: str) -> None:
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                if name not in FIELDS["sections"]:
                    problems.append(f"unknown section [{name}]")
                walk(value, f"{name}.")
            elif prefix.rstrip(".") not in FIELDS["sections"] or key not in FIELDS["sections"][prefix.rstrip(".")]:
                problems.append(f"unknown key {name}")

    walk(tomllib.loads(text), "")
    return problems


def config(**kw) -> TrainConfig:
    base = dict(tp=1, pp=1, dp=8, micro_batch_size=1, schedule="1f1b", virtual_stages=1, recompute="none",
                sequence_parallel=False, zero_stage=3)
    return TrainConfig(**{**base, **kw})


# ------------------------------------------------------------------ mapping, hand-checked

def test_schedule_and_activation_checkpoint_names():
    """torch.distributed.pipelining's names (get_schedule_class) and ActivationCheckpoint.mode's Literal."""
    assert TORCHTITAN_SCHEDULES == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
    assert TORCHTITAN_AC_MODES == {"none": "none", "op": "selective", "selective": "selective", "full": "full"}
    literal = FIELDS["sections"]["activation_checkpoint"]["mode"]
    assert all(f"'{mode}'" in literal for mode in TORCHTITAN_AC_MODES.values())


def test_schedule_names_are_torchs():
    pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
    for name in TORCHTITAN_SCHEDULES.values():
        assert pipelining.get_schedule_class(name) is not None


@pytest.mark.parametrize("tp, cp, pp, dp, zero, expected", [
    (1, 1, 1, 8, 3, (1, 8, 1, 1, 1)),    # FSDP over 8
    (1, 1, 1, 8, 0, (8, 1, 1, 1, 1)),    # DDP over 8
    (8, 1, 1, 8, 3, (1, 8, 8, 1, 1)),    # TP 8 + FSDP 8 = 64
    (8, 1, 4, 2, 1, (1, 2, 8, 4, 1)),    # FSDP under PP: dp_shard 2 x tp 8 x pp 4 = 64
    (2, 2, 1, 2, 3, (1, 2, 2, 1, 2)),    # CP joins the FSDP mesh: dp_shard*cp = 4
])
def test_degrees_multiply_to_the_gpus(tp, cp, pp, dp, zero, expected):
    d = torchtitan_degrees(config(tp=tp, cp=cp, pp=pp, dp=dp, zero_stage=zero, sequence_parallel=tp > 1))
    got = (d["data_parallel_replicate_degree"], d["data_parallel_shard_degree"], d["tensor_parallel_degree"],
           d["pipeline_parallel_degree"], d["context_parallel_degree"])
    assert got == expected
    assert got[0] * got[1] * got[2] * got[3] * got[4] == tp * cp * pp * dp


def test_zero_stages_torchtitan_runs():
    """No DP: 0. PP: FSDP keeps the stage whole through the step (ZeRO-1). Else FSDP (3), and DDP
    (0) only as pure replicas (parallelize_llama: "DDP has not supported > 1D parallelism")."""
    assert zero_stage_for(tp=8, pp=1, dp=1, cp=1) == (0,)
    assert zero_stage_for(tp=1, pp=1, dp=8, cp=1) == (3, 0)
    assert zero_stage_for(tp=8, pp=1, dp=8, cp=1) == (3,)
    assert zero_stage_for(tp=1, pp=1, dp=1, cp=2) == (3,)
    assert zero_stage_for(tp=8, pp=4, dp=2, cp=1) == (1,)


def test_reasons():
    model = resolve_model("llama-3.1-8b")  # 32 layers
    assert torchtitan_reasons(model, config(), 8192) == []
    assert any("ZeRO-2" in r for r in torchtitan_reasons(model, config(zero_stage=2), 8192))
    assert any("sequence parallelism" in r for r in torchtitan_reasons(model, config(tp=2, dp=4), 8192))
    # seq_len divisible by tp * 2 * cp (ParallelDims.seq_len_divisor): 8 * 2 * 2 = 32
    odd = config(tp=8, cp=2, dp=1, sequence_parallel=True)
    assert any("tp*2*cp = 32" in r for r in torchtitan_reasons(model, odd, 8200))
    # 32 layers over pp=4 in v=3 chunks: 8 per stage do not split into 3 equal chunks, but the
    # module lists name every part (3, 3, 2 layers); in v=9 chunks a part would be empty
    inter = config(pp=4, dp=2, schedule="interleaved", virtual_stages=3, zero_stage=1)
    assert torchtitan_reasons(model, inter, 8192) == []
    assert config_reasons(model, inter, 64, engine="torchtitan") == []
    nine = inter.with_(virtual_stages=9)
    assert any("layers per stage 8 not divisible by v=9, nor spread over 9 chunks" in r
               for r in config_reasons(model, nine, 64, engine="torchtitan"))
    # wk/wv are sharded over tp without replication: 8 KV heads take tp = 8, not 16
    wide = config(tp=16, dp=1, sequence_parallel=True)
    assert any("does not divide the 8 KV heads" in r for r in torchtitan_reasons(model, wide, 8192))
    # qwen3's TrainSpec has no pipelining_fn at v0.2.2
    piped = config(pp=2, dp=4, zero_stage=1)
    assert torchtitan_reasons(model, piped, 8192) == []
    assert any("cannot pipeline qwen3" in r for r in torchtitan_reasons(resolve_model("qwen3-32b"), piped, 8192))


def test_no_data_parallelism_with_tp_or_pp_would_train_in_fp32():
    """maybe_enable_amp (distributed/utils.py@v0.2.2): mixed precision comes from fully_shard
    when dp_shard*cp > 1, from autocast only without TP and PP; tp or pp > 1 at dp*cp = 1 runs
    fp32, which the planner does not price: refused. One GPU (autocast) and FSDP are not."""
    model = resolve_model("llama-3.1-8b")
    for bare in (config(tp=8, dp=1, zero_stage=0, sequence_parallel=True), config(pp=2, dp=1, zero_stage=0)):
        assert any("trains in fp32" in r for r in torchtitan_reasons(model, bare, 8192))
    assert not any("fp32" in r for r in torchtitan_reasons(model, config(dp=1, zero_stage=0), 8192))
    assert not any("fp32" in r for r in torchtitan_reasons(
        model, config(tp=4, dp=1, cp=2, sequence_parallel=True), 8192))
    result = run("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--layout", "tp=8", "--global-batch", "64",
                 "--seq-len", "8192")
    assert result.exit_code != 0 and "trains in fp32" in result.output


def test_model_states_are_fsdp2s_under_torchtitan():
    """FSDP2 keeps fp32 sharded parameters (the master copy) and Adam's two moments: (4 + 4 + 8)
    bytes per parameter over d, where Megatron keeps (2 + 4 + 12). Llama-3.1-8B (8.03e9
    parameters) on one stage at d = 8: the two differ by 2 * 8.03e9 / 8 = 2.01e9 B, weights
    +2 B/param, optimizer -4 B/param. torchtitan's DDP keeps fp32 parameters, their autocast
    bf16 copies, fp32 gradients and the moments: 6 + 4 + 8 = Megatron's 18. Under PP (ZeRO-1)
    the two engines' bytes are the same (2 + 4 + 12/d)."""
    model = resolve_model("llama-3.1-8b")
    params = param_counts(model).total
    zero3 = {e: memory_per_gpu(model, config(engine=e), 8192, 8) for e in ("megatron", "torchtitan")}
    assert zero3["torchtitan"].weights_bytes - zero3["megatron"].weights_bytes == pytest.approx(2 * params / 8)
    assert zero3["megatron"].optimizer_bytes - zero3["torchtitan"].optimizer_bytes == pytest.approx(4 * params / 8)
    assert zero3["megatron"].total_bytes - zero3["torchtitan"].total_bytes == pytest.approx(2 * params / 8, rel=1e-3)
    assert 2 * params / 8 == pytest.approx(2.01e9, rel=0.01)
    ddp = {e: memory_per_gpu(model, config(zero_stage=0, engine=e), 8192, 8) for e in ("megatron", "torchtitan")}
    assert ddp["torchtitan"].weights_bytes == pytest.approx(6 * params)
    assert ddp["torchtitan"].optimizer_bytes == pytest.approx(8 * params)
    assert ddp["torchtitan"].total_bytes == pytest.approx(ddp["megatron"].total_bytes)
    piped = {e: memory_per_gpu(model, config(pp=2, dp=4, zero_stage=1, engine=e), 8192, 8)
             for e in ("megatron", "torchtitan")}
    assert piped["torchtitan"] == replace(piped["megatron"])
    # the size skip's bound is the least the engine keeps: 16 B/param under torchtitan
    assert least_total_model_state_bytes(params, 4, least_state_bytes_per_param("torchtitan")) == 16 * params
    assert least_total_model_state_bytes(params, 4, least_state_bytes_per_param("megatron")) == 18 * params


def test_torchao_fp8_keeps_no_weight_copies_and_saves_16_bit_inputs():
    """torchao's Float8Linear and MXLinear cast the weight at each use and save the
    high-precision input and weight for the backward (ctx.save_for_backward(input_hp, ...)):
    under torchtitan fp8 adds no weight cache and saves no activation bytes, where Transformer
    Engine keeps its fp8 weight copies and saves 1-byte inputs. So torchtitan's fp8 memory is
    its bf16 memory, and Megatron's differs from both."""
    model = resolve_model("llama-3.1-8b")
    fp8 = dict(pp=2, dp=4, zero_stage=1, precision="fp8", fp8_recipe="tensorwise")
    titan = memory_per_gpu(model, config(**fp8, engine="torchtitan"), 8192, 8)
    titan_bf16 = memory_per_gpu(model, config(pp=2, dp=4, zero_stage=1, engine="torchtitan"), 8192, 8)
    megatron = memory_per_gpu(model, config(**fp8), 8192, 8)
    assert titan.total_bytes == pytest.approx(titan_bf16.total_bytes)
    assert megatron.weights_bytes > titan.weights_bytes  # TE's fp8 copies
    assert megatron.activation_bytes < titan.activation_bytes  # TE's 1-byte saved inputs


def test_what_torch_and_torchtitan_assert_at_start():
    """torch 2.13's Schedule1F1B raises below as many micro-batches as stages: pp = 4 with
    global batch 8 over dp 2 at b = 2 gives m = 2, refused; b = 1 gives m = 4, kept (Megatron's
    1F1B takes m < p). torchtitan v0.2.2's MXFP8 linears assert no TP under torch.compile,
    which its fp8 jobs enable: mxfp8 at tp = 2 refused, at tp = 1 kept."""
    model = resolve_model("llama-3.1-8b")
    piped = config(pp=4, dp=2, zero_stage=1)
    few = piped.with_(micro_batch_size=2)
    assert any("m=2 below p=4: torch's Schedule1F1B" in r for r in config_reasons(model, few, 8, engine="torchtitan"))
    assert config_reasons(model, few, 8, engine="megatron") == []
    assert config_reasons(model, piped, 8, engine="torchtitan") == []
    mx = config(tp=2, dp=4, sequence_parallel=True).with_(precision="fp8", fp8_recipe="mxfp8")
    assert any("MXFP8 linears refuse TP under torch.compile" in r for r in torchtitan_reasons(model, mx, 8192))
    assert not any("MXFP8" in r for r in torchtitan_reasons(model, mx.with_(tp=1, dp=8, sequence_parallel=False),
                                                            8192))


def test_moe_reasons():
    """MoE under torchtitan: EP needs FSDP (not DDP, not dp*cp = 1); deepseek_v3's and gpt_oss's
    flex attention refuses CP; gpt_oss cannot pipeline; float8 MoE runs without PP and CP; CP with
    EP runs (the experts' mesh folds the CP ranks in, efsdp = dp_shard*cp*tp/ep)."""
    qwen, deepseek, oss = (resolve_model(name) for name in ("qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"))
    ep = config(dp=8, ep=8)
    assert torchtitan_reasons(qwen, ep, 8192) == []
    assert any("expert parallelism only under FSDP" in r for r in torchtitan_reasons(qwen, config(dp=8, ep=8, zero_stage=0),
                                                                               8192))
    assert any("flex attention" in r for r in torchtitan_reasons(deepseek, config(dp=4, cp=2), 8192))
    assert any("flex attention" in r for r in torchtitan_reasons(oss, config(dp=4, cp=2), 8192))
    assert torchtitan_reasons(qwen, config(dp=4, cp=2), 8192) == []
    assert any("cannot pipeline gpt_oss" in r for r in torchtitan_reasons(oss, config(pp=2, dp=4, zero_stage=1), 8192))
    assert any("float8 MoE" in r
               for r in torchtitan_reasons(deepseek, config(pp=2, dp=4, zero_stage=1, precision="fp8"), 8192))
    mx = config(pp=2, dp=4, zero_stage=1, precision="fp8", fp8_recipe="mxfp8")  # MXFP8's grouped GEMMs do pipeline
    assert not any("float8 MoE" in r for r in torchtitan_reasons(deepseek, mx, 8192))
    assert torchtitan_reasons(qwen, config(dp=4, cp=2, ep=2), 8192) == []


def test_moe_host_sync_only_where_torchtitan_syncs():
    """torchtitan's MoE block syncs on its split sizes under EP only (expert_parallel.py), gpt_oss's
    always (int(offsets[-1])); Megatron's dropless layers always; dense models never."""
    from planner.train_engines import moe_forward_syncs

    qwen, oss, llama = (resolve_model(name) for name in ("qwen3-30b-a3b", "gpt-oss-120b", "llama-3.1-8b"))
    assert (moe_forward_syncs("torchtitan", qwen, 1), moe_forward_syncs("torchtitan", qwen, 8)) == (False, True)
    assert moe_forward_syncs("torchtitan", oss, 1) and moe_forward_syncs("megatron", qwen, 1)
    assert not moe_forward_syncs("megatron", llama, 1)
    # below SM90 deepseek_v3, llama4 and gpt_oss turn grouped GEMMs off (args.py) and loop over
    # their experts, reading the token counts on the host (_run_experts_for_loop); qwen3 does not
    dsv3, scout = resolve_model("deepseek-v3"), resolve_model("llama-4-scout")
    assert not moe_forward_syncs("torchtitan", dsv3, 1, 9.0)
    assert moe_forward_syncs("torchtitan", dsv3, 1, 8.0) and moe_forward_syncs("torchtitan", scout, 1, 8.0)
    assert not moe_forward_syncs("torchtitan", qwen, 1, 8.0)


def test_moe_job_config_has_expert_parallelism_and_fp8_experts():
    """ep=8 on 16 GPUs: expert_parallel_degree 8 with expert_tensor_parallel_degree 1; fp8
    converts the experts' grouped GEMMs too and leaves the router's gate 16-bit."""
    out = plan_json("--model", "qwen3-30b-a3b", "--cluster", "2x8xH100", "--global-batch", "256", "--seq-len", "4096",
                    "--layout", "ep=8", "--precision", "fp8")
    (step,) = out["recommended"]["command"]
    text = step["files"][0]["text"]
    assert "expert_parallel_degree = 8\nexpert_tensor_parallel_degree = 1" in text
    assert 'converters = ["quantize.linear.float8", "quantize.grouped_mm.float8"]' in text
    assert 'filter_fqns = ["output", "router.gate"]' in text and 'fqns = ["experts"]' in text
    assert "[compile]\nenable = true" in text  # torchtitan's fp8 needs compile to fuse its casts
    assert key_problems(text) == []
    bf16 = plan_json("--model", "qwen3-30b-a3b", "--cluster", "2x8xH100", "--global-batch", "256", "--seq-len",
                     "4096", "--layout", "ep=8")
    assert "[compile]" not in bf16["recommended"]["command"][0]["files"][0]["text"]


def test_uneven_interleaved_split_names_every_model_part():
    """7 layers on pp = 2 as 4 | 3, v = 2: chunks (2, 2) and (2, 1); torchtitan's looped schedule
    puts part k on rank k % 2 as its chunk k // 2, so parts in order are stage 0 chunk 0 (2),
    stage 1 chunk 0 (2), stage 0 chunk 1 (2), stage 1 chunk 1 (1), the layers consecutive, the
    embedding first and the norm and head last (Megatron's layout string: "Ett|tt|tt|tL")."""
    from planner.cost.stage_split import megatron_layout
    from planner.emit.torchtitan import stage_modules

    assert stage_modules(7, 2, (4, 3), 2) == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3"],
                                              ["layers.4", "layers.5"], ["layers.6", "norm", "output"]]
    assert megatron_layout((4, 3), 2) == "Ett|tt|tt|tL"


def test_405b_interleaves_with_uneven_stages_under_torchtitan():
    """Llama 3 405B's 126 layers over 16 stages (7 | 8 x14 | 7) interleave under torchtitan as
    under Megatron, one module list per model part (32 of them at v = 2); before, torchtitan
    interleaving needed p*v to divide L and this layout ran plain 1F1B. On 256 GPUs, dp = 2:
    at dp = 1 torchtitan would train in fp32 (test_no_data_parallelism_with_tp_or_pp_would_train_in_fp32)."""
    out = plan_json("--model", "llama-3.1-405b", "--cluster", "32x8xH100", "--global-batch", "1024", "--seq-len",
                    "8192", "--layout", "tp=8,pp=16", "--schedule", "interleaved", "--virtual-stages", "2")
    (step,) = out["recommended"]["command"]
    text = step["files"][0]["text"]
    parts = re.search(r"module_fqns_per_model_part = (\[.*\])", text)
    assert parts and 'pipeline_parallel_schedule = "Interleaved1F1B"' in text
    modules = json.loads(parts[1])
    assert len(modules) == 32 and sum(1 for part in modules for name in part if name.startswith("layers.")) == 126
    assert key_problems(text) == []


def test_context_parallel_writes_only_its_degree():
    """torchtitan's training step keeps torch's default KV all-gather: the rotate-method key
    reaches only the validator (components/validate.py@v0.2.2), so none is written."""
    model = resolve_model("llama-3.1-8b")
    sections = job_sections(model, config(tp=2, cp=2, dp=2, sequence_parallel=True), 256, 8192)
    assert sections["parallelism"]["context_parallel_degree"] == 2
    assert not any("rotate" in key for keys in sections.values() for key in keys)


def test_batch_and_stages_in_the_job_config():
    """B=256, b=2, dp=2, pp=4 (32 layers, v=2): m = 64 micro-batches, all in local_batch_size = 128,
    cut into micro-batches of 2; 32 / (4*2) = 4 layers per virtual stage. Without PP b = 2 is the
    local batch and torchtitan accumulates 256 / (2*8) = 16 of them."""
    model = resolve_model("llama-3.1-8b")
    piped = job_sections(model, config(pp=4, dp=2, micro_batch_size=2, schedule="interleaved",
                                       virtual_stages=2, zero_stage=1), 256, 8192)
    assert piped["training"] == {"local_batch_size": 128, "global_batch_size": 256, "seq_len": 8192}
    par = piped["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert par["pipeline_parallel_layers_per_stage"] == 4
    flat = job_sections(model, config(micro_batch_size=2, recompute="selective"), 256, 8192)
    assert flat["training"]["local_batch_size"] == 2
    assert flat["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    per_op = job_sections(model, config(micro_batch_size=2, recompute="op"), 256, 8192)
    assert per_op["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_uneven_split_names_each_stage():
    """126 layers as 7 | 8 x14 | 7 over 16 stages: embedding first, norm and head last."""
    parts = stage_modules(126, 16, (7, 7))
    assert len(parts) == 16 and [len(p) for p in parts] == [8] + [8] * 14 + [9]
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[-1][-3:] == ["layers.125", "norm", "output"]
    assert sum(1 for p in parts for n in p if n.startswith("layers.")) == 126


# ------------------------------------------------------------------ the CLI

def test_cli_prints_the_toml_and_torchrun():
    result = run("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256", "--seq-len", "8192")
    assert result.exit_code == 0, result.output
    assert f"torchtitan {TORCHTITAN_RELEASE} job config" in result.output
    assert "[parallelism]" in result.output and "data_parallel_shard_degree" in result.output
    assert "torchrun --standalone --nproc-per-node 8 -m torchtitan.train --job.config_file" in result.output


def test_json_says_the_engine_and_carries_the_file():
    out = plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256", "--seq-len", "8192")
    assert out["engine"] == "torchtitan"
    (step,) = out["recommended"]["command"]
    (file,) = step["files"]
    assert file["path"] in step["argv"] and key_problems(file["text"]) == []


def test_megatron_stays_the_default():
    result = CliRunner().invoke(app, ["--workload", "train", "--json", "--model", "llama-3.1-8b", "--cluster",
                                      "1x8xH100", "--global-batch", "256", "--seq-len", "8192"])
    out = json.loads(result.output)
    assert out["engine"] == "megatron" and "pretrain_gpt.py" in out["recommended"]["command"][0]["argv"]


@pytest.mark.parametrize("args, message", [
    (("--engine", "foo"), "--engine"),
    (("--workload", "serve", "--engine", "torchtitan"), "--engine: a --workload train option"),
    (("--workload", "train", "--engine", "torchtitan", "--model", "qwen3-30b-a3b", "--global-batch", "64",
      "--seq-len", "4096", "--moe-dispatcher", "deepep"), "--moe-dispatcher deepep: only with --engine megatron"),
    (("--workload", "train", "--engine", "torchtitan", "--attention", "materialized", "--global-batch", "64",
      "--seq-len", "4096"), "--attention materialized"),
    (("--workload", "serve", "--emit", "torchtitan"), "--emit torchtitan: a training launcher"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, run_plan):
    full = list(args) if "--model" in args else [*args, "--model", "llama-3.1-8b"]
    result = run_plan(*full, "--cluster", "1x8xH100")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and not result.stdout, result.stderr


# ------------------------------------------------------------------ every emitted key exists at the tag

@pytest.mark.parametrize("args", [
    ("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256", "--seq-len", "8192",
     "--precision", "fp8", "--recompute", "selective"),
    ("--model", "llama-3.1-8b", "--cluster", "1x8xB200", "--global-batch", "256", "--seq-len", "8192",
     "--precision", "fp8", "--fp8-recipe", "mxfp8"),
    ("--model", "llama-3.1-70b", "--cluster", "8x8xH100", "--global-batch", "512", "--seq-len", "8192",
     "--layout", "tp=8,pp=4", "--schedule", "interleaved"),
    ("--model", "llama-3.1-405b", "--cluster", "128x8xH100", "--global-batch", "1024", "--seq-len", "8192",
     "--layout", "tp=8,pp=16", "--schedule", "1f1b"),
    ("--model", "llama-3.1-70b", "--cluster", "4x8xH100", "--global-batch", "16", "--seq-len", "65536",
     "--layout", "cp=4"),
    ("--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536", "--seq-len", "2048"),
])
def test_every_emitted_key_exists_at_the_tag(args, engine_check):
    out = plan_json(*args)
    assert out["layouts"], out["rejected"][:3]
    for layout in out["layouts"][:20]:
        (step,) = layout["command"]
        (file,) = step["files"]
        assert key_problems(file["text"]) == []
        assert engine_check(step["argv"], EngineVersions()) == []


# ------------------------------------------------------------------ goldens

@pytest.mark.parametrize("name, args", [
    ("llama-3.1-8b_1x8xH100_fsdp", ("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256",
                                    "--seq-len", "8192", "--layout", "tp=1,pp=1")),
    ("llama-3.1-70b_8x8xH100_tp8_fsdp", ("--model", "llama-3.1-70b", "--cluster", "8x8xH100", "--global-batch",
                                         "512", "--seq-len", "8192", "--layout", "tp=8,pp=1")),
    ("llama-3.1-70b_8x8xH100_pp4", ("--model", "llama-3.1-70b", "--cluster", "8x8xH100", "--global-batch", "512",
                                    "--seq-len", "8192", "--layout", "tp=8,pp=4", "--schedule", "1f1b")),
    ("llama-3.1-405b_128x8xH100_pp16_uneven", ("--model", "llama-3.1-405b", "--cluster", "128x8xH100",
                                               "--global-batch", "1024", "--seq-len", "8192", "--layout",
                                               "tp=8,pp=16,cp=1", "--schedule", "1f1b")),
    # MoE: expert parallelism (etp = 1) under FSDP, pipelined DeepSeek-V3 with uneven stages
    ("deepseek-v3_32x8xH100_ep8_pp16", ("--model", "deepseek-v3", "--cluster", "32x8xH100", "--global-batch",
                                        "1024", "--seq-len", "4096", "--layout", "tp=1,pp=16,ep=8")),
])
def test_torchtitan_golden(name, args):
    """The job config and the torchrun line of the recommended configuration."""
    (step,) = plan_json(*args)["recommended"]["command"]
    (file,) = step["files"]
    text = f"# {file['path']}\n{file['text']}\n# launch\n{step['shell']}\n"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        (GOLDEN / f"{name}.txt").write_text(text)
    assert text == (GOLDEN / f"{name}.txt").read_text()


# ------------------------------------------------------------------ property: plans torchtitan runs

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "qwen3-30b-a3b"]),
       nodes=st.sampled_from([1, 2, 4]),
       batch_per_gpu=st.sampled_from([1, 2, 4]),
       seq_len=st.sampled_from([2048, 4096, 8192]),
       precision=st.sampled_from(["bf16", "fp8"]))
def test_every_plan_is_one_torchtitan_runs(model_name, nodes, batch_per_gpu, seq_len, precision):
    model, cluster = resolve_model(model_name), resolve_cluster(f"{nodes}x8xH100")
    request = TrainRequest(global_batch=batch_per_gpu * cluster.num_gpus, seq_len=seq_len, precision=precision,
                           engine="torchtitan")
    plan = search(model, cluster, request)
    for estimate in plan.layouts:
        c = estimate.config
        d = torchtitan_degrees(c)
        product = 1
        for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "context_parallel_degree"):
            product *= d[key]
        assert product == cluster.num_gpus  # ep and etp borrow from these (ParallelDims._validate)
        if c.ep > 1:  # etp = 1: EP over all of TP and part of the data-parallel shard, under FSDP
            assert d["expert_parallel_degree"] == c.ep and d["expert_tensor_parallel_degree"] == 1
            assert (d["data_parallel_shard_degree"] * c.cp * c.tp) % c.ep == 0 and c.zero_stage != 0
        assert c.zero_stage in zero_stage_for(c.tp, c.pp, c.dp, c.cp)
        assert c.sequence_parallel == (c.tp > 1)
        assert seq_len % (2 * c.tp * c.cp) == 0
        (step,) = torchtitan_steps(model, cluster, c, request.global_batch, seq_len)
        assert key_problems(step.files[0].text) == []


# ------------------------------------------------------------------ per-op selective checkpointing ("op")

def test_per_op_checkpoint_keeps_these_bytes_by_hand():
    """Llama-3.1-8B (h 4,096, 32 heads and 8 KV heads of 128, f 14,336), per token per GPU, 2 B each.
    t = 1: the input 4,096, wq's output 4,096, wv's 1,024, the attention output 4,096, w1's
    14,336 and w2's 4,096: 2 * 31,744 = 63,488 B. t = 8 with SP: the input 512, wq 4 heads
    = 512, wv 1 KV head = 128, attention 512, w1 1,792, w2's partial sums 4,096 (every token,
    whole h, before the reduce-scatter), the two reduce-scatters' outputs 2 * 512:
    2 * 8,576 = 17,152 B. Against no recompute (activation_bytes_per_layer, one 4,096-token
    sequence) it keeps 43% at t = 1."""
    from planner.cost.activations import (
        activation_bytes_per_layer,
        op_checkpoint_saved_bytes_per_token,
    )
    model = resolve_model("llama-3.1-8b")
    assert op_checkpoint_saved_bytes_per_token(model, 1, False) == 63_488
    assert op_checkpoint_saved_bytes_per_token(model, 8, True) == 17_152
    # with flash attention's logsumexp: 4 B per query row per head, 32 heads
    assert activation_bytes_per_layer(model, 4096, 1, 1, False, "op", "flash") == 4096 * (63_488 + 4 * 32)
    none = activation_bytes_per_layer(model, 4096, 1, 1, False, "none", "flash")
    assert activation_bytes_per_layer(model, 4096, 1, 1, False, "op", "flash") / none == pytest.approx(0.43, abs=0.01)


def test_per_op_checkpoint_reruns_three_of_seven_matmuls_by_hand():
    """Every second matmul of wq, wk, wv, wo, w1, w3, w2: wk (4,096 x 1,024), wo (4,096 x
    4,096) and w3 (4,096 x 14,336), 79.69M of the block's 218.10M multiply-adds per token
    (36.5%); the rerun is those GEMMs and the forward's elementwise traffic, less than full
    recompute's whole forward by the other GEMMs and the attention core."""
    from planner.cost.flops import layer_gemms_forward
    from planner.cost.training_time import (
        flash_attention_seconds,
        gemm_seconds,
        layer_seconds,
        linear_gemm_seconds,
        op_recomputed_gemms,
    )
    from planner.train import train_rates
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    gemms = layer_gemms_forward(model, 1, 4096, 1)
    rerun = op_recomputed_gemms(model, gemms, 1)
    per_token = sum(g.m * g.n * g.k * g.count for g in rerun) / 4096
    assert per_token == 4096 * (1024 + 4096 + 14336) == 79_691_776
    whole = sum(g.m * g.n * g.k * g.count for g in gemms[:4]) / 4096
    assert whole == 218_103_808 and per_token / whole == pytest.approx(0.3654, abs=1e-4)
    rates = train_rates(model, cluster)
    full = layer_seconds(model, 4096, 1, 1, False, "full", rates, "flash")
    op = layer_seconds(model, 4096, 1, 1, False, "op", rates, "flash")
    assert (op.forward, op.backward) == (full.forward, full.backward)
    elementwise = full.recompute - linear_gemm_seconds(model, gemms, 1, 4096, 1, rates) - flash_attention_seconds(
        gemms, rates)[0]
    assert op.recompute == pytest.approx(sum(gemm_seconds(g, rates) for g in rerun) + elementwise, rel=1e-12)
    assert 0 < op.recompute < full.recompute


def test_per_op_checkpoint_reruns_the_all_gathers_only():
    """With TP (SP always on in torchtitan) the rerun forward all-gathers the inputs of wk and w3
    again and keeps the reduce-scatters' outputs: one all-reduce's time more than none, one less
    than full (forward 2, 3, 4 all-reduce equivalents; backward 3)."""
    from planner.cost.training_time import tp_seconds_per_layer
    from planner.layout import place
    from planner.train import train_rates
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    rates = train_rates(model, cluster)
    totals = {}
    for level in ("none", "op", "full"):
        c = config(tp=8, dp=1, zero_stage=0, sequence_parallel=True, recompute=level)
        tp = tp_seconds_per_layer(model, cluster, c, 4096, place(cluster, c.layout, True), rates)
        totals[level] = tp.total / tp.allreduce_seconds
    assert totals == pytest.approx({"none": 5, "op": 6, "full": 7})


def test_recompute_levels_per_engine_and_model():
    """torchtitan's selective level is its per-op checkpoint where that is priced (dense, bf16)."""
    from planner.train_search import recompute_levels
    dense, moe = resolve_model("llama-3.1-8b"), resolve_model("qwen3-30b-a3b")
    titan = TrainRequest(global_batch=64, seq_len=4096, engine="torchtitan")
    assert recompute_levels(dense, titan) == ["none", "op", "full"]
    assert recompute_levels(dense, TrainRequest(global_batch=64, seq_len=4096)) == ["none", "selective", "full"]
    assert recompute_levels(moe, titan) == ["none", "selective", "full"]
    assert recompute_levels(dense, TrainRequest(global_batch=64, seq_len=4096, engine="torchtitan",
                                                precision="fp8")) == ["none", "selective", "full"]


def test_selective_on_torchtitan_is_the_per_op_checkpoint_and_op_is_torchtitans():
    """--recompute selective with torchtitan plans (and emits) the per-op checkpoint; --recompute op
    with Megatron is one line and exit 2."""
    out = plan_json("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64", "--seq-len", "8192",
                    "--recompute", "selective", "--top", "3")
    assert {layout["recompute"] for layout in out["layouts"]} == {"op"}
    toml = out["recommended"]["command"][0]["files"][0]["text"]
    assert 'mode = "selective"' in toml and 'selective_ac_option = "op"' in toml
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--global-batch", "64", "--seq-len", "8192", "--recompute", "op"])
    assert result.exit_code == 2 and "--recompute op: megatron has no per-op selective" in result.output


def test_fsdp_70b_on_64_h100_runs_the_per_op_checkpoint():
    """Llama-3.1-70B at 8,192 tokens on 64 H100 with FSDP over 32 ranks and the sequence over two
    CP ranks (no TP, no PP): no recompute does not fit, the per-op checkpoint does and runs faster
    than full recompute; it is the recommendation of the whole search too."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("8x8xH100")
    request = TrainRequest(global_batch=256, seq_len=8192, engine="torchtitan",
                           layout=LayoutFilter(tp=1, pp=1, cp=2))
    plan = search(model, cluster, request)
    best = plan.layouts[0]
    assert (best.config.recompute, best.config.zero_stage, best.config.dp) == ("op", 3, 32)
    assert not [e for e in plan.layouts if e.config.recompute == "none"]
    assert search(model, cluster, replace(request, layout=LayoutFilter())).layouts[0].config == best.config
    full = [e for e in plan.layouts if e.config.recompute == "full"]
    assert full and max(e.tokens_per_second for e in full) < best.tokens_per_second


def test_selective_on_torchtitan_says_it_runs_per_op_checkpointing():
    """--recompute selective on torchtitan (dense bf16) is planned and emitted as its per-op
    selective checkpointing, shown as recompute op: the plan's notes say what that level
    reruns, so "op" in the table is not a surprise; Megatron's selective says nothing."""
    from planner.train import training_caveats

    model = resolve_model("llama-3.1-8b")
    titan = TrainRequest(global_batch=64, seq_len=8192, engine="torchtitan", recompute="selective")
    assert any(c.startswith("recompute op is torchtitan's selective") for c in training_caveats(model, titan))
    megatron = replace(titan, engine="megatron")
    assert not any(c.startswith("recompute op") for c in training_caveats(model, megatron))


def test_zero_2_on_torchtitan_is_a_one_line_error():
    """torchtitan has no ZeRO-2 on any layout: the error says so first (it listed each
    layout's own refusal, the cause buried under 19 of them)."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--global-batch", "64", "--seq-len", "8192", "--engine", "torchtitan",
                                      "--zero", "2"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("--zero 2: torchtitan v0.2.2 has no ZeRO-2"), result.stderr


@pytest.mark.parametrize(("given", "expected"), [
    ("llama-3.1-70b-fp8", ("llama3", "70B")), ("llama-3.1-8b-fp8", ("llama3", "8B")),
    ("qwen3-235b-a22b-fp8", ("qwen3", "235B-A22B")),
    ("tests/fixtures/hf_configs/meta-llama--Meta-Llama-3.1-70B/config.json", ("llama3", "70B")),
    ("tests/fixtures/hf_configs/Qwen--Qwen3-32B/config.json", ("qwen3", "32B")),
    ("tests/fixtures/hf_configs/openai--gpt-oss-120b/config.json", ("gpt_oss", "120b")),
    ("tests/fixtures/hf_configs/moonshotai--Kimi-K2-Instruct/config.json", None),
])
def test_torchtitan_knows_a_model_by_its_architecture_not_its_name(given, expected):
    """A quantized checkpoint's spec or an HF config.json of a model torchtitan implements is
    that model (same layers, widths, heads, experts, top-k, vocabulary): its name used to be
    the only key, so gpt-oss-120b's config.json was pipelined and context-parallel, which
    torchtitan refuses for gpt_oss. Kimi K2 (384 experts) is none of them."""
    from planner.train_engines import torchtitan_model

    root = Path(__file__).parents[2]
    spec = resolve_model(str(root / given) if given.startswith("tests/") else given)
    assert torchtitan_model(spec) == expected


def test_an_hf_config_plans_as_its_shipped_twin_under_torchtitan():
    """gpt-oss-120b's config.json and the shipped gpt-oss-120b get the same recommended layout
    (no PP, no CP: gpt_oss has no pipelining_fn and runs flex attention) and the same [model]."""
    config = Path(__file__).parents[2] / "tests" / "fixtures" / "hf_configs" / "openai--gpt-oss-120b"
    plans = []
    for model in (str(config), "gpt-oss-120b"):
        result = CliRunner().invoke(app, ["--workload", "train", "--model", model, "--cluster", "8x8xH100",
                                          "--global-batch", "64", "--seq-len", "32768", "--engine", "torchtitan",
                                          "--json", "--top", "1"])
        assert result.exit_code == 0, result.output
        best = json.loads(result.stdout)["layouts"][0]
        plans.append((best["tp"], best["cp"], best["pp"], best["dp"], best["ep"]))
        assert best["pp"] == 1 and best["cp"] == 1
    assert plans[0] == plans[1]


@pytest.mark.parametrize(("model_name", "extra"), [("qwen3-30b-a3b", []), ("llama-3.1-8b", ["--precision", "fp8"])])
def test_selective_priced_as_megatrons_says_so(model_name, extra):
    """--engine torchtitan --recompute selective for an MoE model (or fp8): the job config asks
    torchtitan for its per-op checkpoint (selective_ac_option "op"), which the plan prices only
    for bf16 dense blocks; here it priced Megatron's level (with flash attention what no
    recompute keeps) and said nothing. The note says so, in the text and the JSON; a bf16 dense
    model's selective, priced as torchtitan runs it, gets the per-op note instead."""
    args = ["--workload", "train", "--model", model_name, "--cluster", "1x8xH100", "--global-batch", "64",
            "--seq-len", "4096", "--engine", "torchtitan", "--recompute", "selective", *extra]
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "the plan cannot price here" in " ".join(text.output.split())
    data = json.loads(CliRunner().invoke(app, [*args, "--json", "--emit", "torchtitan"]).output)
    assert any(note.startswith("recompute selective: the job config asks torchtitan") for note in data["notes"])
    dense = json.loads(CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster",
                                                "1x8xH100", "--global-batch", "64", "--seq-len", "4096", "--engine",
                                                "torchtitan", "--recompute", "selective", "--json"]).output)
    assert not any(note.startswith("recompute selective:") for note in dense["notes"])
    assert any(note.startswith("recompute op is torchtitan's") for note in dense["notes"])


def test_torchtitan_plans_name_their_own_cp_exchange_and_no_megatron_flag():
    """torchtitan gathers the other chunks' KV (CP_KV_ROTATION "allgather"), priced as an
    all-gather: the summary called it a "CP ring" of "KV sends", Megatron's words. And the
    "--tp-comm-overlap off" line, a Megatron flag, was printed for torchtitan plans."""
    args = ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "4x8xH100", "--global-batch", "64",
            "--seq-len", "131072"]
    titan = " ".join(CliRunner().invoke(app, [*args, "--engine", "torchtitan", "--layout", "tp=2,cp=8"]).output.split())
    megatron = " ".join(CliRunner().invoke(app, [*args, "--layout", "tp=2,cp=8"]).output.split())
    assert "CP all-gather (exposed)" in titan and "all-gather on" in titan and "KV gathers per layer" in titan
    assert "CP ring" not in titan and "--tp-comm-overlap" not in titan
    assert "CP ring (exposed)" in megatron and "KV sends per layer" in megatron
    moe = ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--global-batch", "64",
           "--seq-len", "4096", "--layout", "tp=2"]
    assert "(--tp-comm-overlap) off" in CliRunner().invoke(app, moe).output
    assert "--tp-comm-overlap" not in CliRunner().invoke(app, [*moe, "--engine", "torchtitan"]).output


def test_torchtitans_ddp_all_reduces_after_every_micro_batch():
    """torchtitan v0.2.2's train_step runs each micro-batch's backward with gradient sync on (no
    no_sync), so its DDP (ZeRO-0) all-reduces m times a step, each under that micro-batch's
    backward; Megatron accumulates and all-reduces once. Llama-3.1-8B on 4x8 B200, 256 x 4,096,
    dp 32, micro-batch 1: m = 256 / 32 = 8; the exposed DP time is 8 times Megatron's on the same
    configuration, and explain counts 8 (a CLI read: it had priced one)."""
    from planner.layout import TrainConfig
    from planner.requests import TrainRequest
    from planner.train import estimate, gradient_reductions_per_step, train_rates

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("4x8xB200")
    config = TrainConfig(tp=1, pp=1, dp=32, micro_batch_size=1, schedule="1f1b", virtual_stages=1,
                         recompute="none", sequence_parallel=False, zero_stage=0)
    assert gradient_reductions_per_step("torchtitan", config, 8) == 8
    assert gradient_reductions_per_step("megatron", config, 8) == 1
    assert gradient_reductions_per_step("megatron", config.with_(zero_stage=3), 8) == 8
    rates = train_rates(model, cluster)
    titan = estimate(model, cluster, config, TrainRequest(global_batch=256, seq_len=4096, engine="torchtitan"), rates)
    megatron = estimate(model, cluster, config, TrainRequest(global_batch=256, seq_len=4096), rates)
    assert titan.dp_reductions_per_step == 8 and megatron.dp_reductions_per_step == 1
    exposed = megatron.time_breakdown_seconds.dp_comm_exposed
    assert exposed > 0
    assert titan.time_breakdown_seconds.dp_comm_exposed == pytest.approx(8 * exposed, rel=1e-9)


def test_fsdp2_gathers_the_weights_twice_a_micro_batch_even_with_full_recompute():
    """torchtitan applies activation checkpointing inside each fully_shard unit, so the backward's
    unshard serves the rerun forward: 2 gathers a micro-batch; Megatron-FSDP's full recompute
    gathers a third time. Same ZeRO-3 configuration, full recompute: the exposed DP time differs
    by one gather per micro-batch wherever the micro-batch cannot hide them all."""
    from planner.cost.training_time import zero3_gathers_per_micro_batch
    from planner.layout import TrainConfig

    full = TrainConfig(tp=1, pp=1, dp=16, micro_batch_size=1, schedule="1f1b", virtual_stages=1,
                       recompute="full", sequence_parallel=False, zero_stage=3)
    assert zero3_gathers_per_micro_batch("torchtitan", full) == 2
    assert zero3_gathers_per_micro_batch("megatron", full) == 3
    assert zero3_gathers_per_micro_batch("megatron", full.with_(recompute="none")) == 2
    explained = CliRunner().invoke(app, ["explain", "--workload", "train", "--model", "qwen3-30b-a3b", "--cluster",
                                         "2x8xH100", "--global-batch", "256", "--seq-len", "4096", "--engine",
                                         "torchtitan", "--micro-batch", "4"])
    text = " ".join(explained.output.split())
    assert explained.exit_code == 0 and "micro-batches per step 4" in text
    gather_row = next(line for line in explained.output.splitlines() if "16-bit weights" in line)
    assert " 8 x " in gather_row  # 4 micro-batches x 2 (it had counted 12)


def test_torchao_casts_by_hand():
    """torchao under torch.compile (torchtitan's fp8): an activation cast 3 B/element (the amax
    fused into its producer, then read 2 + write 1), an output gradient 6 (row- and column-wise),
    a weight 5 (its amax read first); mxfp8 3.03125 each, 6.0625 the gradient's. Llama-3.1-8B at
    t = 1, per token: forward 3 * (2*4096 + 4096 + 14336) = 79,872 B; backward 6 * (6144 + 4096 +
    28672 + 4096) + 79,872 = 337,920 B; the layer's 218,103,808 linear weights 5 B each way, every
    micro-batch (torchao keeps no fp8 copy)."""
    from planner.cost.params import layer_linear_weights_per_gpu
    from planner.cost.training_time import (
        torchao_fp8_cast_bytes_per_element,
        torchao_fp8_cast_bytes_per_layer,
    )

    assert torchao_fp8_cast_bytes_per_element("tensorwise") == (3, 6, 5)
    assert torchao_fp8_cast_bytes_per_element("mxfp8") == (3.03125, 6.0625, 3.03125)
    model = resolve_model("llama-3.1-8b")
    weights = layer_linear_weights_per_gpu(model, 1)
    assert weights == 218_103_808
    forward, backward = torchao_fp8_cast_bytes_per_layer(model, 1, 1, 1, "tensorwise")
    assert (forward - 5 * weights, backward - 5 * weights) == (79_872, 337_920)
    # twice the tokens: the token terms double, the weights' do not
    forward2, _ = torchao_fp8_cast_bytes_per_layer(model, 2, 1, 1, "tensorwise")
    assert forward2 - forward == 79_872


def test_torchtitan_fp8_prices_torchaos_casts():
    """The same fp8 configuration under torchtitan and Megatron differs in its casts only (the
    GEMMs are the same fp8 GEMMs): the block's forward differs by torchao's forward casts less
    Transformer Engine's over the HBM rate."""
    from planner.catalog import resolve_cluster
    from planner.cost.training_time import (
        config_layer_seconds,
        fp8_cast_bytes_per_layer,
        torchao_fp8_cast_bytes_per_layer,
    )
    from planner.train import train_rates

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    rates = train_rates(model, cluster, "auto")
    c = config(precision="fp8", fp8_recipe="tensorwise")
    titan, megatron = (config_layer_seconds(model, c.with_(engine=e), 8192, rates) for e in ("torchtitan", "megatron"))
    hbm = rates.elementwise_bytes_per_s
    te, ao = fp8_cast_bytes_per_layer(model, 8192, 1, 1, "tensorwise"), torchao_fp8_cast_bytes_per_layer(
        model, 8192, 1, 1, "tensorwise")
    assert titan.forward - megatron.forward == pytest.approx((ao[0] - te[0]) / hbm)
    assert titan.backward - megatron.backward == pytest.approx((ao[1] - te[1]) / hbm)
    assert titan.backward > megatron.backward  # the backward's casts of the inputs and weights again
