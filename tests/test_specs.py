"""Every shipped spec loads; the schemas convert human units to SI once; loader errors are
one line naming the file and the field. (The CLI paths are in test_cli_errors.py.)"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from planner.catalog import HARDWARE_PROFILES_DIR, MODEL_SPECS_DIR, load_cluster, resolve_gpu
from planner.specs import (
    ClusterSpec,
    InterNodeLink,
    IntraNodeLink,
    ModelSpec,
    SpecError,
    load_model,
)

MODEL_FILES = sorted(MODEL_SPECS_DIR.glob("*.yaml"))
PROFILE_FILES = sorted(HARDWARE_PROFILES_DIR.glob("*.yaml"))

TINY_FIELDS = {
    "name": "tiny",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
}


def test_shipped_files_exist() -> None:
    assert len(MODEL_FILES) >= 9 and len(PROFILE_FILES) >= 10


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_every_shipped_model_loads(path: Path) -> None:
    model = load_model(path)
    assert model.name == path.stem
    assert model.source, "each shipped file states where its numbers come from"
    assert model.head_dim * model.num_attention_heads >= 1


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_shipped_profile_loads(path: Path) -> None:
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    assert cluster.source
    assert cluster.num_gpus == cluster.num_nodes * cluster.gpus_per_node
    assert path.stem.startswith(f"{cluster.num_nodes}x{cluster.gpus_per_node}x")


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    """64 / 8 = 8; KV heads default to the attention heads (MHA)."""
    fields = {k: v for k, v in TINY_FIELDS.items() if k != "num_key_value_heads"}
    model = ModelSpec(**fields)
    assert model.head_dim == 8
    assert model.num_key_value_heads == 8


def test_explicit_head_dim_allows_non_dividing_heads() -> None:
    model = ModelSpec(
        **{**TINY_FIELDS, "num_attention_heads": 6, "head_dim": 16, "num_key_value_heads": 3}
    )
    assert model.head_dim == 16


def test_sliding_window_defaults_to_every_layer() -> None:
    """Mistral-7B v0.1 style: a window and no layer count = every layer; none = no window."""
    assert ModelSpec(**TINY_FIELDS, sliding_window=64).num_window_layers == 2
    assert ModelSpec(**TINY_FIELDS, sliding_window=64, num_sliding_window_layers=1).num_window_layers == 1
    assert ModelSpec(**TINY_FIELDS).num_window_layers == 0


def test_specs_are_frozen() -> None:
    model = ModelSpec(**TINY_FIELDS)
    with pytest.raises(ValueError):
        model.hidden_size = 1  # type: ignore[misc]


@pytest.mark.parametrize(("value", "text"), [
    (2990.4, "2,990"), (1e6, "1,000,000"), (21.23, "21.2"), (0.0015312, "0.00153"), (1.59e-61, "under 0.001"),
    (0.0, "0"), (99.96, "100"), (0.5, "0.5"), (-21.23, "-21.2"), (float("inf"), "inf"),
])
def test_plain_numbers_never_take_an_exponent(value: float, text: str) -> None:
    """Rates and counts in the plan's prose: "asks 1e+03 req/s", "takes up to 2.99e+03 req/s"
    and "1.59e-61 waiting" (found by a CLI sweep) read 1,000, 2,990 and under 0.001."""
    from planner.units import plain

    assert plain(value) == text
    assert "e" not in plain(value).replace("under", "") or math.isinf(value)


@pytest.mark.parametrize(("count", "text"), [(0.5, "0.5"), (1.0, "1"), (1.38, "1.4"), (6.78, "6.8"), (7.0, "7"),
                                           (35.2, "35"), (1234.0, "1234"), (9.96, "10"), (6.96, "7"),
                                           (0.04, "0.0")])
def test_mean_sequences_keep_a_tenth_below_ten(count: float, text: str) -> None:
    """A decode rank's mean load: a rank loaded to 1.38 sequences printed as 1 in the C_d column
    beside a launch cap of 2; a tenth below ten, whole from ten and where whole."""
    from planner.units import sequences

    assert sequences(count) == text


def test_plural_and_small_counts() -> None:
    """One of a thing is singular ("1 more GPUs" and "1 layouts rejected" were printed); a count
    below one keeps its first digits (a plan printed 0.15 tok/s as 0)."""
    from planner.render.common import count
    from planner.units import plural

    assert [plural(1, "layout"), plural(2, "layout"), plural(1, "PP boundary", "PP boundaries"),
            plural(3, "PP boundary", "PP boundaries"), plural(2048, "more GPU")] == [
        "1 layout", "2 layouts", "1 PP boundary", "3 PP boundaries", "2,048 more GPUs"]
    assert [count(0.153), count(0.0), count(1.4), count(12_345.6)] == ["0.153", "0", "1", "12,346"]


def test_units_converted_once_to_si() -> None:
    """NVLink 300 GB/s = 3e11 B/s; 1 us = 1e-6 s; 8 NICs x 200 Gb/s = 1.6e12 b/s = 2e11 B/s
    per node, 2.5e10 B/s per GPU of an 8-GPU node; 80 GiB = 85,899,345,920 B."""
    intra = IntraNodeLink(kind="nvlink", bandwidth_gb_per_s=300, latency_us=1)
    inter = InterNodeLink(
        kind="infiniband", num_nics_per_node=8, nic_bandwidth_gbit_per_s=200, latency_us=5
    )
    assert intra.bandwidth_bytes_per_s == pytest.approx(3e11)
    assert intra.latency_seconds == pytest.approx(1e-6)
    assert inter.node_bandwidth_bytes_per_s == pytest.approx(2e11)
    assert inter.latency_seconds == pytest.approx(5e-6)
    gpu = resolve_gpu("A100")
    assert gpu.memory_bytes == 85_899_345_920
    assert gpu.hbm_bytes_per_s == pytest.approx(2.039e12)
    assert gpu.peak_flops_per_s("bf16") == pytest.approx(312e12)
    assert gpu.peak_flops_per_s("fp8") is None  # A100 has no fp8: unknown stays unknown
    cluster = ClusterSpec(
        name="c", num_nodes=2, gpus_per_node=8, gpu=gpu, intra_node=intra, inter_node=inter
    )
    assert cluster.gpu == gpu
    assert cluster.inter_node_bandwidth_bytes_per_s_per_gpu == pytest.approx(2.5e10)


def test_inline_gpu_mapping(tmp_path: Path) -> None:
    path = tmp_path / "inline.yaml"
    path.write_text(
        "name: inline\nnum_nodes: 1\ngpus_per_node: 1\n"
        "gpu: {name: X1, memory_gib: 10, hbm_bandwidth_gb_per_s: 100, peak_tflops: {bf16: 50}}\n"
    )
    cluster = load_cluster(path)
    assert cluster.gpu.name == "X1"
    assert cluster.gpu.peak_flops_per_s("fp16") is None


def test_single_node_profile_may_omit_inter_node(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(
        "name: one\nnum_nodes: 1\ngpus_per_node: 2\ngpu: H100\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\n"
    )
    assert load_cluster(path).inter_node is None


def test_profile_alltoall_curves_are_found_by_link_and_group_size(tmp_path: Path) -> None:
    path = tmp_path / "measured.yaml"
    path.write_text(
        "name: m\nnum_nodes: 1\ngpus_per_node: 4\ngpu: H100\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\n"
        "measured:\n"
        "  allreduce_curves:\n"
        "  - {link: intra_node, num_ranks: 4, sizes_bytes: [8, 1024], median_seconds: [1.0e-5, 2.0e-5]}\n"
        "  alltoall_curves:\n"
        "  - {link: intra_node, num_ranks: 4, sizes_bytes: [8, 1024], median_seconds: [3.0e-5, 4.0e-5]}\n"
    )
    cluster = load_cluster(path)
    curve = cluster.alltoall_curve("intra_node", 4)
    assert curve is not None and curve.median_seconds == [3.0e-5, 4.0e-5]
    assert cluster.allreduce_curve("intra_node", 4).median_seconds == [1.0e-5, 2.0e-5]
    assert cluster.alltoall_curve("intra_node", 2) is None
    assert cluster.alltoall_curve("inter_node", 4) is None


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("hidden_size: [1\n", "malformed YAML"),
        ("- 1\n- 2\n", "(top level)"),
        ("", "(top level)"),
        ("!!python/object/apply:os.system ['true']\n", "malformed YAML"),  # safe loader only
    ],
)
def test_loader_errors_are_one_line(tmp_path: Path, text: str, field: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path)) and field in message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"bogus": 1}, "bogus: unknown field"),
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": "wide"}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"num_attention_heads": 6}, "head_dim"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"dtype": "float64"}, "dtype"),
        ({"quantization": "int3"}, "quantization"),
        ({"num_local_experts": 8}, "num_experts_per_tok"),
        ({"num_local_experts": 2, "num_experts_per_tok": 4}, "num_experts_per_tok"),
        ({"sliding_window": 0}, "sliding_window: must be at least 1"),
        ({"sliding_window": "128"}, "sliding_window: must be an integer"),
        ({"num_sliding_window_layers": 1}, "num_sliding_window_layers: 1 sliding-window layers need sliding_window"),
        ({"sliding_window": 128, "num_sliding_window_layers": 3}, "num_sliding_window_layers: 3 exceeds"),
    ],
)
def test_model_field_errors_name_file_and_field(tmp_path: Path, change: dict, field: str) -> None:
    import yaml

    fields = {k: v for k, v in {**TINY_FIELDS, **change}.items() if v is not None}
    path = _write(tmp_path, yaml.safe_dump(fields))
    with pytest.raises(SpecError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ") and field in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_cluster(tmp_path / "absent.yaml")


def test_unknown_gpu_in_profile(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: c\nnum_nodes: 1\ngpus_per_node: 1\ngpu: Z80\n")
    with pytest.raises(SpecError) as info:
        load_cluster(path)
    assert str(info.value).startswith(f"{path}: gpu: unknown GPU 'Z80'")


TINY_YAML = "".join(f"{key}: {value}\n" for key, value in TINY_FIELDS.items())


@pytest.mark.parametrize(("line", "read_as"), [
    ("num_hidden_layers: 032", 32),  # YAML 1.1: octal 26
    ("num_hidden_layers: 0o40", 32),
    ("num_hidden_layers: 0x20", 32),
    ("num_hidden_layers: 3_2", 32),
])
def test_integers_read_as_yaml_1_2_does(tmp_path: Path, line: str, read_as: int) -> None:
    """Leading zeros are decimal (PyYAML's YAML 1.1 made `032` octal 26 and planned 26 layers);
    0o and 0x keep their bases."""
    path = _write(tmp_path, TINY_YAML.replace("num_hidden_layers: 2\n", "") + line + "\n")
    assert load_model(path).num_hidden_layers == read_as


@pytest.mark.parametrize(("line", "field"), [
    ("gated_mlp: yes", "gated_mlp: must be true or false (got 'yes')"),
    ("gated_mlp: off", "gated_mlp: must be true or false (got 'off')"),
    ("hidden_size: 1:04", "hidden_size: must be an integer (got '1:04')"),  # YAML 1.1: sexagesimal 64
])
def test_yaml_1_1_booleans_and_sexagesimals_are_not_read_as_values(tmp_path: Path, line: str, field: str) -> None:
    key = line.split(":")[0]
    text = "".join(f"{k}: {v}\n" for k, v in TINY_FIELDS.items() if k != key) + line + "\n"
    path = _write(tmp_path, text)
    with pytest.raises(SpecError, match=re.escape(field)):
        load_model(path)


def test_an_moe_model_without_an_moe_layer_is_refused(tmp_path: Path) -> None:
    """num_dense_layers equal to num_hidden_layers left no MoE layer (training divided by zero)."""
    text = TINY_YAML + "num_local_experts: 4\nnum_experts_per_tok: 2\nnum_dense_layers: 2\n"
    with pytest.raises(SpecError, match="num_dense_layers: 2 of 2 layers leaves no MoE layer"):
        load_model(_write(tmp_path, text))


def test_computed_once_keeps_a_derived_value_on_its_spec() -> None:
    """specs.computed_once: compute(spec, *args) runs once per spec instance and arguments; a
    copy with a field changed is a new instance and computes its own (never a stale value)."""
    from planner.catalog import resolve_model
    from planner.cost.params import param_counts
    from planner.specs import computed_once

    calls: list[tuple[str, int]] = []

    @computed_once
    def heads_per_gpu(model: ModelSpec, tp: int) -> int:
        calls.append((model.name, tp))
        return model.num_attention_heads // tp

    model = resolve_model("llama-3.1-70b")
    assert heads_per_gpu(model, 8) == 64 // 8 and heads_per_gpu(model, 8) == 8
    assert heads_per_gpu(model, 4) == 16
    assert calls == [("llama-3.1-70b", 8), ("llama-3.1-70b", 4)]
    wider = model.model_copy(update={"num_attention_heads": 128})
    assert heads_per_gpu(wider, 8) == 16 and len(calls) == 3
    assert heads_per_gpu(model, 8) == 8 and len(calls) == 3
    # the parameter counts follow the copy too: 80 more layers of the same block
    deeper = model.model_copy(update={"num_hidden_layers": 160})
    assert param_counts(deeper).total - param_counts(model).total == 80 * param_counts(model).per_layer


def test_specs_pickle_and_come_back_equal() -> None:
    """A spec crosses a process boundary (parallel.map_in_workers returns results pickled):
    the same fields come back, and its derived values (computed_once) are recomputed there."""
    import pickle

    from planner.catalog import resolve_cluster, resolve_model
    from planner.cost.params import param_counts

    model = resolve_model("deepseek-v3")
    counts = param_counts(model)  # a derived value on the instance: not pickled with it
    back = pickle.loads(pickle.dumps(model))
    assert back == model and back is not model
    assert param_counts(back) == counts
    cluster = resolve_cluster("2x8xH100")
    assert pickle.loads(pickle.dumps(cluster)) == cluster


@pytest.mark.parametrize(("sizes", "seconds", "ok"), [
    ("[1024, 1000000000]", "[0.01, 0.00001]", False),  # 1 GB in 10 us: 1e14 B/s
    ("[1024, 1000000000]", "[0.01, 0.0001]", True),  # 1 GB in 100 us: 1e13 B/s, at the bound
    ("[1024, 1048576]", "[2.0e-5, 1.0e-5]", True),  # a dip (NCCL protocol switch): taken as measured
])
def test_a_curve_faster_than_any_link_is_refused(tmp_path: Path, sizes: str, seconds: str, ok: bool) -> None:
    """A measured curve claiming more than MAX_PLAUSIBLE_CURVE_BYTES_PER_S (10 TB/s) at some
    size is not a measurement: the profile with 1 GB in 10 us moved Llama-3.1-70B's TPOT from
    51.2 to 40.3 ms and was accepted. Dips within the bound stay (real curves have them)."""
    path = tmp_path / "measured.yaml"
    path.write_text(
        "name: m\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\n"
        "measured:\n"
        "  allreduce_curves:\n"
        f"  - {{link: intra_node, num_ranks: 8, sizes_bytes: {sizes}, median_seconds: {seconds}}}\n"
    )
    if ok:
        assert load_cluster(path).allreduce_curve("intra_node", 8) is not None
    else:
        with pytest.raises(SpecError, match=r"measured\.allreduce_curves\.0: .* above any link"):
            load_cluster(path)
