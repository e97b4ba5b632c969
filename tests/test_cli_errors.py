"""Every bad input through the real CLI (`python -m planner`, cwd = repository root): exit
code 2, nothing on stdout, exactly one line on stderr that names the file (where there is
one) and the field or flag, and never a traceback. The invocations run concurrently once per
module; each case is then its own test."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from planner.catalog import HARDWARE_PROFILES_DIR, MODEL_SPECS_DIR

GOOD_MODEL = "llama-3.1-70b"
GOOD_CLUSTER = "1x8xA100"


def _model_yaml(**change: object) -> str:
    fields = yaml.safe_load((MODEL_SPECS_DIR / "llama-3.1-70b.yaml").read_text())
    fields.update(change)
    return yaml.safe_dump({k: v for k, v in fields.items() if v is not None}, sort_keys=False)


def _profile_yaml(**change: object) -> str:
    fields = yaml.safe_load((HARDWARE_PROFILES_DIR / "2x8xA100.yaml").read_text())
    fields.update(change)
    return yaml.safe_dump({k: v for k, v in fields.items() if v is not None}, sort_keys=False)


# case id -> (file name or None, file text, flag it goes to, words the message must hold)
FILE_CASES: dict[str, tuple[str, str | bytes, str, tuple[str, ...]]] = {
    "measured-curve-list-typo": (
        "p.yaml",
        "name: t\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100-SXM5-80GB\nintra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\nmeasured:\n  allreduce_curve: [{link: intra_node, num_ranks: 8, sizes_bytes: [8, 16], median_seconds: [1.0e-5, 2.0e-5]}]\n",
        "--cluster",
        ('allreduce_curve', 'not a curve list'),
    ),
    "measured-curve-too-many-ranks": (
        "p.yaml",
        "name: t\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100-SXM5-80GB\nintra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\nmeasured:\n  allreduce_curves: [{link: intra_node, num_ranks: 99, sizes_bytes: [8, 16], median_seconds: [1.0e-5, 2.0e-5]}]\n",
        "--cluster",
        ('allreduce_curves', '99 ranks'),
    ),
    "measured-curve-unknown-key": (
        "p.yaml",
        "name: t\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100-SXM5-80GB\nintra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\nmeasured:\n  allreduce_curves: [{link: intra_node, num_ranks: 8, sizes_bytes: [8, 16], median_seconds: [1.0e-5, 2.0e-5], bogus: 1}]\n",
        "--cluster",
        ('bogus', 'unknown field'),
    ),
    "measured-inter-node-curve-one-node": (
        "p.yaml",
        "name: t\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100-SXM5-80GB\nintra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\nmeasured:\n  allreduce_curves: [{link: inter_node, num_ranks: 2, sizes_bytes: [8, 16], median_seconds: [1.0e-5, 2.0e-5]}]\n",
        "--cluster",
        ('inter_node curve', 'one node'),
    ),
    "measured-duplicate-curves": (
        "p.yaml",
        "name: t\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100-SXM5-80GB\nintra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\nmeasured:\n  allreduce_curves: [{link: intra_node, num_ranks: 8, sizes_bytes: [8, 16], median_seconds: [1.0e-5, 2.0e-5]}, {link: intra_node, num_ranks: 8, sizes_bytes: [8, 16], median_seconds: [1.0e-5, 2.0e-5]}]\n",
        "--cluster",
        ('two curves', '8 ranks'),
    ),
    "profile-visible-memory-above-total": (
        "p.yaml",
        "name: custom\nnum_nodes: 1\ngpus_per_node: 8\n"
        "gpu: {name: X1, memory_gib: 48, cuda_visible_memory_gib: 96, hbm_bandwidth_gb_per_s: 1000, "
        "peak_tflops: {bf16: 200}}\nintra_node: {kind: nvlink, bandwidth_gb_per_s: 300, latency_us: 1}\n",
        "--cluster",
        ("cuda_visible_memory_gib", "more than memory_gib"),
    ),
    "profile-inline-gpu-without-16-bit-rate": (
        "p.yaml",
        "name: custom\nnum_nodes: 1\ngpus_per_node: 8\n"
        "gpu: {name: X1, memory_gib: 48, hbm_bandwidth_gb_per_s: 1000, peak_tflops: {fp32: 50}}\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 300, latency_us: 1}\n",
        "--cluster",
        ("p.yaml", "gpu", "peak_tflops.bf16", "no 16-bit tensor-core rate"),
    ),
    "profile-exponent-read-as-text": (
        "p.yaml",
        "name: c\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 300, latency_us: 1e-5}\n",
        "--cluster",
        ("intra_node.latency_us", "must be a number", "'1e-5'", "1.0e-5"),
    ),
    "model-dtype-not-a-choice": (
        "m.yaml",
        _model_yaml(dtype="float8"),
        "--model",
        ("dtype", "must be 'float32', 'float16' or 'bfloat16'", "float8"),
    ),
    "profile-one-point-curve": (
        "p.yaml",
        _profile_yaml(measured={"allreduce_curves": [
            {"link": "intra_node", "num_ranks": 8, "sizes_bytes": [1024], "median_seconds": [1.0e-5]}]}),
        "--cluster",
        ("sizes_bytes", "at least two sizes"),
    ),
    "model-malformed-yaml": (
        "m.yaml",
        "name: x\nnum_hidden_layers: [1\n",
        "--model",
        ("malformed YAML",),
    ),
    "model-duplicate-key": (
        "m.yaml",
        _model_yaml() + "hidden_size: 4096\n",
        "--model",
        ("duplicate key", "hidden_size", "line"),
    ),
    "profile-duplicate-key": (
        "c.yaml",
        _profile_yaml() + "num_nodes: 4\n",
        "--cluster",
        ("duplicate key", "num_nodes"),
    ),
    "model-unknown-field": (
        "m.yaml",
        _model_yaml(bogus_field=1),
        "--model",
        ("bogus_field", "unknown field"),
    ),
    "model-missing-field": (
        "m.yaml",
        _model_yaml(vocab_size=None),
        "--model",
        ("vocab_size", "missing"),
    ),
    "model-wrong-type": ("m.yaml", _model_yaml(hidden_size="wide"), "--model", ("hidden_size",)),
    "model-wrong-type-bool-field": (
        "m.yaml",
        _model_yaml(gated_mlp="maybe"),
        "--model",
        ("gated_mlp",),
    ),
    "model-zero-size": (
        "m.yaml",
        _model_yaml(num_hidden_layers=0),
        "--model",
        ("num_hidden_layers",),
    ),
    "model-blank-name": ("m.yaml", _model_yaml(name="  "), "--model", ("name", "empty or blank")),
    "profile-empty-name": ("c.yaml", _profile_yaml(name=""), "--cluster", ("name", "empty or blank")),
    "model-int4-group-not-tiling-hidden": (
        "m.yaml",
        _model_yaml(quantization="int4", quantization_group_size=96),
        "--model",
        ("quantization_group_size", "groups of 96", "8,192"),
    ),
    "model-negative-size": (
        "m.yaml",
        _model_yaml(intermediate_size=-5),
        "--model",
        ("intermediate_size",),
    ),
    "model-heads-not-dividing-hidden": (
        "m.yaml",
        _model_yaml(head_dim=None, num_attention_heads=60, num_key_value_heads=6),
        "--model",
        ("head_dim", "num_attention_heads"),
    ),
    "model-kv-heads-not-dividing-heads": (
        "m.yaml",
        _model_yaml(num_key_value_heads=7),
        "--model",
        ("num_key_value_heads",),
    ),
    "model-bad-dtype": ("m.yaml", _model_yaml(dtype="float64"), "--model", ("dtype",)),
    "model-expert-size-on-dense": (
        "m.yaml", _model_yaml(moe_intermediate_size=2048), "--model", ("moe_intermediate_size", "routed experts"),
    ),
    "model-shared-experts-on-dense": (
        "m.yaml", _model_yaml(num_shared_experts=1), "--model", ("num_shared_experts", "routed experts"),
    ),
    "model-top-level-list": ("m.yaml", "- a\n- b\n", "--model", ("(top level)",)),
    "model-empty-file": ("m.yaml", "", "--model", ("(top level)",)),
    "model-unsafe-yaml-tag": (
        "m.yaml",
        "!!python/object/apply:os.system ['true']\n",
        "--model",
        ("malformed YAML",),
    ),
    "config-json-malformed": (
        "config.json",
        '{"hidden_size": 8192,',
        "--model",
        ("malformed JSON",),
    ),
    "config-json-duplicate-key": (
        "config.json",
        '{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "hidden_size": 8192}',
        "--model",
        ("duplicate key", "hidden_size"),
    ),
    "dataset-request-longer-than-the-model": (
        "requests.jsonl",
        '{"input_len": 100, "output_len": 50}\n\n{"input_len": 140000, "output_len": 50}\n',
        "--dataset",
        ("requests.jsonl", "line 3", "140,000", "max model length"),  # the blank line 2 counts
    ),
    "config-json-unmodelled-hybrid": (
        "config.json",
        '{"architectures": ["JambaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096, '
        '"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 65536, '
        '"num_experts": 16, "attn_layer_period": 8, "expert_layer_period": 2}',
        "--model",
        ("config.json", "jamba", "does not model"),
    ),
    "config-json-not-utf8": ("config.json", b"\xff\xfe{", "--model", ("cannot read",)),
    "config-json-unsupported-quantization": (
        "config.json",
        '{"hidden_size": 8, "quantization_config": {"quant_method": "hqq"}}',
        "--model",
        ("quantization_config",),
    ),
    "profile-malformed-yaml": (
        "c.yaml",
        "name: c\nnum_nodes: {1\n",
        "--cluster",
        ("malformed YAML",),
    ),
    "profile-unknown-gpu": ("c.yaml", _profile_yaml(gpu="A999"), "--cluster", ("gpu", "A999")),
    "profile-zero-gpus-per-node": (
        "c.yaml",
        _profile_yaml(gpus_per_node=0),
        "--cluster",
        ("gpus_per_node",),
    ),
    # 1.0e30 (no sign) is text to PyYAML: the hint writes this number as YAML reads one
    "profile-exponent-without-sign": ("c.yaml", _profile_yaml(num_nodes=1).replace("bandwidth_gb_per_s: 300",
                                                                                   "bandwidth_gb_per_s: 1.0e30"),
                                      "--cluster", ("bandwidth_gb_per_s", "write it as 1.0e+30")),
    # the value beside the bound ("0" is inside "0.01": it was left out)
    "profile-zero-latency": ("c.yaml", _profile_yaml().replace("latency_us: 1.0", "latency_us: 0"), "--cluster",
                             ("latency_us", "(got 0)")),
    "profile-negative-nodes": ("c.yaml", _profile_yaml(num_nodes=-1), "--cluster", ("num_nodes",)),
    "profile-no-intra-node": (
        "c.yaml",
        _profile_yaml(intra_node=None),
        "--cluster",
        ("intra_node",),
    ),
    "profile-no-inter-node": (
        "c.yaml",
        _profile_yaml(inter_node=None),
        "--cluster",
        ("inter_node",),
    ),
    "profile-unknown-intra-kind": (
        "c.yaml",
        _profile_yaml(intra_node={"kind": "warp", "bandwidth_gb_per_s": 300, "latency_us": 1}),
        "--cluster",
        ("intra_node.kind", "warp"),
    ),
    "profile-unknown-inter-kind": (
        "c.yaml",
        _profile_yaml(
            inter_node={
                "kind": "carrier-pigeon",
                "num_nics_per_node": 8,
                "nic_bandwidth_gbit_per_s": 200,
                "latency_us": 5,
            }
        ),
        "--cluster",
        ("inter_node.kind",),
    ),
    "profile-link-not-a-mapping": (
        "c.yaml",
        _profile_yaml(intra_node=300),
        "--cluster",
        ("intra_node",),
    ),
    "profile-negative-bandwidth": (
        "c.yaml",
        _profile_yaml(intra_node={"kind": "nvlink", "bandwidth_gb_per_s": -300, "latency_us": 1}),
        "--cluster",
        ("intra_node.bandwidth_gb_per_s",),
    ),
    "profile-unknown-field": (
        "c.yaml",
        _profile_yaml(nodes=2),
        "--cluster",
        ("nodes", "unknown field"),
    ),
    "profile-top-level-scalar": ("c.yaml", "just a string\n", "--cluster", ("(top level)",)),
    # strict types: a float, a string or a boolean is not silently an integer
    "model-float-hidden-size": (
        "m.yaml", _model_yaml(hidden_size=8192.0), "--model", ("hidden_size", "must be an integer"),
    ),
    "model-string-hidden-size": (
        "m.yaml", _model_yaml(hidden_size="8192"), "--model", ("hidden_size", "must be an integer"),
    ),
    "model-bool-layers": (
        "m.yaml", _model_yaml(num_hidden_layers=True), "--model",
        ("num_hidden_layers", "must be an integer"),
    ),
    # plausibility bounds
    "model-huge-hidden-size": (
        "m.yaml", _model_yaml(hidden_size=10**30), "--model", ("hidden_size", "plausibility"),
    ),
    "model-huge-layers": (
        "m.yaml", _model_yaml(num_hidden_layers=10**30), "--model", ("num_hidden_layers",),
    ),
    "profile-infinite-bandwidth": (
        "c.yaml",
        _profile_yaml().replace("bandwidth_gb_per_s: 300", "bandwidth_gb_per_s: .inf"),
        "--cluster", ("intra_node.bandwidth_gb_per_s", "finite"),
    ),
    "profile-nan-latency": (
        "c.yaml", _profile_yaml().replace("latency_us: 5.0", "latency_us: .nan"),
        "--cluster", ("inter_node.latency_us", "finite"),
    ),
    "profile-bool-nodes": (
        "c.yaml", _profile_yaml(num_nodes=True), "--cluster", ("num_nodes", "must be an integer"),
    ),
    "profile-too-many-gpus": (
        "c.yaml", _profile_yaml(num_nodes=10**6, gpus_per_node=8), "--cluster",
        ("num_nodes", "1,048,576"),
    ),
    # files that are not specs: refused before or while parsing, never a traceback or a hang
    "model-deep-flow-sequence": (
        "m.yaml", "name: x\nnum_hidden_layers: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "--model", ("malformed YAML", "nested"),
    ),
    "model-huge-file": ("m.yaml", "# padding\n" * 220_000, "--model", ("larger than 1 MiB",)),
    "model-binary-file": ("m.yaml", bytes(range(256)) * 4, "--model", ("cannot read", "UTF-8")),
    "model-nul-bytes": ("m.yaml", "name: x\x00\x00\n", "--model", ("malformed YAML",)),
    "model-alias-bomb": (
        "m.yaml",
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n"
                  for i in range(8)),
        "--model", ("values",),
    ),
    # config.json values of the wrong shape, and models that are not decoder LLMs
    "config-json-dtype-list": (
        "config.json", '{"model_type": "llama", "hidden_size": 8, "torch_dtype": ["bfloat16"]}', "--model",
        ("torch_dtype",),
    ),
    "config-json-config-groups-list": (
        "config.json",
        '{"model_type": "llama", "quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1]}}',
        "--model", ("quantization_config.config_groups",),
    ),
    "config-json-config-groups-strings": (
        "config.json",
        '{"model_type": "llama", "quantization_config": {"quant_method": "compressed-tensors", '
        '"config_groups": {"group_0": "int4"}}}',
        "--model", ("quantization_config.config_groups.group_0",),
    ),
    # values the import had ignored or defaulted, planning another model than the file's (a critical read)
    "config-json-decoder-sparse-step-0": (
        "config.json", '{"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 64, '
        '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64, '
        '"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 0}',
        "--model", ("decoder_sparse_step", "at least 1"),
    ),
    "config-json-mlp-only-layer-past-the-model": (
        "config.json", '{"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 64, '
        '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64, '
        '"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [500]}',
        "--model", ("mlp_only_layers", "500", "0..3"),
    ),
    "config-json-partial-rotary-factor-above-1": (
        "config.json", '{"model_type": "llama", "partial_rotary_factor": 2}', "--model",
        ("partial_rotary_factor", "(0, 1]"),
    ),
    "config-json-routed-scaling-factor-string": (
        "config.json", '{"model_type": "deepseek_v3", "routed_scaling_factor": "2.5"}', "--model",
        ("routed_scaling_factor", "a number"),
    ),
    "config-json-max-window-layers-float": (
        "config.json", '{"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4096, '
        '"max_window_layers": 28.0}', "--model", ("max_window_layers", "integer"),
    ),
    "config-json-unknown-rope-type": (
        "config.json", '{"model_type": "llama", "rope_scaling": {"rope_type": "weird", "factor": 4}}', "--model",
        ("rope_scaling.rope_type", "weird"),
    ),
    "config-json-rope-factor-string": (
        "config.json", '{"model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": "4"}}', "--model",
        ("rope_scaling.factor", "positive number"),
    ),
    "config-json-awq-8-bit": (
        "config.json", '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
        '"intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64, "quantization_config": '
        '{"quant_method": "awq", "bits": 8, "group_size": 32}}', "--model",
        ("quantization_config.bits", "8-bit AWQ", "4-bit AWQ only"),
    ),
    "json-model-spec": (
        "spec.json", '{"name": "x", "num_hidden_layers": 2, "hidden_size": 64, "quantization": "fp8"}', "--model",
        ("model_type: missing", "name", "YAML"),
    ),
    "config-json-bert": (
        "config.json", '{"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768}',
        "--model", ("model_type", "encoder-only", "decoder-only"),
    ),
    "config-json-t5": (
        "config.json", '{"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": true}',
        "--model", ("encoder-decoder",),
    ),
    "config-json-vit": (
        "config.json", '{"architectures": ["ViTForImageClassification"], "model_type": "vit"}',
        "--model", ("vision model",),
    ),
    "config-json-float-hidden-size": (
        "config.json",
        '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4096.0, "num_attention_heads": 32, '
        '"intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096}',
        "--model", ("hidden_size", "must be an integer"),
    ),
    "config-json-wrapper-incomplete-text-config": (
        "config.json", '{"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 4096}}',
        "--model", ("text_config", "num_hidden_layers", "missing"),
    ),
    "model-huge-integer": ("m.yaml", "hidden_size: " + "9" * 5000 + "\n", "--model", ("malformed YAML",)),
}

# case id -> (argv, words the message must hold)
FLAG_CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "explain-train-flags-that-rule-out-everything": (
        ["explain", "--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch",
         "256", "--seq-len", "4096", "--virtual-stages", "20", "--no-sensitivity"],
        ("--virtual-stages 20", "no configuration runs with these settings"),
    ),
    # one reason refuses every layout: it alone is the cause, nothing else pads the line
    "deepep-across-a100-nodes-alone": (
        ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "4x8xA100", "--global-batch", "256",
         "--seq-len", "4096", "--moe-dispatcher", "deepep", "--layout", "ep=16"],
        ("--layout ep=16: no configuration runs", "runs inside one node only", "this EP group spans nodes"),
    ),
    "engine-version-of-a-serving-engine-in-training": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256",
         "--seq-len", "4096", "--engine-version", "vllm=0.22.0"],
        ("--engine-version", "vllm not used by a train plan", "--engine megatron"),
    ),
    # found by a fuzz sweep: a blank engine read "not used by a serve plan", a blank version
    # "vllm  is not known", an empty --dataset ".: not a regular file"
    "train-layout-that-cannot-multiply-before-the-batch": (
        ["--workload", "train", "--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--global-batch", "64",
         "--seq-len", "4096", "--layout", "tp=2,pp=2,dp=3"],
        ("--layout: tp=2,pp=2,dp=3 cannot multiply to the",),
    ),
    "engine-version-blank-engine": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--engine-version", "=0.22.0"],
        ("--engine-version", "'=0.22.0': expected ENGINE=VERSION"),
    ),
    "engine-version-blank-version": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--engine-version", "vllm="],
        ("--engine-version", "vllm: no version after '='"),
    ),
    "engine-version-stray-comma": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--engine-version", "vllm=0.22.0,"],
        ("--engine-version", "'vllm=0.22.0,': an empty entry between commas"),
    ),
    "dataset-empty": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--dataset", ""],
        ("--dataset: empty",),
    ),
    "engine-version-of-megatron-in-serving": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--engine-version", "megatron=core_v0.14.0"],
        ("--engine-version", "megatron not used by a serve plan"),
    ),
    "seq-len-beyond-learned-positions": (
        ["--workload", "train", "--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "256",
         "--seq-len", "8192"],
        ("--seq-len", "8,192 exceeds gpt3-175b's 2,048 learned positions"),
    ),
    "burstiness-zero": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--request-rate", "4", "--burstiness", "0"],
        ("--burstiness", "finite and at least 0.01", "got 0.0"),
    ),
    "burstiness-nan": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--request-rate", "4", "--burstiness", "nan"],
        ("--burstiness", "finite and at least 0.01", "got nan"),
    ),
    "burstiness-that-underflows": (
        # a gamma shape of 1e-9 draws zeros only: the rescale divided by 0 (found by a fuzz sweep)
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--request-rate", "10", "--burstiness", "1e-9"],
        ("--burstiness", "finite and at least 0.01", "underflow"),
    ),
    "burstiness-without-a-rate": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--burstiness", "0.5"],
        ("--burstiness", "finite --request-rate", "ignores it at inf"),
    ),
    "burstiness-at-inf": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--request-rate", "inf", "--burstiness", "0.5"],
        ("--burstiness", "finite --request-rate"),
    ),
    "burstiness-disaggregated": (
        ["--model", GOOD_MODEL, "--cluster", "2x8xH100", "--request-rate", "4", "--burstiness", "0.5",
         "--mode", "disaggregated"],
        ("--burstiness", "simulated for aggregated replicas only"),
    ),
    "burstiness-explain": (
        ["explain", "--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--request-rate", "4", "--burstiness", "0.5"],
        ("--burstiness", "plan explain takes one layout apart"),
    ),
    "draft-model-wider-than-target": (
        ["--model", "llama-3.1-8b", "--cluster", GOOD_CLUSTER, "--speculative-method", "eagle3",
         "--num-speculative-tokens", "2", "--draft-acceptance", "0.5", "--draft-model", "llama-3.1-70b"],
        ("--draft-model", "hidden_size 8192 differs", "at most 1/4"),
    ),
    "draft-model-with-experts": (
        ["--model", "mixtral-8x22b", "--cluster", "2x8xH100", "--speculative-method", "eagle",
         "--num-speculative-tokens", "2", "--draft-acceptance", "0.5", "--draft-model", "mixtral-8x7b"],
        ("--draft-model", "routed experts"),
    ),
    "draft-model-not-found": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "eagle",
         "--num-speculative-tokens", "2", "--draft-acceptance", "0.5", "--draft-model", "no-such-head"],
        ("--draft-model:", "no-such-head"),
    ),
    "served-draft-model-without-method": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--served-draft-model", "org/head"],
        ("--served-draft-model", "only with --speculative-method"),
    ),
    "mtp-acceptance-rates-beyond-its-layers": (
        ["--model", "deepseek-v3", "--cluster", "1x8xH200", "--speculative-method", "mtp",
         "--draft-acceptance", "0.8,0.6"],
        ("--draft-acceptance", "mtp drafts 1 token(s) per step by default", "--num-speculative-tokens 2"),
    ),
    "draft-acceptance-without-method": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--draft-acceptance", "0.8"],
        ("--draft-acceptance", "only with --speculative-method"),
    ),
    "speculative-method-without-acceptance": (
        ["--model", "deepseek-v3", "--cluster", "1x8xH200", "--speculative-method", "mtp"],
        ("--draft-acceptance", "needed"),
    ),
    "speculative-mtp-without-mtp-layers": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "mtp", "--draft-acceptance", "0.8"],
        ("--speculative-method mtp", "no multi-token-prediction layers"),
    ),
    "speculative-eagle3-without-draft": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "eagle3",
         "--num-speculative-tokens", "3", "--draft-acceptance", "0.8"],
        ("--draft-model", "eagle3"),
    ),
    "speculative-ngram-without-count": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "ngram", "--draft-acceptance", "0.5"],
        ("--num-speculative-tokens", "needed"),
    ),
    "draft-acceptance-above-one": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "ngram",
         "--num-speculative-tokens", "2", "--draft-acceptance", "0.8,1.2"],
        ("--draft-acceptance", "[0, 1]", "1.2"),
    ),
    "draft-acceptance-count": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "ngram",
         "--num-speculative-tokens", "3", "--draft-acceptance", "0.8,0.6"],
        ("--draft-acceptance", "one per drafted token", "3"),
    ),
    "draft-acceptance-not-a-number": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "ngram",
         "--num-speculative-tokens", "1", "--draft-acceptance", "high"],
        ("--draft-acceptance", "'high'", "not a number"),
    ),
    "draft-model-with-ngram": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "ngram",
         "--num-speculative-tokens", "1", "--draft-acceptance", "0.5", "--draft-model", "llama-3.1-8b"],
        ("--draft-model", "only with --speculative-method eagle or eagle3"),
    ),
    "speculative-tokens-too-many": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--speculative-method", "ngram",
         "--num-speculative-tokens", "64", "--draft-acceptance", "0.5"],
        ("--num-speculative-tokens", "64"),
    ),
    "speculative-method-for-training": (
        ["--workload", "train", "--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--global-batch", "64",
         "--seq-len", "2048", "--speculative-method", "ngram"],
        ("--speculative-method", "--workload serve"),
    ),
    "all2all-backend-dense-model": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--all2all-backend", "deepep_low_latency"],
        ("--all2all-backend", "no routed experts"),
    ),
    "enable-dbo-dense-model": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--enable-dbo"],
        ("--enable-dbo", "no routed experts"),
    ),
    "enable-dbo-default-backend": (
        ["--model", "qwen3-30b-a3b", "--cluster", GOOD_CLUSTER, "--enable-dbo"],
        ("--enable-dbo", "allgather_reducescatter"),
    ),
    "all2all-backend-unknown": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--all2all-backend", "pplx"],
        ("--all2all-backend", "pplx"),
    ),
    "served-model-empty": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--served-model", " "],
        ("--served-model", "empty"),
    ),
    "served-model-newline": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--served-model", "meta/x\nrm -rf"],
        ("--served-model", "control character"),
    ),
    # vLLM and SGLang would read it as an option (found by a CLI sweep: `vllm serve --foo`)
    "served-model-dash": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--served-model", "--foo"],
        ("--served-model", "starts with '-'"),
    ),
    # Megatron would recompute the stage's every layer under "block 100" (a CLI sweep)
    "recompute-num-layers-past-the-model": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", GOOD_CLUSTER, "--global-batch", "64",
         "--seq-len", "4096", "--recompute-num-layers", "100"],
        ("--recompute-num-layers", "100 is more than llama-3.1-8b's 32 layers"),
    ),
    "unknown-shipped-model": (
        ["--model", "llama-9-1t", "--cluster", GOOD_CLUSTER],
        ("--model", "llama-9-1t"),
    ),
    "unknown-shipped-cluster": (
        ["--model", GOOD_MODEL, "--cluster", "dgx-superpod"],
        ("--cluster", "dgx-superpod"),
    ),
    "unknown-gpu-shorthand": (
        ["--model", GOOD_MODEL, "--cluster", "2x8xA999"],
        ("--cluster", "A999"),
    ),
    # A GPU whose tensor peaks are not confirmed and nothing measured: serving and training
    # refuse to price compute (never as free), naming the GPU and the field to give.
    "serve-gpu-without-tensor-rate": (
        ["--model", "llama-3.1-8b", "--cluster", "1x1xA10G"],
        ("A10G", "peak_tflops.bf16", "plan probe"),
    ),
    "train-gpu-without-tensor-rate": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xA10G", "--global-batch", "64", "--seq-len", "2048"],
        ("A10G", "peak_tflops.bf16", "plan probe"),
    ),
    "disaggregated-on-one-gpu": (
        ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "disaggregated", "--gpus", "1"],
        ("--mode disaggregated", "at least 2 GPUs"),
    ),
    "dataset-with-input-len": (
        ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--dataset", "no-need-to-read.jsonl",
         "--input-len", "500"],
        ("--input-len", "--dataset"),
    ),
    "explain-svg-with-json": (
        ["explain", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--json", "--svg", "never-written.svg"],
        ("--svg", "--json"),
    ),
    "explain-svg-and-html-one-file": (
        ["explain", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--svg", "one.out", "--html", "one.out"],
        ("--html", "one.out", "--svg"),
    ),
    "zero-nodes-shorthand": (
        ["--model", GOOD_MODEL, "--cluster", "0x8xA100"],
        ("--cluster", "0x8xA100"),
    ),
    "missing-model-file": (
        ["--model", "no/such/model.yaml", "--cluster", GOOD_CLUSTER],
        ("no/such/model.yaml", "not found"),
    ),
    "missing-cluster-file": (
        ["--model", GOOD_MODEL, "--cluster", "no/such/cluster.yaml"],
        ("no/such/cluster.yaml", "not found"),
    ),
    "missing-config-json": (
        ["--model", "no/such/config.json", "--cluster", GOOD_CLUSTER],
        ("no/such/config.json", "not found"),
    ),
    "missing-model-flag": (["--cluster", GOOD_CLUSTER], ("--model",)),
    "missing-cluster-flag": (["--model", GOOD_MODEL], ("--cluster",)),
    "layout-unicode-digit": (  # str.isdigit takes it, int() does not: was a traceback
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "tp=\u00b2"],
        ("--layout", "expected tp=N"),
    ),
    "layout-number-too-long": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "tp=" + "9" * 4301],
        ("--layout", "expected tp=N"),
    ),
    "layout-no-equals": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "tp8"],
        ("--layout", "tp8"),
    ),
    "layout-unknown-degree": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "cp=2"],
        ("--layout", "cp=2"),
    ),
    "layout-ep-on-a-dense-model": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "ep=2"],
        ("--layout", "ep=2", "no experts"),
    ),
    "layout-ep-not-whole-tp-groups": (
        ["--model", "qwen3-30b-a3b", "--cluster", GOOD_CLUSTER, "--layout", "tp=2,ep=3"],
        ("--layout", "ep must be tp times a divisor of dp"),
    ),
    "timeline-interleaved-one-stage": (
        ["explain", "--timeline-only", "--schedule", "interleaved", "--stages", "1", "--virtual-stages", "2"],
        ("--stages", "at least 2 stages"),
    ),
    "train-gpus-not-whole-nodes": (
        ["--workload", "train", "--model", GOOD_MODEL, "--cluster", "8x8xH100", "--gpus", "36", "--global-batch", "512",
         "--seq-len", "4096"],
        ("--gpus", "36", "whole nodes of 8"),
    ),
    "expert-imbalance-dense-model": (
        ["--workload", "train", "--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--global-batch", "64",
         "--seq-len", "2048", "--expert-imbalance", "2"],
        ("--expert-imbalance", "no routed experts"),
    ),
    "expert-imbalance-below-one": (
        ["--model", "qwen3-30b-a3b", "--cluster", GOOD_CLUSTER, "--expert-imbalance", "0.9"],
        ("--expert-imbalance", "0.9"),
    ),
    "layout-zero": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "tp=0"],
        ("--layout",),
    ),
    "layout-twice": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "tp=2,tp=4"],
        ("--layout", "tp"),
    ),
    "gpus-above-cluster": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpus", "9"],
        ("--gpus", "9"),
    ),
    "gpus-zero": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpus", "0"], ("--gpus",)),
    "gpus-not-a-number": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpus", "all"],
        ("--gpus",),
    ),
    "gpu-memory-utilization-above-one": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpu-memory-utilization", "1.5"],
        ("--gpu-memory-utilization",),
    ),
    "gpu-memory-utilization-zero": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpu-memory-utilization", "0"],
        ("--gpu-memory-utilization",),
    ),
    "expert-imbalance-above-what-any-gpu-can-get": (
        ["--model", "qwen3-235b-a22b-fp8", "--cluster", "1x8xH100", "--expert-imbalance", "20"],
        ("--expert-imbalance: 20", "at most 16 x the mean"),
    ),
    "train-micro-batch-above-the-global-batch": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--micro-batch", "128", "--seq-len", "4096"], ("--micro-batch: 128 exceeds --global-batch 64",),
    ),
    "layout-wider-than-the-cluster": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--layout", "tp=16"],
        ("--layout", "tp=16 needs at least 16 GPUs; 8 are planned for"),
    ),
    "gpu-memory-utilization-above-what-vllm-starts-with": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpu-memory-utilization", "1"],
        ("--gpu-memory-utilization 1", "CUDA context", "at most 0.99"),
    ),
    "gpu-memory-utilization-not-a-number": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpu-memory-utilization", "most"],
        ("--gpu-memory-utilization",),
    ),
    "unknown-option": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--bogus"], ("--bogus",)),
    "bad-choice": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--workload", "infer"],
        ("--workload",),
    ),
    # sizes that exist nowhere: refused at once (they hung or ran for minutes)
    "cluster-million-nodes": (["--model", GOOD_MODEL, "--cluster", "1000000x8xH100"], ("--cluster", "1,048,576")),
    "cluster-10-to-the-30-nodes": (
        ["--model", GOOD_MODEL, "--cluster", "1" + "0" * 30 + "x8xH100"], ("--cluster", "1,048,576"),
    ),
    "cluster-5000-digit-nodes": (["--model", GOOD_MODEL, "--cluster", "9" * 5000 + "x8xH100"], ("--cluster",)),
    "cluster-huge-node": (["--model", GOOD_MODEL, "--cluster", "1x2000xH100"], ("--cluster", "per node")),
    "timeline-too-many-stages": (
        ["explain", "--timeline-only", "--stages", "100000", "--micro-batches", "100000"], ("--stages",),
    ),
    "timeline-too-many-blocks": (
        ["explain", "--timeline-only", "--stages", "64", "--micro-batches", "100000"], ("--micro-batches",),
    ),
    "timeline-zero-virtual-stages": (
        ["explain", "--timeline-only", "--schedule", "interleaved", "--virtual-stages", "0"], ("--virtual-stages",),
    ),
    "timeline-virtual-stages-without-interleaving": (
        ["explain", "--timeline-only", "--schedule", "gpipe", "--virtual-stages", "2"], ("--virtual-stages",),
    ),
    "top-negative": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--top", "-1"], ("--top",)),
    # gpt-oss-120b's hidden size 2,880 is 22.5 groups of 128: no int4 checkpoint of it loads
    "quantization-int4-part-groups": (["--model", "gpt-oss-120b", "--cluster", GOOD_CLUSTER, "--quantization", "int4"],
                                      ("--quantization int4", "2,880")),
    "top-zero": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--top", "0"], ("--top",)),
    "model-empty": (["--model", "", "--cluster", GOOD_CLUSTER], ("--model", "empty")),
    "cluster-empty": (["--model", GOOD_MODEL, "--cluster", " "], ("--cluster", "empty")),
    # contradictions between flags (or between a flag and the model): not a table of rejections
    "train-virtual-stages-with-gpipe": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--virtual-stages", "2", "--schedule", "gpipe"], ("--virtual-stages", "gpipe"),
    ),
    "train-global-batch-not-divisible-by-fixed-dp": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "7",
         "--seq-len", "4096", "--layout", "dp=8"], ("--global-batch", "dp=8"),
    ),
    "train-global-batch-not-divisible-by-resolved-dp": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "7",
         "--seq-len", "4096", "--layout", "tp=1,pp=1"], ("--global-batch", "dp=8"),
    ),
    "train-layout-tp-3-on-8-gpus": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--layout", "tp=3"], ("--layout", "tp=3"),
    ),
    "train-layout-tp-3-on-6-gpus": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--gpus", "6",
         "--global-batch", "64", "--seq-len", "4096", "--layout", "tp=3"], ("--layout", "tp=3"),
    ),
    "serve-layout-tp-not-dividing-heads": (
        ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--gpus", "6", "--layout", "tp=3"],
        ("--layout", "tp=3", "attention heads 32"),
    ),
    "serve-layout-pp-above-layers": (
        ["--model", "llama-3.1-8b", "--cluster", "8x8xH100", "--layout", "pp=64"], ("--layout", "pp=64", "32 layers"),
    ),
    # values that were silently accepted
    "max-tpot-nan": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--max-tpot-ms", "nan"], ("--max-tpot-ms", "finite")),
    "max-tpot-inf": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--max-tpot-ms", "inf"], ("--max-tpot-ms", "finite")),
    "gpu-memory-utilization-nan": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--gpu-memory-utilization", "nan"],
        ("--gpu-memory-utilization",),
    ),
    "batch-implausible": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--batch", "10" + "0" * 20], ("--batch",)),
    "train-virtual-stages-zero": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--virtual-stages", "0"], ("--virtual-stages",),
    ),
    "train-seq-len-implausible": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "1" + "0" * 12], ("--seq-len",),
    ),
    # flags of the other workload are refused, not ignored
    "serve-flag-with-train": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--batch", "32"], ("--batch", "--workload serve"),
    ),
    "objective-with-train": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--objective", "latency"], ("--objective",),
    ),
    "quantization-with-train": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--quantization", "fp8"], ("--quantization",),
    ),
    "train-flag-with-serve": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--zero", "1"], ("--zero", "--workload train")),
    "negated-train-flag-with-serve": (
        ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--no-sequence-parallel"], ("--no-sequence-parallel",),
    ),
    "emit-megatron-with-serve": (["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--emit", "megatron"], ("--emit megatron",)),
    "emit-vllm-with-train": (
        ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096", "--emit", "sglang"], ("--emit sglang",),
    ),
    "explain-train-flag-with-serve": (
        ["explain", "--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--schedule", "1f1b"], ("--schedule",),
    ),
    "explain-timeline-flag-without-timeline-only": (
        ["explain", "--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER, "--stages", "4"], ("--stages", "--timeline-only"),
    ),
    "timeline-only-with-a-model": (["explain", "--timeline-only", "--model", GOOD_MODEL], ("--model", "--timeline-only")),
    "explain-layout-tp-not-dividing-heads": (
        ["explain", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--gpus", "6", "--layout", "tp=3"],
        ("--layout", "tp=3"),
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_plan_many) -> dict[str, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("bad-input")
    cases: dict[str, list[str]] = {}
    for case, (filename, text, flag, _) in FILE_CASES.items():
        path = root / case / filename
        path.parent.mkdir()
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        other = {"--model": ["--cluster", GOOD_CLUSTER], "--cluster": ["--model", GOOD_MODEL]}.get(
            flag, ["--model", GOOD_MODEL, "--cluster", GOOD_CLUSTER])
        cases[case] = [flag, str(path), *other]
    for case, (argv, _) in FLAG_CASES.items():
        cases[case] = argv
    return run_plan_many(cases)


def _assert_one_line_exit_2(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].strip()
    return lines[0]


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_file_exits_2_with_one_line_naming_file_and_field(results, case: str) -> None:
    filename, _, _, words = FILE_CASES[case]
    line = _assert_one_line_exit_2(results[case])
    assert re.match(rf"^/\S*/{case}/{re.escape(filename)}: ", line), line
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_bad_flag_exits_2_with_one_line_naming_it(results, case: str) -> None:
    _, words = FLAG_CASES[case]
    line = _assert_one_line_exit_2(results[case])
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("argv", [["--json", "explain", "--model", "llama-3.1-8b", "--cluster", "1x8xH100"],
                                  ["--workload", "train", "models"],
                                  ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "explain"]])
def test_options_before_a_subcommand_are_refused(argv):
    """`plan --json explain ...` ran explain without --json (typer hands the group's options to the
    group's callback, which returned); now one line, exit 2, naming the option."""
    done = subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and argv[0] in lines[0] and "before the subcommand" in lines[0], done.stderr


def test_an_ep_above_the_routed_experts_is_a_usage_error(run_plan):
    """Mixtral's 8 experts over --layout ep=16: half the ranks would hold no expert (vLLM's
    expert map), Megatron needs E divisible by ep; serving accepted it and emitted a command."""
    for workload in (("--model", "mixtral-8x7b"), ("--workload", "train", "--model", "mixtral-8x7b",
                                                    "--global-batch", "64", "--seq-len", "4096")):
        result = run_plan(*workload, "--cluster", "2x8xH100", "--layout", "ep=16")
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == "--layout: ep=16 exceeds the 8 routed experts of mixtral-8x7b"


def test_a_reason_every_layout_gives_stands_alone(results):
    """The DeepEP refusal rejects every layout of --layout ep=16 on 4x8 A100; the line used to
    add the interleaving and other reasons some layouts also gave."""
    line = _assert_one_line_exit_2(results["deepep-across-a100-nodes-alone"])
    assert "interleaving" not in line and ";" not in line.split("spans nodes")[-1]


@pytest.mark.parametrize("flag", ["--model", "--cluster"])
def test_a_pipe_given_as_a_spec_is_refused_before_it_is_opened(run_plan, tmp_path, flag):
    """A FIFO blocks open() until a writer comes: `--model /tmp/fifo` hung for ever (found by a
    fuzz sweep); --dataset already refused one."""
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    other = {"--model": ("--cluster", "1x8xH100"), "--cluster": ("--model", "llama-3.1-8b")}[flag]
    result = run_plan(flag, str(fifo), *other)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"{fifo}: not a regular file (a pipe or a device)"


def test_a_served_draft_model_starting_with_a_dash_is_refused():
    """The drafter's checkpoint goes into SGLang's --speculative-draft-model-path as one argument."""
    from planner.cli import check_served_model
    from planner.errors import SpecError

    with pytest.raises(SpecError, match="--served-draft-model: '-x' starts with '-'"):
        check_served_model("-x", "--served-draft-model")
    check_served_model("./-x", "--served-draft-model")
