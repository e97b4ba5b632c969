"""`plan models`, `plan clusters`, `plan gpus`, and the model/cluster summary."""

from __future__ import annotations

from planner import catalog, units
from planner.cost.params import kv_bytes_per_token, param_counts, weight_bytes
from planner.render.common import billions, console, gb_per_s, gib
from planner.specs import ClusterSpec, ModelSpec


def describe_model(model: ModelSpec) -> str:
    counts = param_counts(model)
    active = f", {billions(counts.active)} active" if model.is_moe else ""
    quant = f" {model.quantization}" if model.quantization else ""
    return (
        f"{model.name}: {billions(counts.total)} params{active}, {gib(weight_bytes(model))} of "
        f"{model.dtype}{quant} weights, KV {kv_bytes_per_token(model) / units.BYTES_PER_KIB:.0f} KiB/token, "
        f"{model.num_hidden_layers} layers, {model.num_attention_heads} heads / "
        f"{model.num_key_value_heads} KV heads"
    )


def describe_cluster(cluster: ClusterSpec) -> str:
    parts = [
        f"{cluster.name}: {cluster.num_nodes} x {cluster.gpus_per_node} x {cluster.gpu.name} "
        f"= {cluster.num_gpus} GPUs, {gib(cluster.gpu.memory_bytes)} each "
        f"({gib(cluster.gpu.memory_bytes * cluster.num_gpus)} in all)"
    ]
    if cluster.intra_node is not None:
        link = cluster.intra_node
        parts.append(f"intra-node {link.kind} {gb_per_s(link.bandwidth_bytes_per_s)}/GPU")
    if cluster.inter_node is not None:
        link = cluster.inter_node
        parts.append(
            f"inter-node {link.kind} {link.num_nics_per_node} x {link.nic_bandwidth_gbit_per_s:g} Gb/s "
            f"= {gb_per_s(link.node_bandwidth_bytes_per_s)}/node"
        )
    if cluster.measured is not None:
        parts.append(f"links measured by plan probe ({cluster.measured.date or 'undated'})")
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
            f"{intra.kind} {intra.bandwidth_gb_per_s:g} GB/s" if intra else "-",
            f"{inter.kind} {inter.num_nics_per_node}x{inter.nic_bandwidth_gbit_per_s:g} Gb/s" if inter else "-",
        )
    console().print(table)
    console().print("Shorthand NxMxGPU (e.g. 16x8xA100) builds any size from `plan gpus`.")


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
            f"{gpu.intra_node.kind} {gpu.intra_node.bandwidth_gb_per_s:g} GB/s" if gpu.intra_node else "-",
            f"{inter.num_nics_per_node}x{inter.nic_bandwidth_gbit_per_s:g} Gb/s {inter.kind}" if inter else "-",
        )
    console().print(table)
    console().print("TFLOP/s dense (int8: TOPS); blank = not confirmed (measure with `plan probe`).")
