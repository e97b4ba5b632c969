"""Real torchrun runs with gloo on CPU: one node of 2 ranks, 2 loopback nodes, a dead rank, a hung rank."""

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from .conftest import TINY_SWEEP, free_port, probe_argv, probe_env, run_probe_cli

pytestmark = pytest.mark.usefixtures("needs_torch")


def load_through_core(path):
    """planner.specs.load_cluster once the core has it; structural asserts in the tests either way."""
    specs = pytest.importorskip("planner.specs")
    return specs.load_cluster(path)


def assert_profile_shape(document, num_nodes, gpus_per_node):
    assert document["num_nodes"] == num_nodes
    assert document["gpus_per_node"] == gpus_per_node
    assert document["gpu"] == "A100-SXM4-80GB"
    measured = document["measured"]
    assert (
        measured["tool"] == "plan probe"
        and measured["backend"] == "gloo"
        and measured["device"] == "cpu"
    )
    assert measured["nccl_version"] is None
    assert any("CPU run" in flag for flag in measured["flags"])
    assert any("loopback/CPU" in flag for flag in measured["flags"])
    for curve in measured["allreduce_curves"]:
        assert len(curve["sizes_bytes"]) == len(curve["median_seconds"]) >= 2
        assert curve["sizes_bytes"] == sorted(curve["sizes_bytes"])
        assert all(t > 0 for t in curve["median_seconds"])
    for row in measured["results"]:
        assert row["busbw_bytes_per_s"] > 0 and row["spread_fraction"] >= 0


def test_one_node_two_ranks_writes_profile_and_merges(tmp_path):
    existing = tmp_path / "profile.yaml"
    existing.write_text(
        "# my cluster\nname: lab\nsource: hand-written\nnum_nodes: 1\ngpus_per_node: 2\ngpu: H100-SXM5-80GB\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450.0, latency_us: 3.0}\n"
    )
    out = tmp_path / "measured.yaml"
    result = run_probe_cli(
        "--nproc-per-node",
        "2",
        *TINY_SWEEP,
        "--timeout",
        "60",
        "--out",
        str(out),
        "--merge-into",
        str(existing),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["raw"]["nodes"] == [[0, 1]]
    ops = {(r["op"], r["link"]) for r in payload["profile"]["measured"]["results"]}
    assert ops == {
        (op, "intra_node") for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
    }

    document = yaml.safe_load(out.read_text())
    assert_profile_shape(document, 1, 2)
    assert (
        document["intra_node"]["kind"] == "pcie"
        and document["intra_node"]["bandwidth_gb_per_s"] > 0
    )
    assert "inter_node" not in document
    assert [c["link"] for c in document["measured"]["allreduce_curves"]] == ["intra_node"]
    assert {"intra_node_all_reduce", "intra_node_send_recv"} <= set(document["measured"]["fits"])
    load_through_core(out)

    merged = yaml.safe_load(existing.read_text())
    assert (merged["name"], merged["source"], merged["gpu"]) == (
        "lab",
        "hand-written",
        "H100-SXM5-80GB",
    )
    assert merged["intra_node"]["kind"] == "nvlink"  # kind kept, numbers measured
    assert (
        merged["intra_node"]["bandwidth_gb_per_s"] == document["intra_node"]["bandwidth_gb_per_s"]
    )
    assert any("comments" in flag for flag in merged["measured"]["flags"])
    load_through_core(existing)


def start_loopback_nodes(tmp_path, num_nodes, nproc_per_node):
    port = free_port()
    args = [
        "--nnodes",
        str(num_nodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"test-{port}",
        "--local-addr",
        "127.0.0.1",
        "--run",
        *TINY_SWEEP,
        "--timeout",
        "90",
    ]
    return [
        subprocess.Popen(
            probe_argv(*args, "--out", str(tmp_path / f"node{i}.yaml")),
            env=probe_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(num_nodes)
    ]


def finish(processes):
    outputs = [p.communicate(timeout=120) for p in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    return outputs


def the_written_profile(tmp_path, num_nodes):
    written = [
        tmp_path / f"node{i}.yaml"
        for i in range(num_nodes)
        if (tmp_path / f"node{i}.yaml").exists()
    ]
    assert len(written) == 1, "exactly the node that got rank 0 writes the profile"
    return written[0]


def test_two_loopback_nodes_report_an_inter_node_link(tmp_path):
    outputs = finish(start_loopback_nodes(tmp_path, 2, 1))
    assert any("node that got rank 0" in stdout for stdout, _ in outputs)
    path = the_written_profile(tmp_path, 2)
    document = yaml.safe_load(path.read_text())
    assert_profile_shape(document, 2, 1)
    assert "intra_node" not in document
    inter = document["inter_node"]
    assert (
        inter["kind"] == "ethernet"
        and inter["num_nics_per_node"] == 1
        and inter["nic_bandwidth_gbit_per_s"] > 0
    )
    measured = document["measured"]
    assert measured["inter_node_basis"] == "one_rank_per_node"
    assert any("lower bound" in flag for flag in measured["flags"])
    assert any("share hostname" in flag for flag in measured["flags"])
    assert [c["link"] for c in measured["allreduce_curves"]] == ["inter_node"]
    assert {r["link"] for r in measured["results"]} == {"inter_node"}
    assert {tuple(r["ranks"]) for r in measured["results"]} == {(0, 1)}
    load_through_core(path)


def test_two_loopback_nodes_of_two_ranks_sum_concurrent_inter_node_traffic(tmp_path):
    finish(start_loopback_nodes(tmp_path, 2, 2))
    document = yaml.safe_load(the_written_profile(tmp_path, 2).read_text())
    assert_profile_shape(document, 2, 2)
    measured = document["measured"]
    assert measured["inter_node_basis"] == "all_local_ranks"
    per_rank_bytes_per_s = measured["fits"]["inter_node_all_reduce"]["bandwidth_bytes_per_s"]
    if per_rank_bytes_per_s is None:  # a noisy loopback sweep may never leave the latency regime
        per_rank_bytes_per_s = max(
            r["busbw_bytes_per_s"]
            for r in measured["results"]
            if (r["op"], r["link"], r["mode"]) == ("all_reduce", "inter_node", "all_local_ranks")
        )
    node_gbit_per_s = 2 * per_rank_bytes_per_s * 8 / 1e9  # two local ranks crossing at once
    assert document["inter_node"]["nic_bandwidth_gbit_per_s"] == pytest.approx(
        node_gbit_per_s, rel=1e-3
    )
    links = {(c["link"], c["num_ranks"]) for c in measured["allreduce_curves"]}
    assert links == {("intra_node", 2), ("inter_node", 2), ("world", 4)}
    assert "inter_node_all_reduce_one_rank_per_node" in measured["fits"]
    load_through_core(the_written_profile(tmp_path, 2))


def process_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def worker_pid(launcher_pid, local_rank):
    from planner.probe.runner import descendant_pids

    for pid in descendant_pids(launcher_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if b"planner.probe.worker" in cmdline and f"LOCAL_RANK={local_rank}".encode() in environ:
            return pid
    return None


def start_long_run_and_wait_for_progress(tmp_path, timeout_s):
    out = tmp_path / "never.yaml"
    args = [
        "--nproc-per-node",
        "2",
        "--backend",
        "gloo",
        "--max-bytes",
        "1048576",
        "--iterations",
        "200",
        "--repeats",
        "50",
        "--timeout",
        str(timeout_s),
        "--out",
        str(out),
    ]
    process = subprocess.Popen(
        probe_argv(*args),
        env=probe_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line = process.stderr.readline()  # the first per-phase progress line: ranks are mid-sweep
    assert first_line.startswith("plan probe: ["), first_line
    pid = worker_pid(process.pid, 1)
    assert pid is not None
    return process, out, pid


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds worker processes through /proc")
def test_killed_rank_ends_the_run_with_one_line_and_no_file(tmp_path):
    process, out, pid = start_long_run_and_wait_for_progress(tmp_path, 60)
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 60
    assert process.returncode == 2
    assert stderr.strip().splitlines()[-1].startswith("plan probe: probe failed:")
    assert "Traceback" not in stderr
    assert not out.exists() and not list(tmp_path.iterdir())
    print(stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds worker processes through /proc")
def test_hung_rank_ends_the_run_within_the_timeout(tmp_path):
    process, out, pid = start_long_run_and_wait_for_progress(tmp_path, 10)
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)  # a rank that stops answering
    stdout, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 10 + 10
    assert process.returncode == 2
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("plan probe: probe ") and ("timed out" in last or "failed" in last)
    assert "Traceback" not in stderr
    assert not out.exists()
    assert worker_pid(process.pid, 1) is None
    assert process_state(pid) in (None, "Z"), "the stopped rank was killed (a zombie at most)"
    print(last)
