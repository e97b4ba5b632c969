"""Import a ModelOpt MIXED_PRECISION checkpoint's per-module formats as ModelSpec fields.

`quantized_layers` (in hf_quant_config.json or quantization_config) maps module names to a
quant_algo; a module it does not name is unquantized (model dtype). The planner models one
format per matmul kind of a block (cost/params.py matmul_formats_by_kind): `quantization`
over quantization_scope (all | mlp | experts), secondary_quantization over the other block
matmuls, plus the LM head's own format. Each module is classed by kind: attention,
recurrent mixer projections (Mamba2 in/out_proj, Gated DeltaNet linear_attn), dense MLP,
routed experts, shared experts, lm_head. A map that does not fit (a kind in two formats, a
kind quantized in some layers and not others, attention and recurrent projections apart,
the dense and shared MLPs apart) is refused in one line naming why.

Small projections left out of the map (Gated DeltaNet's in_proj_a / in_proj_b, h*n_v each)
are counted in their kind's format. Multi-token-prediction modules (`mtp*`) are not in the
parameter total and are skipped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from planner.cost.params import num_attention_layers, num_dense_mlp_layers
from planner.specs import ModelSpec, SpecError

MIXED_LAYERS_FIELD = "_modelopt_quantized_layers"
"""Key under which the importer carries (quantized_layers, where) until the spec's layer
counts are known; never a ModelSpec field."""

ALGO_FORMATS = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "MXFP8": "mxfp8",
                "MXFP4": "mxfp4"}
"""ModelOpt per-module quant_algo -> stored weight format. W4A16_NVFP4 stores NVFP4 weights
and computes in the activation dtype: the same bytes as NVFP4 (cost/serving_time.matmul_precision
runs fp4 GEMMs only for an NVFP4 format that covers every block matmul, so these stay 16-bit)."""
WEIGHT_ONLY_ALGOS = {"W4A16_NVFP4"}
KIND_PATTERNS = (
    ("lm_head", re.compile(r"(^|\.)lm_head$")),
    ("shared experts", re.compile(r"\.shared_experts?\.")),
    ("routed experts", re.compile(r"\.experts(\.|$)")),
    ("recurrent projections", re.compile(r"\.(linear_attn\.\w+|mixer\.(in_proj|out_proj))$")),
    ("attention", re.compile(r"\.(self_attn|attention|attn)\.\w+$|\.mixer\.[qkvo]_proj$")),
    ("dense MLP", re.compile(r"\.(mlp|feed_forward|mixer)\.(gate_proj|up_proj|down_proj)$")),
    ("latent projections", re.compile(r"\.fc[12]_latent_proj$")),
)
"""Module name -> kind, first match wins (experts before the dense MLP they resemble)."""
LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


def mixed_precision_layers(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The fields to carry for a MIXED_PRECISION config: its quantized_layers (a mapping, or
    ModelOpt's stringified one in config.json) and where it was read."""
    layers = config.get("quantized_layers")
    if isinstance(layers, str):
        try:
            layers = ast.literal_eval(layers)
        except (ValueError, SyntaxError):
            raise SpecError(f"{path}: quantized_layers: unreadable per-module map") from None
    if not isinstance(layers, dict) or not layers:
        raise SpecError(f"{path}: quant_algo: MIXED_PRECISION without a quantized_layers map "
                        f"is not supported")
    return {MIXED_LAYERS_FIELD: (layers, str(path))}


def module_formats(layers: dict[str, Any], where: str) -> dict[str, dict[int, str]]:
    """kind -> {layer index (-1 outside layers) -> weight format}; a kind in two formats
    within one layer is refused."""
    kinds: dict[str, dict[int, str]] = {}
    for name, spec in layers.items():
        if str(name).startswith("mtp"):
            continue
        algo = spec.get("quant_algo") if isinstance(spec, dict) else None
        if algo not in ALGO_FORMATS:
            raise SpecError(f"{where}: quantized_layers.{name}: unsupported ModelOpt algorithm "
                            f"{algo!r} (supported: {', '.join(ALGO_FORMATS)})")
        kind = next((kind for kind, pattern in KIND_PATTERNS if pattern.search(str(name))), None)
        if kind is None:
            raise SpecError(f"{where}: quantized_layers.{name}: a module of no modelled kind")
        index = LAYER_INDEX.search(str(name))
        per_layer = kinds.setdefault(kind, {})
        layer = int(index.group(1)) if index else -1
        if per_layer.setdefault(layer, algo) != algo:
            raise SpecError(f"{where}: quantized_layers: {kind} of layer {layer} in {per_layer[layer]} "
                            f"and {algo}: two formats in one kind are not modelled")
    return kinds


def expected_layers(model: ModelSpec) -> dict[str, int]:
    """How many layers hold each kind (the LM head: 1 when untied)."""
    moe = model.num_moe_layers if model.is_moe else 0
    return {"attention": num_attention_layers(model), "recurrent projections": model.num_recurrent_layers,
            "dense MLP": num_dense_mlp_layers(model), "routed experts": moe,
            "shared experts": moe if model.num_shared_experts else 0,
            "latent projections": moe if model.moe_latent_size else 0,
            "lm_head": 0 if model.tie_word_embeddings else 1}


def kind_algos(model: ModelSpec, layers: dict[str, Any], where: str) -> dict[str, str | None]:
    """Each kind the model has -> its one quant_algo (None: unquantized); a kind quantized in
    some of its layers only is refused."""
    found, algos = module_formats(layers, where), {}
    for kind, count in expected_layers(model).items():
        per_layer = found.pop(kind, {})
        if count == 0:
            continue
        names = sorted(set(per_layer.values()))
        if len(names) > 1:
            raise SpecError(f"{where}: quantized_layers: {kind} in {' and '.join(names)}: two "
                            f"formats in one kind are not modelled")
        if per_layer and len(per_layer) < count:
            raise SpecError(f"{where}: quantized_layers: {kind} {names[0]} in {len(per_layer)} of "
                            f"{count} layers, unquantized in the rest; per-layer formats are not modelled")
        algos[kind] = names[0] if names else None
    if found:
        raise SpecError(f"{where}: quantized_layers: {', '.join(sorted(found))} named but the "
                        f"model has none (not modelled)")
    return algos


def agreed(algos: dict[str, str | None], kinds: tuple[str, ...], what: str, where: str) -> tuple[str | None, ...]:
    """The one algo of the kinds the model has ((), when it has none of them)."""
    present = {algos[kind] for kind in kinds if kind in algos}
    if len(present) > 1:
        described = ", ".join(f"{kind} {algos[kind] or 'unquantized'}" for kind in kinds if kind in algos)
        raise SpecError(f"{where}: quantized_layers: {described}: {what} in two formats are not modelled")
    return tuple(present)


def mixed_precision_fields(model: ModelSpec, carried: tuple[dict[str, Any], str]) -> dict[str, Any]:
    """quantization, quantization_scope, secondary_quantization and lm_head_quantization from
    the per-kind formats: the first scope (all, mlp, experts) whose kinds share one format
    with the rest of the block in at most one other."""
    layers, where = carried
    algos = kind_algos(model, layers, where)
    mixer = agreed(algos, ("attention", "recurrent projections"), "a block's mixers", where)
    other = agreed(algos, ("dense MLP", "shared experts", "latent projections"),
                   "the dense and shared MLPs", where)
    routed = (algos["routed experts"],) if "routed experts" in algos else ()
    scopes = {"all": (mixer + routed + other, ()), "mlp": (routed + other, mixer),
              "experts": (routed, mixer + other)}
    for scope, (inside, outside) in scopes.items():
        if len(set(inside)) == 1 and inside[0] is not None and len(set(outside)) <= 1:
            # outside differs from inside here: were they equal, the wider scope fitted first
            return scope_fields(algos, inside[0], scope, outside[0] if outside else None, where)
    if not any(algos.get(kind) for kind in algos if kind != "lm_head"):
        return {"lm_head_quantization": ALGO_FORMATS.get(algos.get("lm_head") or "")}
    raise SpecError(f"{where}: quantized_layers: " + ", ".join(
        f"{kind} {algo or 'unquantized'}" for kind, algo in algos.items())
        + ": formats other than one over a scope (all, mlp, experts) and one over the rest are not modelled")


def scope_fields(algos: dict[str, str | None], main: str, scope: str, rest: str | None,
                 where: str) -> dict[str, Any]:
    """The fields of one fitting (main over scope, rest elsewhere): a main format of fp8 runs
    fp8 GEMMs for the whole model, wrong for weight-only formats beside it; MXFP8 is only
    modelled beside a main format."""
    if main == "MXFP8":
        raise SpecError(f"{where}: quantized_layers: MXFP8 as the main block format is not "
                        f"modelled (only beside another)")
    if main == "FP8" and any(algo in WEIGHT_ONLY_ALGOS for algo in algos.values()):
        raise SpecError(f"{where}: quantized_layers: FP8 GEMMs beside weight-only "
                        f"{', '.join(sorted(WEIGHT_ONLY_ALGOS))} matmuls are not modelled (one GEMM "
                        f"precision per model)")
    head = algos.get("lm_head")
    return {"quantization": ALGO_FORMATS[main], "quantization_scope": scope,
            "secondary_quantization": ALGO_FORMATS[rest] if rest else None,
            "lm_head_quantization": ALGO_FORMATS[head] if head else None}
