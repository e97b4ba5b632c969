"""A ModelOpt checkpoint's own KV cache format: vLLM 0.17.0 and later resolve
`--kv-cache-dtype auto` to the format the checkpoint's quantization config names
(resolve_kv_cache_dtype_string / get_kv_cache_quant_algo_string, vllm/utils/torch_utils.py at
0.33.0): nvidia/Kimi-K2.5-NVFP4's kv_cache_scheme {dynamic: false, num_bits: 8, type: float}
means an fp8 KV cache, half the bytes a token. SGLang 0.5.10.post1 and 0.5.23 take an fp8 one
too; vLLM 0.12.0 and the V0 engine did not resolve it. docs/cost-model.md (Serving: memory (vLLM budget))."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.params import kv_bytes_per_token
from planner.engines import EngineVersions
from planner.errors import SpecError
from planner.hf_config import (
    checkpoint_kv_cache_dtype,
    config_code,
    load_hf_config,
    native_config_model_types,
)
from planner.layout import Layout
from planner.requests import ServeRequest, for_checkpoint
from planner.serve import estimate

HF_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures/hf_configs"


def test_the_config_json_names_an_fp8_kv_cache():
    assert load_hf_config(HF_CONFIGS / "nvidia--Kimi-K2.5-NVFP4/config.json").checkpoint_kv_cache_dtype == "fp8"
    assert resolve_model("kimi-k2.5-nvfp4").checkpoint_kv_cache_dtype == "fp8"
    # a legacy hf_quant_config.json (producer modelopt, quantization.kv_cache_quant_algo FP8):
    # vLLM gives it quant_method "modelopt_fp4" before it resolves the cache
    assert load_hf_config(HF_CONFIGS / "nvidia--Qwen3-235B-A22B-NVFP4/config.json").checkpoint_kv_cache_dtype == "fp8"
    assert resolve_model("kimi-k2.5").checkpoint_kv_cache_dtype is None  # compressed-tensors INT4


@pytest.mark.parametrize("config, expected", [
    ({"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, "fp8"),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}, "fp8"),
    ({"quant_method": "modelopt", "quantization": {"kv_cache_quant_algo": "FP8"}}, "fp8"),
    ({"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 4, "type": "float"}}, "nvfp4"),
    ({"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": True, "num_bits": 8, "type": "float"}}, None),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": None}, None),
    ({"quant_method": "compressed-tensors", "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}},
     None),
    ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, "fp8"),
    ({"producer": {"name": "modelopt"}, "quantization": {"kv_cache_quant_algo": "FP8"}}, None),  # no quant_algo
    ({"producer": {"name": "other"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, None),
])
def test_vllms_reading_of_the_quantization_config(config, expected):
    assert checkpoint_kv_cache_dtype(config) == expected


def test_auto_resolves_for_both_engines():
    kimi = resolve_model("kimi-k2.5-nvfp4")
    assert for_checkpoint(kimi, ServeRequest()).kv_cache_dtype == "fp8"
    assert for_checkpoint(kimi, ServeRequest(pool_engine="sglang")).kv_cache_dtype == "fp8"
    v0 = ServeRequest(engine_versions=EngineVersions(vllm="0.6.6.post1"))
    assert for_checkpoint(kimi, v0).kv_cache_dtype == "auto"
    assert for_checkpoint(resolve_model("llama-3.1-70b"), ServeRequest()).kv_cache_dtype == "auto"
    nvfp4_kv = kimi.model_copy(update={"checkpoint_kv_cache_dtype": "nvfp4"})
    with pytest.raises(SpecError, match="--kv-cache-dtype fp8"):
        for_checkpoint(nvfp4_kv, ServeRequest())
    assert for_checkpoint(nvfp4_kv, ServeRequest(kv_cache_dtype="fp8")).kv_cache_dtype == "fp8"
    assert for_checkpoint(nvfp4_kv, ServeRequest(pool_engine="sglang")).kv_cache_dtype == "auto"  # SGLang: FP8 only


def test_the_kv_cache_holds_twice_the_tokens_hand_worked():
    """MLA caches kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 values a token and layer: 61
    layers x 576 x 2 B = 70,272 B at 16 bits, 35,136 B in fp8; the same bytes hold twice the
    tokens (up to the 16-token block rounding)."""
    kimi = resolve_model("kimi-k2.5-nvfp4")
    assert kv_bytes_per_token(kimi, "auto") == 61 * 576 * 2
    assert kv_bytes_per_token(kimi, "fp8") == 61 * 576
    cluster = resolve_cluster("1x4xB200")
    request = ServeRequest(input_len=1024, output_len=1024, batch=16, max_model_len=2068)
    resolved = estimate(kimi, cluster, Layout(4, 1, 1), request)
    forced_16_bit = estimate(kimi.model_copy(update={"checkpoint_kv_cache_dtype": None}), cluster, Layout(4, 1, 1),
                             request)
    assert resolved.kv_cache_tokens == pytest.approx(2 * forced_16_bit.kv_cache_tokens, rel=0.01)


def test_the_command_says_fp8_and_a_note_says_why():
    args = ["--model", "kimi-k2.5-nvfp4", "--cluster", "1x4xB200", "--layout", "tp=4", "--batch", "16",
            "--input-len", "1024", "--output-len", "1024", "--max-model-len", "4096"]
    vllm = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, check=True)
    assert "--kv-cache-dtype fp8" in vllm.stdout and "KV cache in fp8" in vllm.stdout
    assert "(fp8)" in vllm.stdout.splitlines()[0]
    sglang = subprocess.run([sys.executable, "-m", "planner", *args, "--emit", "sglang", "--json"],
                            capture_output=True, text=True, check=True)
    payload = json.loads(sglang.stdout)
    assert "--kv-cache-dtype fp8_e4m3" in str(payload["layouts"][0]["command"])
    assert any("SGLang 0.5.23 takes it" in note for note in payload["launch_notes"])


def test_a_tokenizer_of_its_own_puts_trust_remote_code_in_the_commands(tmp_path):
    """tokenizer_config.json's auto_map naming an AutoTokenizer class (Kimi-K2's
    tokenization_kimi.TikTokenTokenizer) is code the engines must run: the import marks the spec
    and both engines' commands carry --trust-remote-code; the shipped Kimi specs say so too."""
    checkpoint = tmp_path / "own-tokenizer"  # a model_type with no remote tokenizer of its own
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        (HF_CONFIGS / "deepseek-ai--DeepSeek-V3/config.json").read_text(encoding="utf-8"), encoding="utf-8")
    assert not load_hf_config(checkpoint / "config.json").trust_remote_code
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}), encoding="utf-8")
    assert load_hf_config(checkpoint / "config.json").trust_remote_code
    assert resolve_model("kimi-k2.5").trust_remote_code and resolve_model("kimi-k2.5-nvfp4").trust_remote_code
    args = ["--model", "kimi-k2.5", "--cluster", "1x8xH200", "--layout", "tp=8", "--batch", "8"]
    for emit in ("vllm", "sglang"):
        run = subprocess.run([sys.executable, "-m", "planner", *args, "--emit", emit], capture_output=True,
                             text=True, check=True)
        assert "--trust-remote-code" in run.stdout, emit
    plain = subprocess.run([sys.executable, "-m", "planner", "--model", "llama-3.1-8b", "--cluster", "1x1xH100"],
                           capture_output=True, text=True, check=True)
    assert "--trust-remote-code" not in plain.stdout


@pytest.mark.parametrize(("fixture", "remote", "flag"), [
    ("nvidia--Llama-3_3-Nemotron-Super-49B-v1", True, True),  # "nemotron-nas": configuration_decilm.py only
    ("deepseek-ai--DeepSeek-V3", False, False),  # auto_map too, but transformers has deepseek_v3
    ("MiniMaxAI--MiniMax-M2.5", False, False),  # transformers 5.16.1 has minimax_m2
    # kimi_k25: vLLM's own config class (its registry), but Kimi's tokenizer is code
    # (hf_config.REMOTE_TOKENIZER_MODEL_TYPES), so the command needs the flag all the same
    ("moonshotai--Kimi-K2.5", False, True),
    ("meta-llama--Meta-Llama-3.1-8B", False, False),  # no auto_map
])
def test_a_configuration_of_its_own_needs_trust_remote_code(fixture, remote, flag):
    """config.json's auto_map naming an AutoConfig class for a model_type neither transformers
    (5.16.1, the least vLLM 0.33.0 takes) nor vLLM's registry has: the engines load it only with
    --trust-remote-code (found by a helper's CLI read on the Nemotron-Super fixture)."""
    config = json.loads((HF_CONFIGS / fixture / "config.json").read_text(encoding="utf-8"))
    assert config_code(config) is remote
    assert load_hf_config(HF_CONFIGS / fixture / "config.json").trust_remote_code is flag


def test_the_native_model_types_are_the_engines():
    names = native_config_model_types()
    assert {"llama", "deepseek_v3", "minimax_m2", "qwen3_moe", "gpt_oss", "kimi_k25", "kimi_k2"} <= names
    assert "nemotron-nas" not in names and not any(name.startswith(("#", "[")) for name in names)
    assert not config_code({"auto_map": {"AutoConfig": "x.Y"}, "model_type": "llama"})
    assert config_code({"auto_map": {"AutoConfig": "x.Y"}, "model_type": "my_own_model"})
    assert not config_code({"auto_map": {"AutoModel": "x.Y"}, "model_type": "my_own_model"})
