"""What the user asks for, as typed values (the CLI fills these; the planners read them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Objective = Literal["throughput", "latency"]


@dataclass(frozen=True)
class LayoutFilter:
    """`--layout tp=8,pp=2`: keep only layouts matching the given degrees."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None

    def matches(self, tp: int, pp: int, dp: int) -> bool:
        return all(
            want is None or want == have
            for want, have in ((self.tp, tp), (self.pp, pp), (self.dp, dp))
        )


@dataclass(frozen=True)
class ServeRequest:
    input_len: int = 1024
    output_len: int = 256
    batch: int | None = None
    """Concurrent sequences per replica; None = as many as the KV cache holds."""
    max_model_len: int | None = None
    """None = the model's max_position_embeddings (vLLM's default)."""
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    quantization_override: Literal["fp8", "int8", "int4"] | None = None
    """Set when `--quantization` changed the spec's weights: the engine must quantize a
    16-bit checkpoint itself (vLLM and SGLang can for fp8 only). A spec that is already
    quantized describes a pre-quantized checkpoint the engine detects on its own."""
    max_num_batched_tokens: int | None = None
    """None = vLLM's default for the chosen length (see serve.py)."""
    num_gpus: int | None = None
    """`--gpus N`: plan for a subset of the cluster."""
    layout: LayoutFilter = LayoutFilter()
    objective: Objective = "throughput"
    max_tpot_seconds: float | None = None


@dataclass(frozen=True)
class TrainRequest:
    global_batch: int
    """Sequences per optimizer step (B)."""
    seq_len: int
    num_gpus: int | None = None
    layout: LayoutFilter = LayoutFilter()
    micro_batch: int | None = None
    schedule: Literal["gpipe", "1f1b", "interleaved"] | None = None
    virtual_stages: int | None = None
    recompute: Literal["none", "selective", "full"] | None = None
    sequence_parallel: bool | None = None
    zero_stage: int | None = None
