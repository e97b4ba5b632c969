"""torchrun's own flags, one home for the Megatron-LM launch and `plan probe`.

One node with no rendezvous given: `--standalone`. Several nodes: `--nnodes N` and the
rendezvous, c10d (`--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID`, node order
follows arrival, so every node runs the same line) or static (`--node-rank R --master-addr
HOST --master-port PORT`). Flag names: torch.distributed.run (torchrun) documentation.
"""

from __future__ import annotations


def torchrun_flags(nproc_per_node: int | str, nnodes: int = 1, *, rdzv_endpoint: str | None = None,
                   rdzv_id: str | None = None, master_addr: str | None = None, master_port: int | None = None,
                   node_rank: int | str | None = None, rdzv_conf: str | None = None,
                   local_addr: str | None = None) -> list[str]:
    """The flags between `torchrun` and the script; master_addr selects the static rendezvous."""
    if nnodes == 1 and not (rdzv_endpoint or master_addr):
        return ["--standalone", "--nproc-per-node", str(nproc_per_node)]
    flags = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node)]
    if master_addr:
        flags += ["--node-rank", str(node_rank), "--master-addr", master_addr, "--master-port", str(master_port)]
    else:
        flags += ["--rdzv-backend", "c10d", "--rdzv-endpoint", str(rdzv_endpoint), "--rdzv-id", str(rdzv_id)]
    if rdzv_conf:
        flags += ["--rdzv-conf", rdzv_conf]
    if local_addr:
        flags += ["--local-addr", local_addr]
    return flags
