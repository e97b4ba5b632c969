"""Serving entry for the CLI (placeholder until the serving planner lands: summary only)."""

from __future__ import annotations

from planner.render.catalog import describe_cluster, describe_model
from planner.render.common import console
from planner.requests import ServeRequest
from planner.specs import ClusterSpec, ModelSpec


def run_serve(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, **_: object) -> int:
    out = console()
    out.print(describe_model(model))
    out.print(describe_cluster(cluster))
    return 0
