"""Typed, validated specs: the model, the GPU, the links and the cluster.

File keys carry human units (GiB, GB/s, Gb/s, us, TFLOP/s); each schema converts
them to SI once, in a property whose name carries the unit. Every user mistake
becomes a `SpecError` whose message is one line: `file: field: problem`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from planner import units
from planner.errors import SpecError

Dtype = Literal["float32", "float16", "bfloat16"]
Quantization = Literal["fp8", "int8", "int4"]
IntraKind = Literal["nvlink", "pcie", "xgmi"]
InterKind = Literal["infiniband", "roce", "ethernet"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Spec):
    """A decoder-only transformer. Field names follow Hugging Face config.json."""

    name: str
    source: str | None = None
    """Where the numbers come from (model card, config.json URL, paper)."""
    num_hidden_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = None
    """Grouped-query attention KV heads; defaults to num_attention_heads (MHA)."""
    head_dim: PositiveInt | None = None
    """Defaults to hidden_size / num_attention_heads."""
    intermediate_size: PositiveInt
    """FFN hidden size of the dense MLP (of each expert for MoE unless moe_intermediate_size)."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with 3 matrices; false = GPT-style 2 matrices."""
    vocab_size: PositiveInt
    max_position_embeddings: PositiveInt
    tie_word_embeddings: bool = False
    dtype: Dtype = "bfloat16"
    quantization: Quantization | None = None
    """Weight-only quantization of the transformer-block linear layers."""
    quantization_group_size: PositiveInt = 128
    """int4 (AWQ/GPTQ) weights per scale group."""
    attention_bias: bool = False
    """Biases on q, k, v and o projections (GPT-style)."""
    qkv_bias: bool = False
    """Biases on q, k, v only (Qwen2-style)."""
    mlp_bias: bool = False
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    position_embedding: Literal["rope", "learned"] = "rope"
    rope_theta: PositiveFloat = 10000.0
    """RoPE base frequency (config.json rope_theta); 10000 is the RoPE paper's and Megatron's default."""
    num_local_experts: PositiveInt | None = None
    num_experts_per_tok: PositiveInt | None = None
    moe_intermediate_size: PositiveInt | None = None
    num_shared_experts: NonNegativeInt = 0

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("num_key_value_heads") is None and "num_attention_heads" in data:
            data["num_key_value_heads"] = data["num_attention_heads"]
        hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
        if (
            data.get("head_dim") is None
            and isinstance(hidden, int)
            and isinstance(heads, int)
            and heads > 0
            and hidden % heads == 0
        ):
            data["head_dim"] = hidden // heads
        return data

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.head_dim is None:
            raise ValueError(
                f"head_dim: required because hidden_size {self.hidden_size} is not divisible "
                f"by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        experts = (self.num_local_experts, self.num_experts_per_tok)
        if (experts[0] is None) != (experts[1] is None):
            raise ValueError(
                "num_experts_per_tok: MoE needs both num_local_experts and num_experts_per_tok"
            )
        if self.is_moe and self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok: {self.num_experts_per_tok} exceeds "
                f"num_local_experts {self.num_local_experts}"
            )
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts is not None

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size


class PeakTflops(_Spec):
    """Dense (no sparsity) datasheet peaks, TFLOP/s (int8: TOPS). None = unknown."""

    fp32: PositiveFloat | None = None
    tf32: PositiveFloat | None = None
    bf16: PositiveFloat | None = None
    fp16: PositiveFloat | None = None
    fp8: PositiveFloat | None = None
    int8: PositiveFloat | None = None
    fp4: PositiveFloat | None = None


class AchievableTflops(_Spec):
    """Measured maximum achievable dense matmul, TFLOP/s. None = not measured."""

    bf16: PositiveFloat | None = None
    fp16: PositiveFloat | None = None
    fp8: PositiveFloat | None = None


class IntraNodeLink(_Spec):
    """GPU-to-GPU fabric inside a node, per GPU, one direction."""

    kind: IntraKind
    bandwidth_gb_per_s: PositiveFloat
    latency_us: PositiveFloat

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.bandwidth_gb_per_s)

    @property
    def latency_seconds(self) -> float:
        return units.us_to_seconds(self.latency_us)


class InterNodeLink(_Spec):
    """Node networking: NICs per node, each NIC's line rate (Gb/s), one direction."""

    kind: InterKind
    num_nics_per_node: PositiveInt
    nic_bandwidth_gbit_per_s: PositiveFloat
    latency_us: PositiveFloat

    @property
    def node_bandwidth_bytes_per_s(self) -> float:
        return self.num_nics_per_node * units.gbit_per_s_to_bytes_per_s(
            self.nic_bandwidth_gbit_per_s
        )

    @property
    def latency_seconds(self) -> float:
        return units.us_to_seconds(self.latency_us)


class GPU(_Spec):
    """One accelerator model: memory, HBM bandwidth, peaks, typical fabric."""

    name: str
    aliases: list[str] = Field(default_factory=list)
    source: str | None = None
    memory_gib: PositiveFloat
    """Total device memory as the driver reports it (what vLLM's fraction applies to)."""
    hbm_bandwidth_gb_per_s: PositiveFloat
    peak_tflops: PeakTflops
    achievable_matmul_tflops: AchievableTflops = Field(default_factory=AchievableTflops)
    intra_node: IntraNodeLink | None = None
    """Typical fabric of a node built from this GPU."""
    inter_node: InterNodeLink | None = None
    """Typical networking of such a node."""
    typical_gpus_per_node: PositiveInt = 8
    """The node size the typical inter_node figures describe."""

    @property
    def memory_bytes(self) -> int:
        return units.gib_to_bytes(self.memory_gib)

    @property
    def hbm_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.hbm_bandwidth_gb_per_s)

    def peak_flops_per_s(self, precision: str) -> float | None:
        tflops = getattr(self.peak_tflops, precision)
        return None if tflops is None else units.tflops_to_flops_per_s(tflops)

    def achievable_flops_per_s(self, precision: str) -> float | None:
        tflops = getattr(self.achievable_matmul_tflops, precision, None)
        return None if tflops is None else units.tflops_to_flops_per_s(tflops)


class AllreduceCurve(_Spec):
    """Measured all-reduce medians for one link class and group size (from `plan probe`)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    link: Literal["intra_node", "inter_node", "world"]
    num_ranks: PositiveInt
    sizes_bytes: list[PositiveInt]
    median_seconds: list[PositiveFloat]

    @model_validator(mode="after")
    def _same_length(self) -> AllreduceCurve:
        if len(self.sizes_bytes) != len(self.median_seconds) or not self.sizes_bytes:
            raise ValueError("sizes_bytes and median_seconds must be non-empty and equally long")
        if list(self.sizes_bytes) != sorted(set(self.sizes_bytes)):
            raise ValueError("sizes_bytes must be strictly increasing")
        return self


class Measured(_Spec):
    """What `plan probe` measured; free-form except the curves the planner reads."""

    model_config = ConfigDict(extra="allow", frozen=True)
    date: str | None = None
    backend: str | None = None
    flags: list[str] = Field(default_factory=list)
    allreduce_curves: list[AllreduceCurve] = Field(default_factory=list)


class ClusterSpec(_Spec):
    """A homogeneous cluster: num_nodes x gpus_per_node of one GPU."""

    name: str
    source: str | None = None
    num_nodes: PositiveInt
    gpus_per_node: PositiveInt
    gpu: GPU
    intra_node: IntraNodeLink | None = None
    inter_node: InterNodeLink | None = None
    measured: Measured | None = None

    @field_validator("gpu", mode="before")
    @classmethod
    def _resolve_gpu(cls, value: Any, info: ValidationInfo) -> Any:
        """A GPU given by name is looked up by the resolver the loader passes in the
        validation context (the catalog's), so this schema never imports the catalog."""
        if isinstance(value, str):
            resolve = (info.context or {}).get("resolve_gpu")
            if resolve is None:
                raise ValueError("a GPU name needs the GPU catalog: load the profile with planner.catalog")
            return resolve(value)
        return value

    @model_validator(mode="after")
    def _links_present(self) -> ClusterSpec:
        if self.gpus_per_node > 1 and self.intra_node is None:
            raise ValueError("intra_node: required when gpus_per_node > 1")
        if self.num_nodes > 1 and self.inter_node is None:
            raise ValueError("inter_node: required when num_nodes > 1")
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def inter_node_bandwidth_bytes_per_s_per_gpu(self) -> float:
        """A node's NIC bandwidth shared by all its GPUs when they all cross at once."""
        assert self.inter_node is not None
        return self.inter_node.node_bandwidth_bytes_per_s / self.gpus_per_node

    def allreduce_curve(self, link: str, num_ranks: int) -> AllreduceCurve | None:
        if self.measured is None:
            return None
        for curve in self.measured.allreduce_curves:
            if curve.link == link and curve.num_ranks == num_ranks:
                return curve
        return None


def format_validation_error(origin: str, error: ValidationError) -> str:
    """One line: origin: field: problem (the first error; pydantic lists the rest)."""
    first = error.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(top level)"
    kind = first["type"]
    if kind == "extra_forbidden":
        problem = "unknown field"
    elif kind == "missing":
        problem = "missing required field"
    else:
        problem = first["msg"].removeprefix("Value error, ")
        if "input" in first and not isinstance(first["input"], dict | list):
            problem += f" (got {first['input']!r})"
    if kind == "value_error" and ":" in problem and loc == "(top level)":
        return f"{origin}: {problem}"
    more = len(error.errors()) - 1
    suffix = f" (+{more} more)" if more else ""
    return f"{origin}: {loc}: {problem}{suffix}"


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Safe-load a YAML file whose top level must be a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc.__class__.__name__}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(parse)"
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise SpecError(f"{path}: {where}: malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: (top level): expected a mapping of fields")
    return data


def validate(schema: type[_Spec], data: dict[str, Any], origin: str,
             context: dict[str, Any] | None = None) -> Any:
    try:
        return schema.model_validate(data, context=context)
    except ValidationError as exc:
        raise SpecError(format_validation_error(origin, exc)) from None
    except SpecError as exc:  # raised by nested resolution (unknown GPU name)
        raise SpecError(f"{origin}: {exc}") from None


def load_model(path: Path) -> ModelSpec:
    return validate(ModelSpec, read_yaml_mapping(path), str(path))


def load_cluster(path: Path, resolve_gpu: Callable[[str], GPU] | None = None) -> ClusterSpec:
    """A hardware profile; `resolve_gpu` turns a `gpu: NAME` into the catalog's GPU
    (planner.catalog.load_cluster passes its own)."""
    context = None if resolve_gpu is None else {"resolve_gpu": resolve_gpu}
    return validate(ClusterSpec, read_yaml_mapping(path), str(path), context)
