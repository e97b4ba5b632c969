"""The model that was planned is the model Megatron-LM builds: the parameter count of the GPT
model the emitted pretrain_gpt.py flags describe equals the plan's count."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_model
from planner.cli import app
from planner.cost.params import param_counts


def flag(args: list[str], name: str, default: object = None) -> object:
    return args[args.index(name) + 1] if name in args else default


def megatron_param_count(args: list[str], tokenizer_vocab_size: int) -> int:
    """Parameters of the GPTModel that Megatron-LM (core_v0.19.0) builds for these arguments.

    Read from megatron/core/models/gpt/gpt_model.py (embedding, decoder, final norm, output
    layer), megatron/core/models/common/embeddings/language_model_embedding.py (word and, with
    learned_absolute, position embeddings), megatron/core/transformer/transformer_layer.py (two
    norms per layer), attention.py SelfAttention (linear_qkv of (a + 2g) * d rows, with a bias when
    add_bias_linear or add_qkv_bias; linear_proj of h rows, bias with add_bias_linear),
    mlp.py MLP (linear_fc1 of f rows, 2f with gated linear units; linear_fc2), moe/moe_layer.py
    with moe/router.py TopKRouter (an E x h weight, a bias with add_bias_linear) and one MLP of
    moe_ffn_hidden_size per expert, moe/shared_experts.py (an MLP of the shared size);
    RMSNorm has a weight, LayerNorm a weight and a bias. The vocabulary is the tokenizer's, padded
    to a multiple of make_vocab_size_divisible_by * TP (megatron/training/vocab_utils.py).
    """
    h, num_layers = int(flag(args, "--hidden-size")), int(flag(args, "--num-layers"))
    heads = int(flag(args, "--num-attention-heads"))
    groups = int(flag(args, "--num-query-groups", heads))
    head_dim = int(flag(args, "--kv-channels", h // heads))
    bias = "--disable-bias-linear" not in args
    qkv_bias = bias or "--add-qkv-bias" in args
    norm = h * (1 if flag(args, "--normalization", "LayerNorm") == "RMSNorm" else 2)
    multiple = int(flag(args, "--make-vocab-size-divisible-by", 128)) * int(flag(args, "--tensor-model-parallel-size", 1))
    vocab = -(-tokenizer_vocab_size // multiple) * multiple

    def mlp(ffn: int) -> int:
        up = 2 * ffn if "--swiglu" in args else ffn
        return up * h + ffn * h + ((up + h) if bias else 0)

    if "--multi-latent-attention" in args:
        # multi_latent_attention.py MLASelfAttention: q down (h x r_q), q_layernorm (RMSNorm r_q),
        # q up (r_q x a*(d_qk + d_rope)); kv down (h x (r_kv + d_rope)), kv_layernorm (r_kv),
        # kv up (r_kv x a*(d_qk + d_v)); linear_proj (a*d_v x h)
        r_q, r_kv = int(flag(args, "--q-lora-rank", 0)), int(flag(args, "--kv-lora-rank"))
        d_qk, d_rope = int(flag(args, "--qk-head-dim")), int(flag(args, "--qk-pos-emb-head-dim"))
        d_v = int(flag(args, "--v-head-dim"))
        query = (h * r_q + r_q + r_q * heads * (d_qk + d_rope)) if r_q else h * heads * (d_qk + d_rope)
        attention = query + h * (r_kv + d_rope) + r_kv + r_kv * heads * (d_qk + d_v) + heads * d_v * h
    else:
        attention = (heads + 2 * groups) * head_dim * h + (heads + 2 * groups) * head_dim * qkv_bias
        attention += h * heads * head_dim + h * bias
    dense = mlp(int(flag(args, "--ffn-hidden-size")))
    num_moe_layers = 0
    if "--num-experts" in args:
        experts = int(flag(args, "--num-experts"))
        ffn = mlp(int(flag(args, "--moe-ffn-hidden-size", flag(args, "--ffn-hidden-size"))))
        shared = int(flag(args, "--moe-shared-expert-intermediate-size", 0))
        routed = experts * h + experts * bias + experts * ffn + (mlp(shared) if shared else 0)
        pattern = flag(args, "--moe-layer-freq")  # "([0]*K+[1]*M)": K dense layers, then M MoE layers
        num_moe_layers = num_layers
        if pattern is not None:
            counts = {int(kind): int(n) for kind, n in re.findall(r"\[(\d)\]\*(\d+)", pattern)}
            assert sum(counts.values()) == num_layers, pattern
            num_moe_layers = counts.get(1, 0)
    else:
        routed = 0
    feed_forward = num_moe_layers * routed + (num_layers - num_moe_layers) * dense
    embedding = vocab * h
    if flag(args, "--position-embedding-type", "learned_absolute") == "learned_absolute":
        embedding += int(flag(args, "--max-position-embeddings")) * h
    output = vocab * h if "--untie-embeddings-and-output-weights" in args else 0
    return embedding + num_layers * (2 * norm + attention) + feed_forward + norm + output


def emitted_args(model_name: str, cluster: str, *extra: str) -> list[str]:
    result = CliRunner().invoke(app, ["--workload", "train", "--json", "--model", model_name, "--cluster", cluster,
                                      "--global-batch", "512", "--seq-len", "4096", *extra])
    assert result.exit_code == 0, result.output
    argv = json.loads(result.output)["recommended"]["command"][0]["argv"]
    return argv[argv.index("pretrain_gpt.py") + 1:]


@pytest.mark.parametrize("model_name, cluster, published", [
    ("mixtral-8x7b", "4x8xH100", 46.7e9),
    ("qwen2.5-72b", "4x8xH100", 72.7e9),
    ("qwen3-30b-a3b", "4x8xH100", 30.5e9),
])
@pytest.mark.parametrize("layout", ["", "tp=8", "tp=2"])
def test_megatron_builds_the_planned_parameter_count(model_name, cluster, published, layout):
    """Mixtral 8x7B (46.7B: 8 experts, top-2, RoPE base 1e6) and Qwen2.5-72B (72.7B: q/k/v biases);
    for the recommended layout and fixed TP degrees (the vocabulary padding depends on TP)."""
    model = resolve_model(model_name)
    args = emitted_args(model_name, cluster, *(("--layout", layout) if layout else ()))
    planned = param_counts(model).total
    assert megatron_param_count(args, model.vocab_size) == planned
    assert planned == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("layout", ["", "tp=8"])
def test_megatron_builds_deepseek_v3_as_planned(layout):
    """DeepSeek-V3: MLA (q/kv latent ranks 1536/512, head dims 128 + 64 RoPE, values 128), 3 dense
    layers then 58 MoE layers of 256 experts (top 8) and one shared expert: Megatron's count from
    the emitted flags equals the plan's 671B (the MTP module is neither planned nor emitted).
    tp=2 does not fit 256 H100 without expert parallelism."""
    model = resolve_model("deepseek-v3")
    args = emitted_args("deepseek-v3", "32x8xH100", *(("--layout", layout) if layout else ()))
    assert "--multi-latent-attention" in args and flag(args, "--moe-layer-freq") == "([0]*3+[1]*58)"
    planned = param_counts(model).total
    assert megatron_param_count(args, model.vocab_size) == planned
    assert planned == pytest.approx(671e9, rel=0.01)


def test_architecture_flags_describe_the_spec():
    """RoPE base, MoE routing, biases and dropout come from the spec, not Megatron's defaults."""
    mixtral = emitted_args("mixtral-8x7b", "4x8xH100")
    assert (flag(mixtral, "--num-experts"), flag(mixtral, "--moe-router-topk")) == ("8", "2")
    assert flag(mixtral, "--rotary-base") == "1000000"
    qwen = emitted_args("qwen2.5-72b", "4x8xH100")
    assert "--add-qkv-bias" in qwen and "--disable-bias-linear" in qwen
    llama = emitted_args("llama-3.1-8b", "1x8xH100")
    assert flag(llama, "--rotary-base") == "500000"
    for args in (mixtral, qwen, llama):
        assert (flag(args, "--attention-dropout"), flag(args, "--hidden-dropout")) == ("0", "0")


def test_a_model_the_command_cannot_build_gets_no_command():
    """DeepSeek-V3.2's DSA indexer has no Megatron flag here: rather than a command that trains
    another model, the plan stands with no command and says why (launch_not_emitted); --emit
    none plans it the same, without the reason."""
    spec = str(Path(__file__).parents[1] / "fixtures" / "hf_configs" / "deepseek-ai--DeepSeek-V3.2")
    base = ["--workload", "train", "--json", "--model", spec, "--cluster", "32x8xH100",
            "--global-batch", "1024", "--seq-len", "4096"]
    refused = CliRunner().invoke(app, base)
    assert refused.exit_code == 0
    data = json.loads(refused.output)
    assert "DSA lightning indexer" in data["launch_not_emitted"] and data["recommended"]["command"] == []
    planned = CliRunner().invoke(app, [*base, "--emit", "none"])
    data = json.loads(planned.output)
    assert planned.exit_code == 0 and data["recommended"]["command"] == [] and data["launch_not_emitted"] is None


def test_llama3_rope_scaling_and_qk_norm_reach_the_command():
    """Llama 3.1's config.json rope_scaling (rope_type llama3, factor 8) is Megatron's
    --use-rope-scaling --rope-scaling-factor 8 (its low/high frequency factors 1 and 4 and original
    length 8,192 are Llama 3.1's); Qwen3's per-head q_norm/k_norm is --qk-layernorm (an RMSNorm
    under --normalization RMSNorm). Without them the command would train another model."""
    from planner.catalog import resolve_model
    from planner.emit.megatron import model_args

    hf = Path(__file__).parents[1] / "fixtures" / "hf_configs"
    llama = resolve_model(str(hf / "meta-llama--Meta-Llama-3.1-70B"))
    qwen = resolve_model(str(hf / "Qwen--Qwen3-8B"))
    assert (llama.llama3_rope_scaling_factor, llama.qk_norm) == (8.0, False)
    assert (qwen.llama3_rope_scaling_factor, qwen.qk_norm) == (None, True)
    assert resolve_model("llama-3.1-70b").llama3_rope_scaling_factor == 8 and resolve_model("qwen3-32b").qk_norm
    args = model_args(llama, 8192, 8)
    i = args.index("--use-rope-scaling")
    assert args[i + 1:i + 3] == ["--rope-scaling-factor", "8"] and "--qk-layernorm" not in args
    assert "--qk-layernorm" in model_args(qwen, 4096, 8) and "--use-rope-scaling" not in model_args(qwen, 4096, 8)


def test_the_router_the_model_was_trained_with_reaches_the_command():
    """The router is part of the model: DeepSeek-V3 scores experts with a sigmoid, picks its top 8
    by score + a learned bias (noaux_tc) and scales their renormalized weights by 2.5; Llama 4
    scales the expert's input by the sigmoid of its top-1 logit; Qwen3's softmax after the top-k
    (renormalized) is Megatron's default; a softmax over every expert with no renormalization
    (DeepSeek-V2, Qwen2-MoE: norm_topk_prob false) is --moe-router-pre-softmax, as is any
    softmax router picking one expert (Megatron refuses one otherwise). Without these the command
    trained a softmax router with none of DeepSeek-V3's balancing."""
    from planner.emit.megatron import router_args

    deepseek = emitted_args("deepseek-v3", "32x8xH100")
    assert (flag(deepseek, "--moe-router-score-function"), flag(deepseek, "--moe-router-topk-scaling-factor")) == (
        "sigmoid", "2.5")
    assert "--moe-router-enable-expert-bias" in deepseek and "--moe-router-pre-softmax" not in deepseek
    assert router_args(resolve_model("llama-4-scout")) == [
        "--moe-router-score-function", "sigmoid", "--moe-apply-probs-on-input"]
    assert router_args(resolve_model("qwen3-30b-a3b")) == []
    unnormalized = resolve_model("qwen3-30b-a3b").model_copy(update={"router_topk_normalized": False})
    assert router_args(unnormalized) == ["--moe-router-pre-softmax"]
    assert router_args(resolve_model("mixtral-8x7b")) == []
    assert router_args(resolve_model("llama-3.1-8b")) == []


def test_routers_megatron_cannot_build_get_no_command():
    """DeepSeek-V4's sqrtsoftplus scores exist from core_v0.19.0 only; a sigmoid router that does
    not renormalize, or a softmax one with an expert bias, no release builds (router_refusals)."""
    from planner.emit.megatron import router_refusals
    from planner.engines import MEGATRON_RELEASES

    old, new = MEGATRON_RELEASES["core_v0.14.0"], MEGATRON_RELEASES["core_v0.19.0"]
    v3 = resolve_model("deepseek-v3")
    assert router_refusals(v3, old) == router_refusals(v3, new) == []
    v4_like = v3.model_copy(update={"router_score_function": "sqrtsoftplus"})
    assert "no sqrtsoftplus" in router_refusals(v4_like, old)[0] and router_refusals(v4_like, new) == []
    assert "renormalizes sigmoid" in router_refusals(v3.model_copy(update={"router_topk_normalized": False}), new)[0]
    softmax_bias = v3.model_copy(update={"router_score_function": "softmax"})
    assert "expert bias only to sigmoid" in router_refusals(softmax_bias, new)[0]


def test_router_keys_are_read_from_config_json():
    """scoring_func, topk_method noaux_tc, routed_scaling_factor and norm_topk_prob as published:
    DeepSeek-V3 sigmoid + bias + 2.5, Kimi K2 2.827, MiniMax-M2 (use_routing_bias) sigmoid + bias,
    Qwen3 the defaults, an unknown scoring_func refused; the shipped deepseek-v3 spec says the same.
    (DeepSeek-V4's sqrtsoftplus config is refused for its compressed attention before its router.)"""
    hf = Path(__file__).parents[1] / "fixtures" / "hf_configs"

    def router(name: str) -> tuple:
        m = resolve_model(str(hf / name))
        return m.router_score_function, m.router_expert_bias, m.router_topk_scaling_factor, m.router_topk_normalized

    assert router("deepseek-ai--DeepSeek-V3") == ("sigmoid", True, 2.5, True)
    assert router("moonshotai--Kimi-K2-Instruct") == ("sigmoid", True, 2.827, True)
    assert router("MiniMaxAI--MiniMax-M2.5") == ("sigmoid", True, None, True)
    assert router("Qwen--Qwen3-30B-A3B") == ("softmax", False, None, True)
    assert router("stepfun-ai--Step-3.7-Flash") == ("sigmoid", True, 3.0, True)  # use_moe_router_bias, its scale
    assert router("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") == ("sigmoid", True, 2.5, True)  # by family
    from planner.hf_config import router_fields
    from planner.specs import SpecError

    assert router_fields({"scoring_func": "sqrtsoftplus"}, "deepseek_v4", "c")["router_score_function"] == "sqrtsoftplus"
    with pytest.raises(SpecError, match="scoring_func: 'relu' is not a router"):
        router_fields({"scoring_func": "relu"}, "x", "c")
    shipped = resolve_model("deepseek-v3")
    assert (shipped.router_score_function, shipped.router_expert_bias, shipped.router_topk_scaling_factor) == (
        "sigmoid", True, 2.5)


def test_a_plan_says_when_the_spec_s_mtp_layer_is_left_out():
    """DeepSeek-V3's spec has one multi-token-prediction layer, which Megatron trains by default
    (priced and emitted: no note); with --mtp-layers 0 or torchtitan (which builds none) the
    notes say it is left out (JSON `notes`); a model without one says nothing of it."""
    from planner.requests import TrainRequest
    from planner.train import training_caveats

    def says(model, **kw):
        return any("multi-token-prediction" in note
                   for note in training_caveats(resolve_model(model), TrainRequest(global_batch=1024, seq_len=4096,
                                                                                   **kw)))

    assert not says("deepseek-v3")
    assert says("deepseek-v3", mtp_layers=0) and says("deepseek-v3", engine="torchtitan")
    assert not says("qwen3-30b-a3b") and not says("qwen3-30b-a3b", mtp_layers=0)
