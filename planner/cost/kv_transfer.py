"""KV cache transfer from a prefill worker to a decode worker (disaggregated serving; pure, SI).

vLLM's NixlConnector (0.33.0) moves a prompt's KV once its prefill is done: the proxy hands the
request to a decode server, whose scheduler reads every block of the prompt from the prefill
server and schedules the request when the reads complete ("NixlConnector does not do
layerwise saving": save_kv_layer and wait_for_layer_load do nothing,
distributed/kv_transfer/kv_connector/v1/nixl/connector.py). So the whole transfer is in TTFT.
Each decode TP rank reads the heads it holds from the matching prefill rank: n = min(t_P, t_D)
parallel streams of S / n. MLA's latent is not split by heads: every decode TP rank reads the
whole S (vLLM's NIXL worker keeps MLA caches replicated, nixl/base_worker.py), one stream of S
per rank, t_D copies of it per request.
Legend: S prompt KV bytes (whole model, every layer), I prompt tokens, L layers, n streams,
alpha link latency (s), beta one GPU's link bandwidth (bytes/s). Derivation:
docs/cost-model.md (Serving: disaggregated).
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
    """S = KV bytes per token (whole model, every layer) * I."""
    link_kind: str
    """nvlink | infiniband | roce | ... (the link the bytes cross)."""
    link_scope: str
    """intra_node (P and D share a node) | inter_node (over the NICs)."""
    num_streams: int
    """n: parallel streams, each S / n (MLA: 1 stream of S, read by every decode TP rank)."""
    transfer_seconds: float
    """T_x = L * (alpha + S / (L n) / beta): one stream's L layer messages back to back."""
    source: str
    """model (alpha-beta) | measured (the probe's 2-rank curve on this link)."""
    copies: int = 1
    """Times S crosses the links per request: 1, or t_D for MLA (every decode TP rank reads the
    whole latent)."""

    @property
    def exposed_seconds(self) -> float:
        """What adds to TTFT: all of T_x (the blocks are read after the prefill ends)."""
        return self.transfer_seconds


def layer_message_seconds(message_bytes: float, link: Link, curve: AllreduceCurve | None) -> float:
    """One layer's message on one stream: the probe's 2-rank all-reduce curve at this size when
    the profile has one (a 2-rank ring all-reduce moves S/beta per rank, as one send does), else
    alpha + S/beta (comm.p2p_seconds)."""
    if curve is not None:
        return curve_seconds(curve, message_bytes)
    return p2p_seconds(message_bytes, link)


def kv_transfer(kv_bytes_per_token: float, input_len: int, num_layers: int, prefill_tp: int,
                decode_tp: int, link: Link, curve: AllreduceCurve | None, mla: bool = False) -> KvTransfer:
    """S = kv_bytes_per_token * I over n = min(t_P, t_D) streams (MLA: one of S, t_D copies),
    L messages each of S/(L*n): T_x = L * t_msg(S/(L*n)), all of it exposed."""
    total = kv_bytes_per_token * input_len
    streams, copies = (1, decode_tp) if mla else (min(prefill_tp, decode_tp), 1)
    message = total / (num_layers * streams)
    transfer = num_layers * layer_message_seconds(message, link, curve)
    return KvTransfer(total, link.kind, link.scope, streams, transfer, "measured" if curve is not None else "model",
                      copies)


def kv_link_requests_per_second(transfer: KvTransfer, worker_gpus: int) -> float:
    """The prompts per second one worker's links can move: each of its GPUs carries S/n of a
    prompt's KV in T_x (n streams in parallel; MLA: t_D copies of S, one per decode TP rank),
    so its g GPUs move g / (n c) / T_x prompts per second however many workers send or receive. A prefill worker cannot hand over more, nor a
    decode worker take in more, whatever their compute allows (docs/cost-model.md, Serving:
    disaggregated)."""
    return worker_gpus / (transfer.num_streams * transfer.copies) / transfer.transfer_seconds

