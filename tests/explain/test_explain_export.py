"""--svg / --html save what was printed; --json gives every section as data; every section
renders for every shipped model on every shipped cluster where a layout exists."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from functools import cache

import pytest
from rich.console import Console
from typer.testing import CliRunner

from planner import sensitivity
from planner.catalog import resolve_cluster, resolve_model, shipped_clusters, shipped_models
from planner.cli import app
from planner.explain import explain_serving
from planner.render.explain import render_explanation
from planner.requests import ServeRequest
from planner.specs import SpecError

SVG = "{http://www.w3.org/2000/svg}"
SECTIONS = ("placement", "memory", "collectives", "timeline", "breakdown", "sensitivity")


def test_svg_and_html_are_what_was_printed(tmp_path) -> None:
    svg, html = tmp_path / "explain.svg", tmp_path / "explain.html"
    result = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-405b", "--cluster", "2x8xH100",
                                      "--objective", "latency", "--svg", str(svg), "--html", str(html)])
    assert result.exit_code == 0, result.output
    root = ET.parse(svg).getroot()
    assert root.tag == f"{SVG}svg"
    drawn = "".join(t.text or "" for t in root.iter(f"{SVG}text")).replace("\xa0", " ")
    for phrase in ("Placement", "TP8", "nvlink", "How", "robust"):
        assert phrase in drawn
    page = html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and "Pipeline timeline" in page


def test_timeline_only_svg(tmp_path) -> None:
    svg = tmp_path / "gantt.svg"
    result = CliRunner().invoke(app, ["explain", "--timeline-only", "--schedule", "interleaved", "--stages", "4",
                                      "--micro-batches", "8", "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    assert ET.parse(svg).getroot().tag == f"{SVG}svg"


def test_json_has_every_section() -> None:
    result = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-405b", "--cluster", "2x8xH100", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for section in SECTIONS:
        assert data[section], section
    assert data["layout"] == {"tp": 8, "pp": 2, "dp": 1, "ep": 1, "cp": 1}  # Layout.cp: 1 for serving
    assert data["timeline"]["schedule"] == "decode"
    assert data["memory"][0]["segments"][0] == {"name": "weights", "bytes": pytest.approx(data["memory"][0]["segments"][0]["bytes"])}


def test_nothing_fits_is_exit_1_with_what_would_fit_as_plan_says() -> None:
    """Not a user mistake: exit 1, the closest rejections and what would fit (as `plan`)."""
    result = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-405b", "--cluster", "1x8xH100",
                                      "--layout", "tp=8"])
    assert result.exit_code == 1, result.output
    assert "No feasible layout" in result.output and "What would fit: fp8 weights" in result.output
    result = CliRunner().invoke(app, ["explain", "--json", "--model", "llama-3.1-405b", "--cluster",
                                      "1x8xH100", "--layout", "tp=8"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["suggestions"]
    result = CliRunner().invoke(app, ["explain", "--workload", "train", "--model", "llama-3.1-405b",
                                      "--cluster", "1x8xH100", "--global-batch", "8", "--seq-len", "4096"])
    assert result.exit_code == 1 and "No configuration fits" in result.output


def test_user_errors_are_one_line_exit_2() -> None:
    result = CliRunner().invoke(app, ["explain", "--cluster", "1x8xH100"])
    assert result.exit_code == 2 and "--model" in result.output


@cache
def _combos() -> list[tuple[str, str]]:
    return [(m, c) for m in shipped_models() for c in shipped_clusters()]


@pytest.mark.parametrize(("model_name", "cluster_name"), _combos())
def test_every_section_renders_for_every_shipped_pair(model_name: str, cluster_name: str, checkerboard) -> None:
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    analysed = checkerboard(model_name, cluster_name)
    try:
        e = explain_serving(model, cluster, ServeRequest(), sensitivity.LIGHT if analysed else None)
    except SpecError as exc:
        assert "no feasible layout" in str(exc)
        return  # the infeasible pair is explained as such: that is the check
    out = Console(file=io.StringIO(), width=120, record=True)
    render_explanation(e, out)
    text = out.export_text(clear=False)
    for heading in ("Placement", "Memory per GPU", "Communication", "Pipeline timeline", "Time breakdown",
                    *(("How sure we are",) if analysed else ())):
        assert heading in text
    assert max(len(line) for line in text.splitlines()) <= 120
    ET.fromstring(out.export_svg())
