"""Fixtures for the serving tests: shipped specs by name, and a one-call estimate."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.layout import Layout, Rejected
from planner.requests import LayoutFilter, ServeRequest
from planner.serve import ServeEstimate, estimate
from planner.serve_search import ServePlan, plan_serving
from planner.specs import ClusterSpec, ModelSpec


def ring_only(cluster_spec: ClusterSpec) -> ClusterSpec:
    """The cluster without vLLM's measured all-reduce curves (fused and unfused): NCCL's ring
    model prices every TP all-reduce (the physics tests' subject; gpt-fast's own stack)."""
    gpu = cluster_spec.gpu.model_copy(update={"serving_allreduce": [], "serving_allreduce_unfused": []})
    return cluster_spec.model_copy(update={"gpu": gpu})


@pytest.fixture(scope="session")
def model() -> Callable[..., ModelSpec]:
    """model("llama-3.1-70b", quantization="fp8") -> the shipped spec, optionally changed."""

    def load(name: str, **changes: object) -> ModelSpec:
        spec = resolve_model(name)
        return spec.model_copy(update=changes) if changes else spec

    return load


@pytest.fixture(scope="session")
def cluster() -> Callable[[str], ClusterSpec]:
    """cluster("2x8xA100") -> a shipped profile or NxMxGPU shorthand."""
    return resolve_cluster


@pytest.fixture(scope="session")
def serve_one(model, cluster) -> Callable[..., ServeEstimate | Rejected]:
    """serve_one("llama-3.1-8b", "1x1xH100", (1, 1, 1), batch=1) -> estimate(...)."""

    def run(
        model_name: str, cluster_name: str, degrees: tuple[int, int, int], **request: object
    ) -> ServeEstimate | Rejected:
        return estimate(
            model(model_name), cluster(cluster_name), Layout(*degrees), ServeRequest(**request)
        )

    return run


@pytest.fixture(scope="session")
def serve_plan(model, cluster) -> Callable[..., ServePlan]:
    """serve_plan("llama-3.1-70b", "2x8xA100", quantization="fp8", layout=dict(tp=8),
    objective="latency") -> plan_serving(...); model fields as keywords where the spec
    has them (quantization), the rest go to ServeRequest."""

    def run(
        model_name: str,
        cluster_name: str,
        *,
        quantization: str | None = None,
        layout: dict[str, int] | None = None,
        **request: object,
    ) -> ServePlan:
        spec = (
            model(model_name)
            if quantization is None
            else model(model_name, quantization=quantization)
        )
        if quantization is not None and quantization != resolve_model(model_name).quantization:
            # as the CLI's --quantization: the engine quantizes a 16-bit checkpoint itself
            request = {"quantization_override": quantization, **request}
        return plan_serving(
            spec,
            cluster(cluster_name),
            ServeRequest(layout=LayoutFilter(**(layout or {})), **request),
        )

    return run


@pytest.fixture(scope="session")
def plan_json(run_plan) -> Callable[..., tuple[int, dict]]:
    """plan_json("--model", ..., ) -> (exit code, parsed --json output)."""

    def run(*args: str) -> tuple[int, dict]:
        done = run_plan(*args, "--json")
        return done.returncode, json.loads(done.stdout)

    return run


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture(scope="session")
def one_line_error() -> Callable[..., str]:
    """one_line_error(result): a CLI run that exited 2 with exactly one non-blank line of
    output; that line."""
    return _one_line_error
