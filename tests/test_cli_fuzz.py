"""Fuzz the whole command line in process (planner.cli.main, as the `plan` script runs it)
with hypothesis: model specs (YAML and config.json), hardware profiles (YAML and NxMxGPU)
and flags, mostly plausible with odd values mixed in. Whatever the input:

- no exception escapes, and the exit code is 0, 1 or 2;
- an exit-2 message is exactly one line on stderr;
- --json output holds no NaN, no infinity and no negative number;
- no feasible layout uses more memory per GPU than the GPU has.

Examples are few and fixed (derandomize) so the suite stays fast and stable; set
PLAN_FUZZ_EXAMPLES to run more (e.g. 2000) when hunting.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.catalog import HARDWARE_PROFILES_DIR
from planner.cli import main

EXAMPLES = int(os.environ.get("PLAN_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=20_000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASE_MODEL: dict[str, Any] = {
    "name": "fuzz", "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 8,
    "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
BASE_PROFILE: dict[str, Any] = yaml.safe_load((HARDWARE_PROFILES_DIR / "2x8xA100.yaml").read_text())

ODD = st.one_of(
    st.sampled_from([0, -1, 1, 2**14, 2**18 + 1, 10**30, 4096.0, "4096", True, None, [8], {"a": 1}]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
)
ODD_NUMBER = st.one_of(st.integers(-2, 0), st.sampled_from(["nan", "inf", "1e400", "x", "10" + "0" * 30]))
SHAPES = {  # plausible values of each shape field
    "num_hidden_layers": st.integers(1, 160),
    "hidden_size": st.integers(1, 128).map(lambda k: 128 * k),
    "num_attention_heads": st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]),
    "num_key_value_heads": st.sampled_from([1, 2, 4, 8]),
    "intermediate_size": st.integers(1, 512).map(lambda k: 128 * k),
    "vocab_size": st.integers(1000, 300_000),
    "max_position_embeddings": st.sampled_from([512, 2048, 4096, 32768, 131072]),
}


def _run(argv: list[str]) -> tuple[int, str, str]:
    """main() with these arguments; (exit code, stdout, stderr). Any other exception fails."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["plan", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


@st.composite
def model_files(draw, odd: bool) -> tuple[str, str]:
    """(file name, text): a model YAML or a config.json; plausible shapes, or (odd) a few
    fields set to values of the wrong type, sign or size."""
    fields = dict(BASE_MODEL)
    for key in draw(st.lists(st.sampled_from(sorted(SHAPES)), max_size=4, unique=True)):
        fields[key] = draw(SHAPES[key])
    heads = fields["num_attention_heads"]
    fields["num_key_value_heads"] = draw(st.sampled_from([k for k in (1, 2, 4, 8, heads) if heads % k == 0]))
    if odd:
        for key in draw(st.lists(st.sampled_from(sorted(BASE_MODEL)), min_size=1, max_size=2, unique=True)):
            fields[key] = draw(ODD)
    extra = {
        "head_dim": st.sampled_from([64, 128, 256]), "gated_mlp": st.booleans(),
        "tie_word_embeddings": st.booleans(), "dtype": st.sampled_from(["bfloat16", "float16", "float32"]),
        "quantization": st.sampled_from([None, "fp8", "int8", "int4"]),
    }
    for key in draw(st.lists(st.sampled_from(sorted(extra)), max_size=2, unique=True)):
        fields[key] = draw(ODD if odd and draw(st.booleans()) else extra[key])
    if draw(st.booleans()):
        fields["num_local_experts"] = draw(st.sampled_from([4, 8, 16]))
        fields["num_experts_per_tok"] = draw(st.sampled_from([1, 2]))
    if draw(st.booleans()):
        return "m.yaml", yaml.safe_dump(fields)
    hf = {k: v for k, v in fields.items() if k not in ("name", "dtype", "quantization", "gated_mlp")}
    hf["model_type"] = draw(st.sampled_from(["llama", "gemma2", "gpt_neox", "newfamily"]
                                            + (["bert", "t5"] if odd else [])))
    hf["torch_dtype"] = draw(st.sampled_from(["bfloat16", "float16"] + ([["bfloat16"], 7] if odd else [])))
    if draw(st.booleans()):
        hf["quantization_config"] = draw(st.sampled_from([
            {"quant_method": "fp8"}, {"quant_method": "awq", "bits": 4, "group_size": 128},
            {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": "int", "num_bits": 4}}}},
        ] + ([{"quant_method": "compressed-tensors", "config_groups": [1]}, "fp8"] if odd else [])))
    if draw(st.booleans()):
        hf = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": hf}
    return "config.json", json.dumps(hf)


@st.composite
def clusters(draw, odd: bool) -> tuple[str | None, str]:
    """(file name or None, text or shorthand)."""
    if draw(st.booleans()):
        nodes = draw(st.integers(1, 16) if not odd else st.sampled_from([0, 4096, 1_000_000, 10**30]))
        per_node = draw(st.sampled_from([1, 2, 4, 8, 16] + ([0, 2000] if odd else [])))
        gpus = ["A100", "H100", "H200", "B200"] + (["L40S", "MI300X"] if odd or nodes == 1 else [])
        gpus += ["A999"] if odd else []
        gpu = draw(st.sampled_from(gpus))
        return None, f"{nodes}x{per_node}x{gpu}"
    profile = dict(BASE_PROFILE)
    profile["num_nodes"] = draw(st.integers(1, 8) if not odd else st.one_of(st.integers(1, 8), ODD))
    profile["gpus_per_node"] = draw(st.sampled_from([1, 2, 4, 8]) if not odd else st.one_of(st.just(8), ODD))
    if draw(st.booleans()):
        bandwidth = st.floats(1, 1000) if not odd else st.one_of(st.floats(1, 1000), ODD)
        profile["intra_node"] = {"kind": "nvlink", "bandwidth_gb_per_s": draw(bandwidth),
                                 "latency_us": draw(st.floats(0.1, 10))}
    return "c.yaml", yaml.safe_dump(profile)


def _flag(name: str, values, odd: bool = False) -> st.SearchStrategy[list[str]]:
    """Absent half the time; `odd`: the value may also be 0, negative, nan, inf, huge, text."""
    if odd:
        values = st.one_of(values, ODD_NUMBER)
    return st.one_of(st.just([]), values.map(lambda v: [name, str(v)]))


def serve_flags(odd: bool) -> st.SearchStrategy[list[str]]:
    return st.tuples(
        _flag("--input-len", st.integers(1, 2048), odd), _flag("--output-len", st.integers(1, 1024), odd),
        _flag("--batch", st.integers(1, 2048), odd), _flag("--max-model-len", st.integers(1, 8192), odd),
        _flag("--max-num-batched-tokens", st.integers(1, 16384) if odd else st.integers(2048, 16384), odd),
        _flag("--gpu-memory-utilization", st.sampled_from(["0.5", "0.9", "1"] + (["0", "nan", "-1"] if odd else []))),
        _flag("--max-tpot-ms", st.sampled_from(["5", "50", "500"] + (["0", "nan", "inf", "-3"] if odd else []))),
        _flag("--kv-cache-dtype", st.sampled_from(["auto", "fp8"])),
        _flag("--moe-backend", st.sampled_from(["auto", "marlin", "flashinfer_mxfp8"])),
        _flag("--all2all-backend", st.sampled_from(["allgather_reducescatter", "deepep_low_latency",
                                                    "deepep_high_throughput"])),
        st.sampled_from([[], ["--enable-dbo"]]),
        st.sampled_from([[], ["--async-scheduling"], ["--no-async-scheduling"]]),
        _flag("--prompt-tokenizer", st.sampled_from(["auto", "serial", "microbatch", "none"] + (["text"] if odd else []))),
        _flag("--renderer-num-workers", st.integers(1, 4), odd),
        _flag("--quantization", st.sampled_from(["none", "fp8", "int4"])),
        _flag("--objective", st.sampled_from(["throughput", "latency"])),
        _flag("--layout", st.sampled_from(["tp=2", "pp=2", "tp=8,pp=2", "tp=1,pp=1"] + (["tp=3", "dp=0"] if odd else []))),
        _flag("--gpus", st.sampled_from(["1", "2", "3", "8"] + (["0"] if odd else []))),
        _flag("--zero", st.just(1)) if odd else st.just([]),  # a training flag: refused with serving
    ).map(lambda parts: [a for part in parts for a in part])


def train_flags(odd: bool) -> st.SearchStrategy[list[str]]:
    def required(name: str, values) -> st.SearchStrategy[list[str]]:
        values = st.one_of(values, ODD_NUMBER) if odd else values
        return values.map(lambda v: [name, str(v)])

    return st.tuples(
        st.just(["--workload", "train"]),
        required("--global-batch", st.integers(1, 1024)), required("--seq-len", st.integers(1, 4096)),
        _flag("--micro-batch", st.integers(1, 16), odd),
        _flag("--schedule", st.sampled_from(["gpipe", "1f1b", "interleaved"])),
        _flag("--virtual-stages", st.sampled_from(["2", "3"] + (["0", "1"] if odd else []))) if odd else st.just([]),
        _flag("--recompute", st.sampled_from(["none", "selective", "full"])),
        _flag("--zero", st.sampled_from(["0", "1", "3"] + (["4"] if odd else []))),
        _flag("--layout", st.sampled_from(["tp=2", "pp=2", "dp=8", "tp=1,pp=1"] + (["tp=3"] if odd else []))),
        _flag("--batch", st.just(4)) if odd else st.just([]),  # a serving flag: refused with training
    ).map(lambda parts: [a for part in parts for a in part])


def _numbers_in(value: Any, path: str = "") -> list[tuple[str, float]]:
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _numbers_in(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [item for i, v in enumerate(value) for item in _numbers_in(v, f"{path}[{i}]")]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [(path, value)]
    return []


def _check(argv: list[str]) -> tuple[int, Any]:
    code, out, err = _run(argv)
    assert code in (0, 1, 2), (code, argv, err[-2000:])
    assert "Traceback" not in err, err
    if code == 2:
        assert out == "", (argv, out[:500])
        assert len(err.splitlines()) == 1 and err.strip(), (argv, err)
        return code, None
    if "--json" not in argv:
        return code, None
    payload = json.loads(out)
    for where, number in _numbers_in(payload):
        assert math.isfinite(number) and number >= 0, (where, number, argv)
    for layout in payload.get("layouts", []):
        assert layout["memory_per_gpu_bytes"] <= layout["capacity_per_gpu_bytes"], (layout, argv)
    return code, payload


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(directory: Path, name: str, text: str, tag: str) -> str:
    path = directory / tag / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@FUZZ
@given(model=model_files(odd=False), cluster=clusters(odd=False),
       flags=st.one_of(serve_flags(odd=False), train_flags(odd=False)),
       top=_flag("--top", st.sampled_from(["1", "3"])))
def test_plausible_inputs_plan_sanely(spec_dir: Path, model, cluster, flags, top) -> None:
    """Plausible specs and flags: mostly plans (0) or nothing fits (1), each checked."""
    model_path = _write(spec_dir, *model, "model")
    cluster_arg = cluster[1] if cluster[0] is None else _write(spec_dir, *cluster, "cluster")
    _check(["--model", model_path, "--cluster", cluster_arg, "--json", *top, *flags])


@FUZZ
@given(model=model_files(odd=True), cluster=clusters(odd=True),
       flags=st.one_of(serve_flags(odd=True), train_flags(odd=True)),
       top=_flag("--top", st.sampled_from(["1", "0", "-1"])))
def test_odd_inputs_never_crash(spec_dir: Path, model, cluster, flags, top) -> None:
    """Wrong types, signs and sizes anywhere: 0, 1 or 2, never a traceback or a hang."""
    model_path = _write(spec_dir, *model, "model")
    cluster_arg = cluster[1] if cluster[0] is None else _write(spec_dir, *cluster, "cluster")
    _check(["--model", model_path, "--cluster", cluster_arg, "--json", *top, *flags])


@FUZZ
@given(model=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "gpt3-175b"]),
       cluster=st.sampled_from(["1x1xH100", "1x8xA100", "2x8xH100", "1x4xL40S", "3x8xH100"]),
       flags=st.one_of(serve_flags(odd=True), train_flags(odd=True)))
def test_shipped_models_under_odd_flags(model, cluster, flags) -> None:
    code, payload = _check(["--model", model, "--cluster", cluster, "--json", *flags])
    if code == 0:
        assert payload["recommended"] == payload["layouts"][0]


@FUZZ
@given(stages=st.integers(-1, 300), micro_batches=st.integers(-1, 3000),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]),
       extra=st.sampled_from([[], ["--virtual-stages", "3"], ["--forward-only"], ["--virtual-stages", "0"]]))
def test_timeline_only_never_hangs_or_crashes(stages, micro_batches, schedule, extra) -> None:
    _check(["explain", "--timeline-only", "--json", "--schedule", schedule, "--stages", str(stages),
            "--micro-batches", str(micro_batches), *extra])


@settings(FUZZ, max_examples=max(EXAMPLES // 4, 5))
@given(model=model_files(odd=False), cluster=clusters(odd=False),
       flags=st.one_of(serve_flags(odd=False), train_flags(odd=False)))
def test_explain_plausible_inputs(spec_dir: Path, model, cluster, flags) -> None:
    """plan explain on the same inputs: 0, 1 (nothing fits, as plan) or 2, sane JSON."""
    model_path = _write(spec_dir, *model, "model")
    cluster_arg = cluster[1] if cluster[0] is None else _write(spec_dir, *cluster, "cluster")
    _check(["explain", "--no-sensitivity", "--model", model_path, "--cluster", cluster_arg, "--json", *flags])
