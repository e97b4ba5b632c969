"""Profile building and merging from synthetic worker results (no torch)."""

import os

import pytest
import yaml

from planner.catalog import load_cluster
from planner.probe import profile, results
from planner.probe.sweep import op_coefficients

SIZES_BYTES = [8, 1024, 65536, 1 << 20, 16 << 20]


def seconds(op, num_ranks, alpha_seconds, bandwidth_bytes_per_s, size_bytes):
    steps, factor = op_coefficients(op, num_ranks)
    return steps * alpha_seconds + factor * size_bytes / bandwidth_bytes_per_s


def synthetic_raw(slow_node_factor=1.0):
    """2 nodes x 2 ranks: intra 100 GB/s 5 us per rank (node 1 optionally slower), inter 10 GB/s 20 us per rank."""
    nodes = [[0, 1], [2, 3]]
    phases = [
        dict(op="all_reduce", link="intra_node", mode="all_local_ranks", groups=nodes),
        dict(op="all_reduce", link="inter_node", mode="all_local_ranks", groups=[[0, 2], [1, 3]]),
        dict(op="send_recv", link="inter_node", mode="one_rank_per_node", groups=[[0, 2]]),
    ]
    link = {"intra_node": (5e-6, 100e9), "inter_node": (20e-6, 10e9)}
    rows = []
    for index, phase in enumerate(phases):
        for group_index, ranks in enumerate(phase["groups"]):
            alpha, beta = link[phase["link"]]
            if phase["link"] == "intra_node" and group_index == 1:
                beta *= slow_node_factor
            for size in SIZES_BYTES:
                t = seconds(phase["op"], len(ranks), alpha, beta, size)
                for rank in ranks:
                    rows.append(
                        dict(
                            phase=index,
                            group=group_index,
                            size_bytes=size,
                            rank=rank,
                            repeat_seconds=[t, t * 1.01, t * 0.99],
                        )
                    )
    return dict(
        backend="nccl",
        device="cuda",
        torch_version="2.13.0",
        nccl_version="2.27.3",
        world_size=4,
        nodes=nodes,
        hostnames=["a", "b"],
        node_id_from="group-rank",
        sizes_bytes=SIZES_BYTES,
        warmup=1,
        iterations=1,
        repeats=3,
        phases=phases,
        rows=rows,
        compute=[
            dict(
                rank=r,
                device_name="NVIDIA H100 80GB HBM3",
                memory_bytes=85 * 2**30,
                matmul_flop_per_s={"bf16": 7.5e14, "fp16": 7.6e14},
                hbm_copy_bytes_per_s=2.9e12,
            )
            for r in range(4)
        ],
    )


def build(raw, declared=None):
    rows = results.summarize_rows(raw)
    return profile.build_profile(
        raw, rows, results.fit_all(rows), profile.ProfileChoices(), declared
    )


def test_links_in_file_units_and_inter_node_is_the_sum_over_local_ranks():
    document = build(synthetic_raw())
    assert document["intra_node"] == {
        "kind": "nvlink",
        "bandwidth_gb_per_s": 100.0,
        "latency_us": 5.0,
    }
    inter = document["inter_node"]
    # 2 local ranks x 10 GB/s = 20 GB/s per node = 160 Gbit/s on one NIC
    assert (inter["kind"], inter["num_nics_per_node"]) == ("infiniband", 1)
    assert inter["nic_bandwidth_gbit_per_s"] == pytest.approx(160.0, rel=1e-3)
    assert inter["latency_us"] == pytest.approx(20.0, rel=1e-3)
    assert document["measured"]["inter_node_basis"] == "all_local_ranks"
    assert document["gpu"]["name"] == "H100-SXM5-80GB"
    assert document["gpu"]["achievable_matmul_tflops"] == {"bf16": 750.0, "fp16": 760.0}
    assert document["measured"]["matmul_tflops"]["bf16"] == 750.0
    assert document["measured"]["hbm_bandwidth_gb_per_s"] == 2900.0


def test_slow_node_and_above_spec_links_are_flagged():
    declared = {"intra_node": {"kind": "nvlink", "bandwidth_gb_per_s": 50.0, "latency_us": 3.0}}
    flags = build(synthetic_raw(slow_node_factor=0.3), declared)["measured"]["flags"]
    slow = "slow intra_node all_reduce (2 ranks): ranks [2, 3] on node 1 (b), local rank(s) 0, 1"
    assert any(f.startswith(slow) for f in flags), flags
    assert any("exceeds the declared 50.0 GB/s" in f for f in flags), flags


def test_merge_keeps_everything_but_link_numbers():
    existing = {
        "name": "lab",
        "num_nodes": 2,
        "gpus_per_node": 8,
        "gpu": "H100",
        "intra_node": {"kind": "nvlink", "bandwidth_gb_per_s": 450.0, "latency_us": 3.0},
        "inter_node": {
            "kind": "roce",
            "num_nics_per_node": 4,
            "nic_bandwidth_gbit_per_s": 400.0,
            "latency_us": 8.0,
        },
    }
    measured = build(synthetic_raw(), existing)
    merged, warnings = profile.merge_profile(existing, measured)
    assert (merged["name"], merged["gpu"], merged["gpus_per_node"]) == ("lab", "H100", 8)
    assert (
        merged["intra_node"]["kind"] == "nvlink"
        and merged["intra_node"]["bandwidth_gb_per_s"] == 100.0
    )
    assert merged["inter_node"]["kind"] == "roce" and merged["inter_node"]["num_nics_per_node"] == 4
    # 2 ranks a node measured 160 Gbit/s together, 80 each; the profile's 8 GPUs a node keep
    # 80 each: 8 * 80 / 4 NICs = 160 Gbit/s a NIC (it had been 160 / 4 = 40, each GPU a quarter
    # of its rank's rate: a read)
    assert merged["inter_node"]["nic_bandwidth_gbit_per_s"] == pytest.approx(160.0, rel=1e-3)
    assert warnings[0] == "gpus_per_node: profile says 8, measured 2; kept 8"
    assert "scaled to the profile's 8" in warnings[1] and len(warnings) == 2
    assert existing["intra_node"]["bandwidth_gb_per_s"] == 450.0  # input untouched
    assert "source" not in merged  # none to amend
    sourced, _ = profile.merge_profile({**existing, "source": "vendor datasheet; run plan probe"}, measured)
    assert sourced["source"].startswith("vendor datasheet; run plan probe (intra_node and inter_node replaced by "
                                        "plan probe measurements, ") and sourced["source"].endswith(", nccl; see measured)")
    again, _ = profile.merge_profile(sourced, measured)  # a second merge says it once
    assert again["source"] == sourced["source"]


def test_document_loads_through_the_core_schema(tmp_path):
    path = tmp_path / "m.yaml"
    profile.atomic_write_text(path, profile.dump_yaml(build(synthetic_raw())))
    cluster = load_cluster(path)
    assert cluster.num_nodes == 2 and cluster.gpus_per_node == 2
    assert cluster.allreduce_curve("intra_node", 2) is not None
    # rank j of every node is a data-parallel shape, not the TP group tp=2 would price
    assert cluster.allreduce_curve("inter_node", 2) is None


def test_failed_write_leaves_neither_target_nor_temp(tmp_path, monkeypatch):
    path = tmp_path / "m.yaml"
    path.write_text("old: 1\n")

    def broken_replace(source, target):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        profile.atomic_write_text(path, "new: 2\n")
    assert yaml.safe_load(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.yaml"]


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after it)."""
    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_a_new_profile_gets_the_umask_default_not_the_temp_files_0600(tmp_path, umask, mask):
    umask(mask)
    path = tmp_path / "m.yaml"
    profile.atomic_write_text(path, "new: 2\n")
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664, 0o444])
def test_a_rewritten_profile_keeps_its_mode(tmp_path, umask, mode):
    umask(0o077)  # would give 0600 to a new file: the old mode must win
    path = tmp_path / "m.yaml"
    path.write_text("old: 1\n")
    path.chmod(mode)
    profile.atomic_write_text(path, "new: 2\n")
    assert path.stat().st_mode & 0o777 == mode
    assert yaml.safe_load(path.read_text()) == {"new": 2}


def test_writing_through_a_symlink_replaces_the_file_it_points_to(tmp_path):
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "m.yaml"
    real.write_text("old: 1\n")
    link = tmp_path / "m.yaml"
    link.symlink_to(real)
    profile.atomic_write_text(link, "new: 2\n")
    assert link.is_symlink() and yaml.safe_load(real.read_text()) == {"new": 2}
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["m.yaml"]


def with_all_to_all(raw, collectives=None):
    """synthetic_raw plus an intra-node all-to-all phase over the nodes, timed like the
    intra-node all-reduce's link (5 us per step, 100 GB/s per rank)."""
    raw = dict(raw, phases=[*raw["phases"], dict(raw["phases"][0], op="all_to_all")])
    index = len(raw["phases"]) - 1
    t = {s: seconds("all_to_all", 2, 5e-6, 100e9, s) for s in SIZES_BYTES}
    raw["rows"] = raw["rows"] + [
        dict(phase=index, group=g, size_bytes=s, rank=r, repeat_seconds=[t[s]] * 3)
        for g, ranks in enumerate(raw["nodes"])
        for r in ranks
        for s in SIZES_BYTES
    ]
    if collectives is not None:
        raw["collectives"] = collectives
    return raw


def test_all_to_all_gets_a_curve_and_a_fit_of_its_own():
    """2 ranks, S = 16 MiB = 16777216 bytes each: T = 1 x 5 us + 1/2 x 16777216 / 100e9 s
    = 5 us + 83.886 us = 88.886 us; the fit gives 5 us and 100 GB/s back."""
    measured = build(with_all_to_all(synthetic_raw()))["measured"]
    (curve,) = measured["alltoall_curves"]
    assert (curve["link"], curve["num_ranks"], curve["sizes_bytes"]) == (
        "intra_node",
        2,
        SIZES_BYTES,
    )
    assert curve["median_seconds"][-1] == pytest.approx(88.886e-6, rel=1e-4)
    fit = measured["fits"]["intra_node_all_to_all"]
    assert fit["alpha_seconds"] == pytest.approx(5e-6, rel=1e-3)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(100e9, rel=1e-3)
    assert measured["bandwidth_gb_per_s_by_op"]["intra_node"]["all_to_all"] == pytest.approx(100.0)
    assert [c["num_ranks"] for c in measured["allreduce_curves"]] == [2]  # all-reduce apart


def test_merge_keeps_all_to_all_curves_a_run_did_not_time():
    earlier = build(with_all_to_all(synthetic_raw()))
    kept, notes = profile.merge_profile(
        earlier, build(synthetic_raw() | {"collectives": ["all_reduce"]})
    )
    assert kept["measured"]["alltoall_curves"] == earlier["measured"]["alltoall_curves"]
    assert notes == [
        "alltoall_curves: all_to_all not timed in this run; kept the profile's earlier curves"
    ]
    retimed = build(with_all_to_all(synthetic_raw(), ["all_reduce", "all_to_all"]))
    replaced, notes = profile.merge_profile(earlier, retimed)
    assert replaced["measured"]["alltoall_curves"] == retimed["measured"]["alltoall_curves"]
    assert notes == []


def test_a_poor_fit_of_a_reported_collective_is_flagged():
    """An all-gather fit whose rms relative residual is 41% feeds bandwidth_gb_per_s_by_op like
    any other: it is flagged as the all-reduce's poor fit is (it went unflagged; found by a CLI
    sweep). A good reduce-scatter fit is not."""
    from planner.probe.fit import AlphaBetaFit
    from planner.probe.profile import bandwidths_section

    fits = {"intra_node_all_reduce": (None, AlphaBetaFit(1e-5, 1e9, 6, 0.05)),
            "intra_node_all_gather": (None, AlphaBetaFit(1e-5, 2e9, 6, 0.41)),
            "intra_node_reduce_scatter": (None, AlphaBetaFit(1e-5, 2e9, 6, 0.10))}
    flags: list[str] = []
    section = bandwidths_section(fits, nccl=False, flags=flags)
    assert set(section["intra_node"]) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert flags == ["intra_node all_gather: poor alpha-beta fit (rms relative residual 41%)"]


def test_every_poor_fit_the_profile_keeps_is_flagged_once():
    """The world_* and all-to-all series at 33-48% went unflagged (a critical read): every fit in
    measured.fits above 25% gets a flag, labelled as the others, unless one names it already."""
    from planner.probe.fit import AlphaBetaFit
    from planner.probe.profile import flag_every_poor_fit

    fits = {"intra_node_all_reduce": (2, AlphaBetaFit(1e-5, 1e9, 6, 0.51)),
            "intra_node_all_to_all": (2, AlphaBetaFit(1e-5, 1e9, 6, 0.48)),
            "world_all_gather": (4, AlphaBetaFit(1e-5, 1e9, 6, 0.43)),
            "world_all_reduce": (4, AlphaBetaFit(1e-5, 1e9, 6, 0.20))}
    fits["inter_node_send_recv_one_rank_per_node"] = (2, AlphaBetaFit(1e-5, 1e9, 6, 0.41))
    flags = ["intra_node all_reduce: poor alpha-beta fit (rms relative residual 51%)",
             "inter_node send_recv: poor alpha-beta fit (rms relative residual 41%)"]
    flag_every_poor_fit(fits, flags)
    # the one-rank-per-node series is the link figures' send/recv, flagged by its op alone already
    assert flags[2:] == ["intra_node all_to_all: poor alpha-beta fit (rms relative residual 48%)",
                         "world all_gather: poor alpha-beta fit (rms relative residual 43%)"]


def test_a_profile_the_planner_would_refuse_still_prints_what_was_measured(tmp_path, capsys):
    """A sweep whose figures fall outside the profile schema (here an intra-node link of 1 MB/s,
    under its 0.01 GB/s floor) is not written, as before, but its table is printed first: the
    sweep's minutes had been lost with the file (a critical read). Exit by the same one-line
    error; no file is left."""
    from planner.probe.launcher import _report
    from planner.probe.options import ProbeOptions
    from planner.probe.runner import ProbeError

    raw = synthetic_raw(slow_node_factor=1e-5)  # node 1's intra-node link at 1 MB/s
    target = tmp_path / "slow.yaml"
    with pytest.raises(ProbeError, match="not written: the planner could not load it"):
        _report(raw, ProbeOptions(out=str(target), nproc_per_node=2), None)
    assert "medians at the largest size, and alpha-beta fits" in capsys.readouterr().out
    assert not target.exists()


def test_the_worker_refuses_to_run_without_torchrun(tmp_path):
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items()
           if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-m", "planner.probe.worker", "--result-path", str(tmp_path / "r.json")],
                            capture_output=True, text=True, env=env, cwd=os.path.dirname(os.path.dirname(
                                os.path.dirname(os.path.abspath(__file__)))))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("plan probe: the worker runs under torchrun (missing RANK")


def test_plan_explain_says_its_links_were_probed(tmp_path):
    """`plan` names a probed profile's source on its cluster line; `plan explain` had said nothing
    of it, nor of a gloo run's host-path figures (a critical read): its notes now carry both."""
    from planner.catalog import resolve_model
    from planner.explain import explain_serving
    from planner.requests import ServeRequest

    raw = synthetic_raw()
    path = tmp_path / "probed.yaml"
    path.write_text(yaml.safe_dump(build(raw)))
    notes = explain_serving(resolve_model("llama-3.1-8b"), load_cluster(path), ServeRequest(), None).notes
    assert any(note.startswith("links measured by plan probe") for note in notes)
    assert not any("gloo" in note for note in notes)
    gloo = tmp_path / "gloo.yaml"
    gloo.write_text(yaml.safe_dump(build({**raw, "backend": "gloo", "device": "cpu"})))
    gloo_notes = explain_serving(resolve_model("llama-3.1-8b"), load_cluster(gloo), ServeRequest(), None).notes
    assert any("measured with gloo on the hosts' CPUs" in note for note in gloo_notes)


def test_the_gpu_asked_for_is_written_as_the_catalog_names_it():
    """`--gpu h100` had been written as `gpu: h100` (it loads, but `plan gpus` and every other
    profile say H100-SXM5-80GB: a critical read)."""
    from dataclasses import replace as replaced

    raw = {**synthetic_raw(), "compute": []}
    rows = results.summarize_rows(raw)
    document = profile.build_profile(raw, rows, results.fit_all(rows),
                                     replaced(profile.ProfileChoices(), gpu="h100"), None)
    assert document["gpu"] == "H100-SXM5-80GB"
    assert profile.canonical_gpu_name("no-such-gpu") == "no-such-gpu"
