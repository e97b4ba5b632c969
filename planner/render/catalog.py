"""`plan models`, `plan clusters`, `plan gpus`, and the model/cluster summary."""

from __future__ import annotations

from planner import catalog, units
from planner.cost.params import param_counts, weight_bytes
from planner.layout import intra_node_link
from planner.model_summary import ModelSummary, model_summary
from planner.render.common import billions, console, gb_per_s, gib, us
from planner.specs import ClusterSpec, IntraNodeLink, ModelSpec


def describe_model(model: ModelSpec, kv_cache_dtype: str = "auto") -> str:
    """`deepseek-v3: 671.03B params, 37.55B active, ..., 61 layers, MLA 128 heads, 256 experts
    top-8 + 1 shared in 58 layers`: the facts of model_summary, at the plan's KV dtype."""
    s = model_summary(model, kv_cache_dtype)
    active = f", {billions(s.active_params)} active" if s.num_experts else ""
    mtp = f" (+{billions(s.mtp_params)} MTP)" if s.mtp_params else ""
    weights = f"{model.dtype} weights"
    if model.quantization:
        weights = f"{model.quantization} weights"
        if model.quantization_scope != "all":
            weights = f"{model.quantization} {model.quantization_scope} + {s.secondary_weight_dtype or model.dtype} other weights"
        if s.lm_head_weight_dtype:
            weights += f" ({s.lm_head_weight_dtype} LM head)"
    return (
        f"{model.name}: {billions(s.total_params)} params{mtp}{active}, {gib(weight_bytes(model))} of "
        f"{weights}, KV {s.kv_cache_bytes_per_token / units.BYTES_PER_KIB:.0f} KiB/token "
        f"({s.kv_cache_dtype}), {model.num_hidden_layers} layers, {_attention(model, s)}{_experts(model, s)}"
        f"{_recurrent(s)}{_wrapper(model)}{_unknown_type(model)}"
    )


def _unknown_type(model: ModelSpec) -> str:
    if model.unknown_model_type is None:
        return ""
    named = f"model_type {model.unknown_model_type!r}" if model.unknown_model_type else "no model_type"
    return (f"; {named}: no configuration class in transformers 5.16.1 or vLLM 0.33.0 and no auto_map code, "
            f"so planned as a standard decoder from its generic keys (the engines may refuse it)")


def _wrapper(model: ModelSpec) -> str:
    if model.text_model_of is None:
        return ""
    return f"; the text model of {model.text_model_of} (its vision/audio towers not counted in weights or memory)"


def _recurrent(s: ModelSummary) -> str:
    if not s.num_recurrent_layers:
        return ""
    kind = {"mamba2": "Mamba2", "gated_deltanet": "Gated DeltaNet"}.get(s.recurrent_kind or "", "recurrent")
    state = s.recurrent_state_bytes_per_sequence / units.BYTES_PER_MIB
    return f", {s.num_recurrent_layers} {kind} layers ({state:.1f} MiB state/sequence)"


def _attention(model: ModelSpec, s: ModelSummary) -> str:
    heads = f"{s.attention.upper()} {model.num_attention_heads} heads"
    return heads if s.attention in ("mha", "mla") else f"{heads} / {model.num_key_value_heads} KV heads"


def _experts(model: ModelSpec, s: ModelSummary) -> str:
    if not s.num_experts:
        return ""
    shared = f" + {s.num_shared_experts} shared" if s.num_shared_experts else ""
    layers = f" in {s.num_moe_layers} layers" if s.num_moe_layers != model.num_hidden_layers else ""
    return f", {s.num_experts} experts top-{s.experts_per_token}{shared}{layers}"


def measured_links_words(cluster: ClusterSpec) -> list[str]:
    """Where a profile's link figures come from when `plan probe` measured them (the cluster line
    of `plan`, the notes of `plan explain`, which had said nothing of it: a critical read)."""
    if cluster.measured is None:
        return []
    words = [f"links measured by plan probe ({cluster.measured.date or 'undated'})"]
    if cluster.measured.backend == "gloo":
        words.append(f"warning: measured with gloo on the hosts' CPUs, so the link figures are the host "
                     f"path's, not the {cluster.gpu.name} fabric's (measure on the GPUs: plan probe --backend "
                     f"nccl)")
    return words


def describe_cluster(cluster: ClusterSpec) -> str:
    parts = [
        f"{cluster.name}: {cluster.num_nodes} x {cluster.gpus_per_node} x {cluster.gpu.name} "
        f"= {cluster.num_gpus} GPU{'s' if cluster.num_gpus != 1 else ''}, {gib(cluster.gpu.memory_bytes)} each "
        f"({gib(cluster.gpu.memory_bytes * cluster.num_gpus)} in all)"
    ]
    if cluster.intra_node is not None:
        link, staged = cluster.intra_node, intra_node_link(cluster)
        parts.append(f"intra-node {link.kind} {gb_per_s(link.bandwidth_bytes_per_s)}/GPU" + (
            "" if not staged.host_staged else
            f", no GPU peer-to-peer: NCCL stages every transfer through host memory (priced at "
            f"{gb_per_s(staged.bandwidth_bytes_per_s)} and {us(staged.latency_seconds)} per ring step) and "
            f"vLLM turns its custom all-reduce off"))
    if cluster.inter_node is not None:
        link = cluster.inter_node
        parts.append(
            f"inter-node {link.kind} {link.num_nics_per_node} x {link.nic_bandwidth_gbit_per_s:g} Gb/s "
            f"= {gb_per_s(link.node_bandwidth_bytes_per_s)}/node"
        )
    parts.extend(measured_links_words(cluster))
    typical = cluster.gpu.typical_gpus_per_node
    if cluster.gpus_per_node > typical and (cluster.source or "").startswith("built from the GPU catalog"):
        parts.append(f"note: {cluster.gpus_per_node} GPUs per node on one {cluster.intra_node.kind} fabric, where a "
                     f"typical {cluster.gpu.name} node holds {typical}; describe any other node in a hardware profile")
    return "; ".join(parts)


def render_models() -> None:
    from rich.table import Table

    table = Table("name", "params", "active", "weights", "dtype", "quant", "layers", "heads/kv", "context")
    for name in catalog.shipped_models():
        model = catalog.resolve_model(name)
        counts = param_counts(model)
        table.add_row(
            name, billions(counts.total), billions(counts.active), gib(weight_bytes(model)),
            model.dtype, model.quantization or "-", str(model.num_hidden_layers),
            f"{model.num_attention_heads}/{model.num_key_value_heads}", f"{model.max_position_embeddings:,}",
        )
    console().print(table)


def render_clusters() -> None:
    from rich.table import Table

    table = Table("name", "GPUs", "GPU", "intra-node", "inter-node")
    for name in catalog.shipped_clusters():
        cluster = catalog.resolve_cluster(name)
        intra = cluster.intra_node
        inter = cluster.inter_node
        table.add_row(
            name, f"{cluster.num_nodes}x{cluster.gpus_per_node}", cluster.gpu.name,
            intra_words(intra) if intra else "-",
            f"{inter.kind} {inter.num_nics_per_node}x{inter.nic_bandwidth_gbit_per_s:g} Gb/s" if inter else "-",
        )
    console().print(table)
    console().print("Shorthand NxMxGPU (e.g. 16x8xA100) builds any size from `plan gpus`.")


def intra_words(link: IntraNodeLink) -> str:
    return f"{link.kind} {link.bandwidth_gb_per_s:g} GB/s" + ("" if link.peer_access else ", no P2P")


def render_gpus() -> None:
    from rich.table import Table

    precisions = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
    table = Table("name", "aliases", "memory", "HBM GB/s", *precisions, "fabric", "node network")
    for gpu in catalog.gpu_catalog():
        peaks = [getattr(gpu.peak_tflops, p) for p in precisions]
        inter = gpu.inter_node
        table.add_row(
            gpu.name, ", ".join(gpu.aliases), f"{gpu.memory_gib:g} GiB", f"{gpu.hbm_bandwidth_gb_per_s:g}",
            *("" if v is None else f"{v:g}" for v in peaks),
            intra_words(gpu.intra_node) if gpu.intra_node else "-",
            f"{inter.num_nics_per_node}x{inter.nic_bandwidth_gbit_per_s:g} Gb/s {inter.kind}" if inter else "-",
        )
    console().print(table)
    console().print("TFLOP/s dense (int8: TOPS); blank = not confirmed (measure with `plan probe`).")
