"""KV cache transfer from a prefill worker to a decode worker (disaggregated serving; pure, SI).

NIXL-style connectors (vLLM's NixlConnector, SGLang's nixl/mooncake backends) move the
prompt's KV cache layer by layer: layer l's blocks can leave as soon as layer l is computed,
so the transfer overlaps the prefill's remaining layers and only what has not finished by the
end of the prefill adds to TTFT (at least the last layer's share).

Legend: S prompt KV bytes (whole model, every layer), I prompt tokens, L layers, n parallel
streams (min of the two workers' TP degrees: each prefill GPU sends its heads' shard to the
matching decode GPUs), alpha link latency (s), beta one GPU's link bandwidth (bytes/s),
T_pre the prefill's own compute time. Derivation: docs/cost-model.md (Serving: disaggregated).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.comm import curve_seconds, p2p_seconds
from planner.layout import Link
from planner.specs import AllreduceCurve


@dataclass(frozen=True)
class KvTransfer:
    """One request's prompt KV, prefill worker -> decode worker."""

    bytes_per_request: float
    """S = KV bytes per token (whole model) * I."""
    link_kind: str
    """nvlink | infiniband | roce | ... (the link the bytes cross)."""
    link_scope: str
    """intra_node (P and D share a node) | inter_node (over the NICs)."""
    num_streams: int
    transfer_seconds: float
    """All L layer messages back to back: L * (alpha + S / (L * n) / beta)."""
    exposed_seconds: float
    """What adds to TTFT after the prefill's last layer."""
    source: str
    """model (alpha-beta) | measured (the probe's 2-rank curve on this link)."""


def layer_message_seconds(message_bytes: float, link: Link, curve: AllreduceCurve | None) -> float:
    """One layer's message on one stream: the probe's 2-rank all-reduce curve at this size when
    the profile has one (a 2-rank ring all-reduce moves S/beta per rank, as one send does), else
    alpha + S/beta (comm.p2p_seconds)."""
    if curve is not None:
        return curve_seconds(curve, message_bytes)
    return p2p_seconds(message_bytes, link)


def exposed_transfer_seconds(transfer_seconds: float, num_layers: int, prefill_seconds: float) -> float:
    """max(T_x / L, T_x - T_pre * (L - 1) / L): layers 1..L-1 are sent while the prefill
    computes the later layers; the last layer's share always waits for the prefill's end, and
    a link slower than the compute leaves the backlog exposed."""
    per_layer = transfer_seconds / num_layers
    return max(per_layer, transfer_seconds - prefill_seconds * (num_layers - 1) / num_layers)


def kv_transfer(kv_bytes_per_token: float, input_len: int, num_layers: int, prefill_tp: int,
                decode_tp: int, link: Link, curve: AllreduceCurve | None,
                prefill_seconds: float) -> KvTransfer:
    """S = kv_bytes_per_token * I over n = min(t_P, t_D) streams, L messages each of S/(L*n):
    T_x = L * t_msg(S/(L*n)); exposed as exposed_transfer_seconds."""
    total = kv_bytes_per_token * input_len
    streams = min(prefill_tp, decode_tp)
    message = total / (num_layers * streams)
    transfer = num_layers * layer_message_seconds(message, link, curve)
    return KvTransfer(total, link.kind, link.scope, streams, transfer,
                      exposed_transfer_seconds(transfer, num_layers, prefill_seconds),
                      "measured" if curve is not None else "model")


def kv_link_requests_per_second(transfer: KvTransfer, worker_gpus: int) -> float:
    """The prompts per second one worker's links can move: each of its GPUs carries S/n of a
    prompt's KV in T_x (n streams in parallel), so its g GPUs move (g / n) / T_x prompts per
    second however many workers send or receive. A prefill worker cannot hand over more, nor a
    decode worker take in more, whatever their compute allows (docs/cost-model.md, Serving:
    disaggregated)."""
    return worker_gpus / transfer.num_streams / transfer.transfer_seconds

