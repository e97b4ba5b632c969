"""Training with multi-token prediction (Megatron's --mtp-num-layers; DeepSeek-V3 sec. 2.2): the
MTP modules' parameters, FLOPs, time and memory on the last stage, the stage split they shift,
the command, and the flag's rules. Hand-worked numbers in each docstring.

DeepSeek-V3: h = 7168, V = 129,280, 256 routed experts of 3 * 7168 * 2048 = 44,040,192
parameters, one shared expert of the same size, MLA attention 187,105,280 parameters of which
15,138,816 (the two down-projections) are whole on every TP rank; one MTP module.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import activations as act
from planner.cost import efficiency
from planner.cost.flops import logits_gemm, model_flops_per_sequence
from planner.cost.params import mtp_module_params_per_gpu
from planner.cost.stage_split import megatron_layout
from planner.cost.training_memory import stage_params_per_gpu
from planner.cost.training_time import stage_seconds
from planner.layout import TrainConfig
from planner.memo import Memo
from planner.requests import LayoutFilter, TrainRequest
from planner.specs import SpecError
from planner.train import _layer_terms, estimate, train_rates, trained_model

DSV3 = resolve_model("deepseek-v3")
NO_MTP = DSV3.model_copy(update={"num_mtp_layers": 0})
LLAMA_8B = resolve_model("llama-3.1-8b")


def test_one_mtp_module_per_gpu_at_tp2_ep8():
    """t = 2, ep = 8 (32 of the 256 experts a GPU): attention (187,105,280 - 15,138,816)/2 +
    15,138,816 = 101,122,048; experts 32 * 44,040,192 = 1,409,286,144; the shared expert
    44,040,192/2 = 22,020,096; the router 7168 * 256 = 1,835,008, whole; eh_proj 2 * 7168^2 / 2 =
    51,380,224; five RMSNorms 5 * 7168 = 35,840: 1,585,679,360, of which 1,409,286,144 routed."""
    total, routed = mtp_module_params_per_gpu(DSV3, 2, 8)
    assert routed == 1_409_286_144
    assert total == 101_122_048 + 1_409_286_144 + 22_020_096 + 1_835_008 + 51_380_224 + 35_840 == 1_585_679_360


def test_the_last_stage_holds_the_module_and_a_copy_of_the_embedding():
    """pp = 4, t = 2, ep = 8: the last stage gains the module (1,585,679,360) and, embeddings
    untied, its own copy of the embedding the module reads, 129,280 * 7168 / 2 = 463,339,520:
    2,049,018,880 more; its routed experts 1,409,286,144 more. Other stages are unchanged. At
    pp = 1 the embedding is already there: only the module."""
    with_mtp, without = stage_params_per_gpu(DSV3, 2, 4, ep=8), stage_params_per_gpu(NO_MTP, 2, 4, ep=8)
    assert with_mtp.last_stage - without.last_stage == pytest.approx(1_585_679_360 + 463_339_520)
    assert (with_mtp.routed_experts.last_stage - without.routed_experts.last_stage
            == pytest.approx(1_409_286_144))
    assert (with_mtp.first_stage, with_mtp.middle_stage) == (without.first_stage, without.middle_stage)
    one = stage_params_per_gpu(DSV3, 2, 1, ep=8).first_stage - stage_params_per_gpu(NO_MTP, 2, 1, ep=8).first_stage
    assert one == pytest.approx(1_585_679_360)


def test_model_flops_count_the_module_as_megatron_does():
    """Llama-3.1-8B trained with one MTP module, s = 4096: the module adds a block (a decoder
    layer's FLOPs: (F_without / 3 - logits) / 32), eh_proj 2 * 4096 * 2 * 4096 * 4096 =
    274,877,906,944 and another output layer 2 * 4096 * 4096 * 128,256 = 4,303,557,230,592 per
    sequence forward, x3 with the backward (Megatron-LM training.py
    num_floating_point_operations, core_v0.14.0)."""
    one = LLAMA_8B.model_copy(update={"num_mtp_layers": 1})
    s = 4096
    logits = logits_gemm(LLAMA_8B, 1, s, 1).flops
    assert logits == 2 * 4096 * 4096 * 128_256 == 4_303_557_230_592
    without = model_flops_per_sequence(LLAMA_8B, s, causal=True)
    layer = (without / 3 - logits) / 32
    eh_proj = 2 * 4096 * 2 * 4096 * 4096
    assert eh_proj == 274_877_906_944
    assert model_flops_per_sequence(one, s, causal=True) - without == pytest.approx(3 * (layer + eh_proj + logits))


def test_the_module_keeps_its_logits_and_inputs():
    """DeepSeek-V3, s = 4096, b = 1, t = 4 with SP: logits 6 * 4096 * ceil(129,280/4) =
    6 * 4096 * 32,320 = 794,296,320 bytes, and the enorm, hnorm and eh_proj inputs 8 * 4096 *
    7168 / 4 = 58,720,256: 853,016,576 (0 without MTP)."""
    assert act.mtp_extra_bytes(DSV3, 4096, 1, 4, True) == 794_296_320 + 58_720_256 == 853_016_576
    assert act.mtp_extra_bytes(NO_MTP, 4096, 1, 4, True) == 0


def test_the_last_stage_runs_a_block_and_the_head_more():
    """DeepSeek-V3 at t = 8, pp = 4, ep = 64 on 32 H100 nodes: the last stage's extra time per
    micro-batch grows by one block (the per-layer time less its gradient accumulation), the
    module's head (eh_proj and another output-layer pass, more than the main output layer's
    own) and the accumulation of its main gradients (MAIN_GRAD_ACCESSES_PER_MICRO_BATCH fp32
    accesses of each of its parameters and the embedding copy at the elementwise HBM rate); the
    other stages' times do not move."""
    cluster = resolve_cluster("32x8xH100")
    config = TrainConfig(8, 4, 8, 1, "1f1b", 1, "none", True, 1, ep=64)
    rates = train_rates(DSV3, cluster)
    _, terms = _layer_terms(DSV3, cluster, config, 4096, rates, Memo())
    _, bare = _layer_terms(NO_MTP, cluster, config, 4096, rates, Memo())
    assert bare.mtp_head_seconds == 0 and terms.mtp_head_seconds > terms.logits_seconds > 0
    with_mtp, without = stage_seconds(DSV3, config, terms, rates), stage_seconds(NO_MTP, config, bare, rates)
    assert with_mtp.seconds_per_layer == without.seconds_per_layer
    assert with_mtp.first_extra_seconds == without.first_extra_seconds
    block = (terms.layer.total + terms.tp.exposed + terms.ep.comm_seconds_per_layer
             + terms.ep.compute_seconds_per_layer + terms.cp.exposed + terms.host_seconds_per_layer)
    added = with_mtp.last_extra_seconds - without.last_extra_seconds
    params = stage_params_per_gpu(DSV3, 8, 4, ep=64).last_stage - stage_params_per_gpu(NO_MTP, 8, 4, ep=64).last_stage
    accumulate = params * efficiency.MAIN_GRAD_ACCESSES_PER_MICRO_BATCH * 4 / rates.elementwise_bytes_per_s
    assert added == pytest.approx(block + terms.mtp_head_seconds + accumulate)


def test_deepseek_v3_at_pp16_splits_as_nvidias_recipe():
    """61 layers over 16 stages, 1F1B: with the MTP module the last stage holds one decoder
    layer beside it and the loss, 4 | 4 x14 | 1, the layout of NVIDIA's recipe
    (Megatron-Bridge recipes/deepseek/deepseek_v3.py v0.4.0, (16, 1): decoder + mtp + loss);
    without it the planner's split is 2 | 4 x14 | 3. The command names the module with
    --mtp-num-layers."""
    def plan(mtp):
        result = CliRunner().invoke(app, ["--workload", "train", "--model", "deepseek-v3", "--cluster", "32x8xH100",
                                          "--global-batch", "1024", "--seq-len", "4096", "--layout", "tp=2,pp=16,ep=8",
                                          "--schedule", "1f1b", "--mtp-layers", str(mtp), "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    with_mtp, without = plan(1), plan(0)
    assert with_mtp["mtp_layers"] == 1 and without["mtp_layers"] == 0
    # the summary counts what is trained: one MTP module (11.61B), none (found by a CLI sweep)
    assert with_mtp["model_summary"]["mtp_params"] == pytest.approx(11.61e9, rel=1e-3)
    assert without["model_summary"]["mtp_params"] == 0
    assert with_mtp["recommended"]["num_layers_per_stage"] == [4] * 15 + [1]
    assert without["recommended"]["num_layers_per_stage"] == [2] + [4] * 14 + [3]
    argv = with_mtp["recommended"]["command"][0]["argv"]
    assert argv[argv.index("--mtp-num-layers") + 1] == "1"
    assert "--mtp-num-layers" not in without["recommended"]["command"][0]["argv"]
    assert any("multi-token-prediction" in note for note in without["notes"])
    assert not any("multi-token-prediction" in note for note in with_mtp["notes"])


def test_the_layout_string_puts_the_module_before_the_loss():
    """Megatron's layout (pipeline_parallel_layer_layout.py core_v0.14.0): "m" per MTP module
    after every decoder layer, in the last stage's last chunk, before "L"."""
    assert megatron_layout((3, 3), 2) == "Ett|tt|t|tL"
    assert megatron_layout((3, 3), 2, 1) == "Ett|tt|t|tmL"
    assert megatron_layout((4, 4), 1, 2) == "Etttt|ttttmmL"


def test_the_default_is_the_spec_s_with_megatron_and_none_with_torchtitan():
    megatron = TrainRequest(global_batch=64, seq_len=4096)
    assert trained_model(DSV3, megatron).num_mtp_layers == 1
    assert trained_model(DSV3, TrainRequest(global_batch=64, seq_len=4096, engine="torchtitan")).num_mtp_layers == 0
    assert trained_model(LLAMA_8B, TrainRequest(global_batch=64, seq_len=4096, mtp_layers=2)).num_mtp_layers == 2
    assert trained_model(DSV3, megatron) is DSV3


@pytest.mark.parametrize("args, message", [
    (["--model", "deepseek-v3", "--engine", "torchtitan", "--mtp-layers", "1"],
     "--mtp-layers 1: only with --engine megatron; torchtitan builds no multi-token-prediction module"),
    (["--model", "gpt3-175b", "--mtp-layers", "1", "--seq-len", "2048"],
     "--mtp-layers 1: Megatron-LM builds multi-token prediction only with rope or no position embeddings; "
     "gpt3-175b has learned positions"),
    (["--model", "llama-3.1-8b", "--mtp-layers", "-1"], "--mtp-layers: must be between 0 and 16 (got -1)"),
    (["--model", "llama-3.1-8b", "--mtp-layers", "17"], "--mtp-layers: must be between 0 and 16 (got 17)"),
])
def test_bad_mtp_requests_are_one_line_errors(args, message):
    result = CliRunner().invoke(app, ["--workload", "train", "--cluster", "4x8xH100", "--global-batch", "256",
                                      "--seq-len", "4096", *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == message


def test_serving_refuses_the_training_flag():
    result = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--mtp-layers", "1"])
    assert result.exit_code == 2 and "--mtp-layers" in result.output and len(result.output.strip().splitlines()) == 1


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), b=st.sampled_from([1, 2]),
       mtp=st.integers(1, 3), recompute=st.sampled_from(["none", "selective", "full"]))
def test_mtp_modules_never_speed_a_step_or_shrink_the_last_stage(tp, pp, b, mtp, recompute):
    """Property: on the same stage split, training MTP modules adds work and memory to the last
    stage only: the step is never faster, the last stage never holds less, the first stage is
    unchanged. (The split itself may move: with MTP the estimate weighs uneven splits even
    where p divides L, and the MTP plan runs the one it picked.)"""
    cluster = resolve_cluster("4x8xH100")
    dp = 32 // (tp * pp)
    config = TrainConfig(tp, pp, dp, b, "1f1b", 1, recompute, tp > 1, 1)
    trained = estimate(LLAMA_8B, cluster, config, TrainRequest(global_batch=dp * b * 8, seq_len=4096,
                                                               mtp_layers=mtp))
    if not hasattr(trained, "step_time_seconds"):
        assert "out of memory" in trained.reasons[0] and (pp == 1 or "MTP module" in trained.reasons[0]
                                                          or "stage 0" in trained.reasons[0])
        return
    split = config.with_(first_last_layers=trained.config.first_last_layers,
                         account_for_embedding_and_loss=trained.config.account_for_embedding_and_loss)
    bare = estimate(LLAMA_8B, cluster, split, TrainRequest(global_batch=dp * b * 8, seq_len=4096, mtp_layers=0))
    assert bare.num_layers_per_stage == trained.num_layers_per_stage
    assert trained.step_time_seconds > bare.step_time_seconds
    assert trained.stage_memories[-1].total_bytes > bare.stage_memories[-1].total_bytes
    if pp > 1:
        assert trained.stage_memories[0].total_bytes == bare.stage_memories[0].total_bytes


def test_with_mtp_the_split_moves_layers_off_the_last_stage_where_p_divides_l():
    """Llama-3.1-70B (80 layers) at tp 4, pp 4, one MTP module: the even 20 x4 split leaves the
    module and a second output-layer pass on the last stage; the estimate weighs Megatron's
    first/last splits too and gives the last stage fewer layers (first/last flags emitted);
    without MTP the stages stay even (no flags)."""
    cluster = resolve_cluster("4x8xH100")
    config = TrainConfig(4, 4, 2, 1, "1f1b", 1, "none", True, 1)
    with_mtp = estimate(resolve_model("llama-3.1-70b"), cluster, config,
                        TrainRequest(global_batch=512, seq_len=4096, mtp_layers=1))
    without = estimate(resolve_model("llama-3.1-70b"), cluster, config, TrainRequest(global_batch=512, seq_len=4096))
    assert without.num_layers_per_stage == (20, 20, 20, 20) and without.config.first_last_layers is None
    assert with_mtp.num_layers_per_stage[-1] < 20 and sum(with_mtp.num_layers_per_stage) == 80
    assert with_mtp.config.first_last_layers == (with_mtp.num_layers_per_stage[0], with_mtp.num_layers_per_stage[-1])


def test_search_and_estimate_agree_on_the_model_trained():
    """search() and estimate() take the spec and price the MTP modules the request trains."""
    from planner.train_search import search

    cluster = resolve_cluster("4x8xH100")
    request = TrainRequest(global_batch=256, seq_len=4096, layout=LayoutFilter(tp=4, pp=4), mtp_layers=1)
    plan = search(LLAMA_8B, cluster, request)
    assert plan.model.num_mtp_layers == 1
    best = plan.layouts[0]
    again = estimate(LLAMA_8B, cluster, best.config, plan.request)
    assert again.step_time_seconds == pytest.approx(best.step_time_seconds)


def test_a_learned_position_model_cannot_be_trained_with_mtp():
    with pytest.raises(SpecError, match="learned positions"):
        trained_model(resolve_model("gpt3-175b"), TrainRequest(global_batch=64, seq_len=2048, mtp_layers=1))


def test_where_the_mtp_module_is_what_does_not_fit_the_plan_says_so():
    """DeepSeek-V3 at tp 1, pp 4, ep 64 on 32 H100 nodes: with its MTP module no configuration
    fits (the split that balances the module puts more layers on the middle stages), without it
    one does; 'what would fit' names --mtp-layers 0 before more GPUs (after what these GPUs run
    with the --layout searched), and bf16 optimizer states."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "deepseek-v3", "--cluster", "32x8xH100",
                                      "--global-batch", "1024", "--seq-len", "4096", "--layout", "tp=1,pp=4,ep=64",
                                      "--json"])
    assert result.exit_code == 1, result.output
    suggestions = json.loads(result.output)["suggestions"]
    assert suggestions[0].endswith("with --layout tp=1,pp=4,ep=64 searched instead")
    assert suggestions[1].startswith("these GPUs run tp=1 cp=1 pp=4 dp=64 ep=64 without the MTP module "
                                     "(--mtp-layers 0)")
    # with bf16 optimizer states the layout fits too, the MTP module kept
    assert suggestions[2].startswith("these GPUs run tp=1 cp=1 pp=4 dp=64 ep=64, recompute full, ZeRO-1, "
                                     "micro-batch 1 with bf16 optimizer states (--optimizer-states bf16")
    assert len(suggestions) == 4


def test_a_learned_position_spec_with_mtp_trains_none_by_default():
    """A spec declaring MTP layers with learned positions: Megatron builds none (no error unless
    --mtp-layers asks), and the notes say why."""
    spec = resolve_model("gpt3-175b").model_copy(update={"num_mtp_layers": 2})
    request = TrainRequest(global_batch=64, seq_len=2048)
    assert trained_model(spec, request).num_mtp_layers == 0
    from planner.train import training_caveats

    assert any("only with rope or no position embeddings" in note for note in training_caveats(spec, request))


def test_the_overlap_refusal_names_the_mtp_limit_first():
    """Megatron's combined 1F1B takes at most one MTP layer: with two, that is the reason given,
    whatever else the configuration does (it blocks every layout)."""
    from planner.train import moe_comm_overlap_refusal

    two = DSV3.model_copy(update={"num_mtp_layers": 2})
    config = TrainConfig(8, 4, 8, 1, "1f1b", 1, "full", True, 1, ep=64)
    assert moe_comm_overlap_refusal(two, config) == "Megatron takes at most one MTP layer with it (2 trained)"
    assert moe_comm_overlap_refusal(DSV3, config) == "Megatron refuses it with full recompute"
