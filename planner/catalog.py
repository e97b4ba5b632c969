"""What ships: the GPU catalog, model specs, hardware profiles; name resolution.

`--model` takes a YAML path, a Hugging Face config.json (or a directory holding
one), or a shipped name. `--cluster` takes a YAML path, a shipped name, or the
shorthand NxMxGPU built from the catalog with that GPU's typical fabric.
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

import yaml

from planner import specs
from planner.specs import (
    GPU,
    ClusterSpec,
    ModelSpec,
    SpecError,
    load_model,
    validate,
)

PACKAGE_DIR = Path(__file__).parent
GPU_CATALOG_PATH = PACKAGE_DIR / "data" / "gpus.yaml"
MODEL_SPECS_DIR = PACKAGE_DIR / "model_specs"
HARDWARE_PROFILES_DIR = PACKAGE_DIR / "hardware_profiles"
SHORTHAND = re.compile(r"^(\d+)x(\d+)x(.+)$", re.IGNORECASE)


@functools.cache
def gpu_catalog() -> tuple[GPU, ...]:
    # The shipped catalog is trusted and well formed: libyaml's loader when built (10x faster).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = yaml.load(GPU_CATALOG_PATH.read_text(encoding="utf-8"), Loader=loader)
    return tuple(
        validate(GPU, entry, f"{GPU_CATALOG_PATH}[{index}]") for index, entry in enumerate(entries)
    )


def _key(name: str) -> str:
    return name.strip().upper().replace("_", "-").replace(" ", "-")


@functools.cache
def _gpu_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in gpu_catalog():
        for name in (gpu.name, *gpu.aliases):
            assert _key(name) not in index, f"ambiguous GPU alias {name}"
            index[_key(name)] = gpu
    return index


VENDOR_PREFIXES = ("NVIDIA-", "GEFORCE-", "TESLA-", "AMD-", "INSTINCT-")
"""Words nvidia-smi and rocm-smi put before a GPU's name ("NVIDIA GeForce RTX 4090", "AMD
Instinct MI300X"), dropped when the name as given is not in the catalog."""


def resolve_gpu(name: str) -> GPU:
    """A catalog GPU by name or alias (case, spaces and underscores aside), or as nvidia-smi
    names it (VENDOR_PREFIXES dropped); unknown: the nearest names in the error."""
    index, key = _gpu_index(), _key(name)
    while key not in index and key.startswith(VENDOR_PREFIXES):
        key = key.split("-", 1)[1]
    gpu = index.get(key)
    if gpu is None:
        near = difflib.get_close_matches(key, list(index), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(dict.fromkeys(index[k].name for k in near))}? " if near else ""
        known = ", ".join(g.name for g in gpu_catalog())
        raise SpecError(f"unknown GPU {name!r} ({hint}known: {known}; see `plan gpus`)")
    return gpu


def shipped_models() -> list[str]:
    return sorted(path.stem for path in MODEL_SPECS_DIR.glob("*.yaml"))


def shipped_clusters() -> list[str]:
    return sorted(path.stem for path in HARDWARE_PROFILES_DIR.glob("*.yaml"))


def _check_given(flag: str, arg: str) -> None:
    if not arg.strip():
        raise SpecError(f"{flag}: empty (give a shipped name, a file or a directory)")


def _is(path: Path, test: str) -> bool:
    """path.is_dir() / is_file() / exists(), False for a name the OS refuses (too long)."""
    try:
        return getattr(path, test)()
    except OSError:
        return False


def _quoted(arg: str, limit: int = 80) -> str:
    return repr(arg) if len(arg) <= limit else repr(arg[:limit]) + f"... ({len(arg):,} characters)"


def checkpoint_config(arg: str) -> Path | None:
    """The config.json a --model argument names (a config.json path or a directory holding one),
    whose checkpoint the launch command then serves; None for a YAML spec or a shipped name."""
    path = Path(arg)
    if _is(path, "is_dir"):
        path = path / "config.json"
    return path if (path.suffix == ".json" or path.name == "config.json") and _is(path, "is_file") else None


def resolve_model(arg: str) -> ModelSpec:
    """A YAML path, a config.json path or directory, or a shipped model name."""
    _check_given("--model", arg)
    path = Path(arg)
    if _is(path, "is_dir"):
        path = path / "config.json"
        if not _is(path, "is_file"):
            raise SpecError(f"{arg}: no config.json in this directory")
    if path.suffix == ".json" or path.name == "config.json":
        from planner.hf_config import load_hf_config

        return load_hf_config(path)
    if path.suffix in (".yaml", ".yml") or _is(path, "exists"):
        return load_model(path)
    shipped = MODEL_SPECS_DIR / f"{arg}.yaml"
    if _is(shipped, "is_file"):
        return load_model(shipped)
    folded = {name.lower(): name for name in shipped_models()}.get(arg.lower())  # LLAMA-3.1-70B, as clusters
    if folded is not None:
        return load_model(MODEL_SPECS_DIR / f"{folded}.yaml")
    raise SpecError(
        f"--model: {_quoted(arg)} is neither a file nor a shipped model "
        f"(shipped: {', '.join(shipped_models())})"
    )


def load_cluster(path: Path) -> ClusterSpec:
    """A hardware profile YAML, its `gpu: NAME` resolved from the GPU catalog."""
    return specs.load_cluster(path, resolve_gpu)


def resolve_cluster(arg: str) -> ClusterSpec:
    """A YAML path, a shipped profile name, or the shorthand NxMxGPU."""
    _check_given("--cluster", arg)
    path = Path(arg)
    if path.suffix in (".yaml", ".yml") or _is(path, "exists"):
        return load_cluster(path)
    shipped = HARDWARE_PROFILES_DIR / f"{arg}.yaml"
    if _is(shipped, "is_file"):
        return load_cluster(shipped)
    match = SHORTHAND.match(arg)
    if match is None:
        raise SpecError(
            f"--cluster: {_quoted(arg)} is neither a file, a shipped profile "
            f"({', '.join(shipped_clusters())}) nor NxMxGPU shorthand (e.g. 2x8xA100)"
        )
    if max(len(match[1]), len(match[2])) > len(str(specs.MAX_NUM_GPUS)):
        raise SpecError(f"--cluster: {_quoted(arg)}: more than the {specs.MAX_NUM_GPUS:,} GPUs a cluster "
                        f"is taken to have")
    return cluster_from_shorthand(int(match[1]), int(match[2]), match[3], arg)


def cluster_from_shorthand(num_nodes: int, gpus_per_node: int, gpu_name: str, arg: str) -> ClusterSpec:
    """NxMxGPU with the GPU's typical intra-node fabric and node networking.

    A node of M GPUs gets the typical node's NICs scaled by M / typical node size
    (rail-optimised nodes carry one NIC per GPU).
    """
    if num_nodes < 1 or gpus_per_node < 1:
        raise SpecError(f"--cluster: {arg!r}: node and GPU counts must be positive")
    if gpus_per_node > specs.MAX_GPUS_PER_NODE:
        raise SpecError(f"--cluster: {arg!r}: {gpus_per_node:,} GPUs per node, more than the "
                        f"{specs.MAX_GPUS_PER_NODE:,} one node's fabric is taken to join")
    if num_nodes * gpus_per_node > specs.MAX_NUM_GPUS:
        raise SpecError(f"--cluster: {arg!r}: {num_nodes * gpus_per_node:,} GPUs, more than the "
                        f"{specs.MAX_NUM_GPUS:,} a cluster is taken to have")
    try:
        gpu = resolve_gpu(gpu_name)
    except SpecError as exc:
        raise SpecError(f"--cluster: {arg!r}: {exc}") from None
    if gpus_per_node > 1 and gpu.intra_node is None:
        raise SpecError(
            f"--cluster: {arg!r}: the catalog has no typical intra-node fabric for "
            f"{gpu.name}; describe the node in a hardware profile YAML"
        )
    inter = None
    if num_nodes > 1:
        if gpu.inter_node is None:
            raise SpecError(
                f"--cluster: {arg!r}: the catalog has no typical node networking for "
                f"{gpu.name}; describe the cluster in a hardware profile YAML"
            )
        nics = max(1, round(gpu.inter_node.num_nics_per_node * gpus_per_node / gpu.typical_gpus_per_node))
        inter = gpu.inter_node.model_copy(update={"num_nics_per_node": nics})
    return ClusterSpec(
        name=f"{num_nodes}x{gpus_per_node}x{gpu.name}",
        source=f"built from the GPU catalog's typical fabric for {gpu.name}",
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        intra_node=gpu.intra_node if gpus_per_node > 1 else None,
        inter_node=inter,
    )
