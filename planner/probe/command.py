"""The `probe` command's flags (typer, Annotated style); defaults come from ProbeOptions.

``register(app)`` is how the core CLI and ``python -m planner.probe`` add the
command; it depends on the launcher, never the other way round.

No ``from __future__ import annotations`` here: typer reads the annotations.
"""

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer

from planner.probe.options import ProbeOptions


class Backend(str, enum.Enum):
    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"


class NodeIdFrom(str, enum.Enum):
    group_rank = "group-rank"
    hostname = "hostname"


class IntraKind(str, enum.Enum):
    nvlink = "nvlink"
    pcie = "pcie"
    xgmi = "xgmi"


class InterKind(str, enum.Enum):
    infiniband = "infiniband"
    roce = "roce"
    ethernet = "ethernet"


def register(app: typer.Typer) -> None:
    """Add the `probe` command to app."""
    d = ProbeOptions()
    net = "Multi-node"
    sweep = "Sweep"
    output = "Output"

    @app.command("probe")
    def probe(
        nproc_per_node: Annotated[
            int | None,
            typer.Option(help="Ranks on this node [default: visible GPUs, or 2 on CPU]."),
        ] = d.nproc_per_node,
        nnodes: Annotated[
            int, typer.Option(help="Nodes taking part.", rich_help_panel=net)
        ] = d.nnodes,
        rdzv_endpoint: Annotated[
            str | None,
            typer.Option(help="HOST:PORT of the c10d rendezvous.", rich_help_panel=net),
        ] = d.rdzv_endpoint,
        rdzv_id: Annotated[
            str, typer.Option(help="Rendezvous id, the same on every node.", rich_help_panel=net)
        ] = d.rdzv_id,
        rdzv_conf: Annotated[
            str | None,
            typer.Option(help="torchrun --rdzv-conf, e.g. join_timeout=900.", rich_help_panel=net),
        ] = d.rdzv_conf,
        local_addr: Annotated[
            str | None,
            typer.Option(
                help="torchrun --local-addr: this node's reachable address.", rich_help_panel=net
            ),
        ] = d.local_addr,
        master_addr: Annotated[
            str | None,
            typer.Option(
                help="Static rendezvous: node 0's address (instead of --rdzv-endpoint).",
                rich_help_panel=net,
            ),
        ] = d.master_addr,
        master_port: Annotated[
            int, typer.Option(help="Static rendezvous port.", rich_help_panel=net)
        ] = d.master_port,
        node_rank: Annotated[
            int | None,
            typer.Option(help="Static rendezvous only (c10d ignores it).", rich_help_panel=net),
        ] = d.node_rank,
        run: Annotated[
            bool,
            typer.Option(
                "--run",
                help="With --nnodes > 1: run this node's part instead of printing the commands.",
                rich_help_panel=net,
            ),
        ] = d.run,
        backend: Annotated[
            Backend, typer.Option(help="nccl on CUDA, gloo on CPU by default.")
        ] = Backend(d.backend),
        min_bytes: Annotated[
            int | None,
            typer.Option(help="Smallest message [default: 8].", rich_help_panel=sweep),
        ] = d.min_bytes,
        max_bytes: Annotated[
            int | None,
            typer.Option(
                help="Largest message [default: 512 MiB on GPU, 4 MiB on CPU].",
                rich_help_panel=sweep,
            ),
        ] = d.max_bytes,
        step_factor: Annotated[
            int, typer.Option(help="Size growth factor.", rich_help_panel=sweep)
        ] = d.step_factor,
        warmup: Annotated[
            int | None,
            typer.Option(
                help="Untimed ops per point [default: 5 GPU, 2 CPU].", rich_help_panel=sweep
            ),
        ] = d.warmup,
        iterations: Annotated[
            int | None,
            typer.Option(
                help="Ops per timed repeat [default: 20 GPU, 5 CPU].", rich_help_panel=sweep
            ),
        ] = d.iterations,
        repeats: Annotated[
            int | None,
            typer.Option(
                help="Timed repeats; the median is reported [default: 5].", rich_help_panel=sweep
            ),
        ] = d.repeats,
        collectives: Annotated[
            str | None,
            typer.Option(
                help="Comma list of collectives to time, from all_reduce, all_gather, "
                "reduce_scatter, send_recv, all_to_all [default: all].",
                rich_help_panel=sweep,
            ),
        ] = d.collectives,
        timeout: Annotated[
            float,
            typer.Option(
                help="Seconds for the whole run; a dead or hung rank ends it with an error."
            ),
        ] = d.timeout_s,
        node_id_from: Annotated[
            NodeIdFrom,
            typer.Option(help="Group ranks into nodes by torchrun's GROUP_RANK or by hostname."),
        ] = NodeIdFrom(d.node_id_from),
        skip_compute: Annotated[
            bool, typer.Option("--skip-compute", help="Skip the CUDA matmul and HBM measurements.")
        ] = d.skip_compute,
        out: Annotated[
            str | None,
            typer.Option(help="Write the measured hardware profile here.", rich_help_panel=output),
        ] = d.out,
        merge_into: Annotated[
            str | None,
            typer.Option(
                help="Update this profile's link numbers, keep the rest (comments are lost).",
                rich_help_panel=output,
            ),
        ] = d.merge_into,
        json_output: Annotated[
            bool,
            typer.Option(
                "--json",
                help="Print raw results, fits and profile as JSON.",
                rich_help_panel=output,
            ),
        ] = d.json_output,
        gpu: Annotated[
            str | None,
            typer.Option(
                help="Catalog GPU name [default: detected on CUDA; A100-SXM4-80GB on CPU, flagged].",
                rich_help_panel=output,
            ),
        ] = d.gpu,
        intra_kind: Annotated[
            IntraKind | None,
            typer.Option(
                help="Intra-node link kind [default on CUDA: the GPU's typical fabric in `plan gpus`, nvlink if it is not there; pcie on CPU].",
                rich_help_panel=output,
            ),
        ] = None,
        inter_kind: Annotated[
            InterKind | None,
            typer.Option(
                help="Inter-node link kind [default: infiniband on CUDA, ethernet on CPU].",
                rich_help_panel=output,
            ),
        ] = None,
        name: Annotated[
            str | None,
            typer.Option(
                help="Profile name [default: measured-NODESxRANKS-BACKEND].", rich_help_panel=output
            ),
        ] = d.name,
        verbose: Annotated[
            bool, typer.Option("--verbose", help="Show the torchrun command and its output.")
        ] = d.verbose,
    ) -> None:
        """Measure all-reduce, all-to-all, all-gather, reduce-scatter and send/recv inside and across nodes (torchrun)."""
        for flag, text in (("--out", out), ("--merge-into", merge_into)):
            if text is not None and not text.strip():  # Path("") is "." (a fuzz sweep: "--out .: is a directory")
                print(f"plan probe: {flag}: empty; give a file path", file=sys.stderr)
                raise typer.Exit(2)
        options = ProbeOptions(
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_id=rdzv_id,
            rdzv_conf=rdzv_conf,
            local_addr=local_addr,
            master_addr=master_addr,
            master_port=master_port,
            node_rank=node_rank,
            run=run,
            backend=backend.value,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            step_factor=step_factor,
            warmup=warmup,
            iterations=iterations,
            repeats=repeats,
            timeout_s=timeout,
            node_id_from=node_id_from.value,
            out=None if out is None else Path(out),
            merge_into=None if merge_into is None else Path(merge_into),
            json_output=json_output,
            gpu=gpu,
            intra_kind=intra_kind.value if intra_kind else None,
            inter_kind=inter_kind.value if inter_kind else None,
            name=name,
            skip_compute=skip_compute,
            verbose=verbose,
            collectives=collectives,
        )
        # the launcher and its checks load only when the command runs
        from planner.probe.launcher import run_probe

        code = run_probe(options)
        if code:
            raise typer.Exit(code)
