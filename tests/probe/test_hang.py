"""Naming the collective that hung: the point markers and the one-line errors (no torch)."""

import os

from planner.probe import hang
from planner.probe.hang import failed_message, timed_out_message
from planner.probe.runner import parse_progress

ALL_REDUCE_2_3 = hang.Point("all_reduce", "intra_node", (2, 3), 1_048_576)
SEND_RECV_0_8 = hang.Point("send_recv", "inter_node", (0, 8), 4096)


def fed(*lines_at: tuple[str, float]) -> hang.InFlight:
    in_flight = hang.InFlight()
    for line, now_s in lines_at:
        in_flight.feed(line + "\n", now_s)
    return in_flight


def test_the_message_names_op_group_size_link_and_each_lagging_rank():
    in_flight = fed(
        (hang.start_line(ALL_REDUCE_2_3, 3, "node1"), 100.0),
        (hang.start_line(ALL_REDUCE_2_3, 2, "node1"), 101.0),
    )
    assert in_flight.describe(130.0) == (
        "all_reduce over ranks [2, 3] (intra-node, 1,048,576 B) did not finish within 30 s "
        "on rank 2 (host node1), rank 3 (host node1)"
    )


def test_a_collective_open_under_a_second_is_not_called_hung():
    """A --timeout that ends 0.3 s into a collective: it was still running, and a longer
    --timeout may let it finish ("did not finish within 0 s" had blamed it; a CLI read)."""
    in_flight = fed((hang.start_line(ALL_REDUCE_2_3, 2, "node1"), 10.0))
    assert in_flight.describe(10.3) == (
        "all_reduce over ranks [2, 3] (intra-node, 1,048,576 B) was still running (0.3 s in; a longer "
        "--timeout may let it finish) on rank 2 (host node1)"
    )


def test_a_finished_point_is_no_longer_open():
    in_flight = fed(
        (hang.start_line(ALL_REDUCE_2_3, 2, "node1"), 1.0),
        (hang.start_line(ALL_REDUCE_2_3, 3, "node1"), 1.0),
        (hang.end_line(2), 2.0),
    )
    assert in_flight.describe(31.0).endswith("within 30 s on rank 3 (host node1)")
    in_flight.feed(hang.end_line(3), 3.0)
    assert in_flight.describe(31.0) is None  # a hang between points: no collective to name


def test_points_are_named_longest_open_first_and_counted_past_three():
    in_flight = fed(
        (hang.start_line(ALL_REDUCE_2_3, 2, "a"), 5.0),
        (hang.start_line(SEND_RECV_0_8, 8, "b"), 1.0),
    )
    assert in_flight.describe(11.0) == (
        "send_recv over ranks [0, 8] (inter-node, 4,096 B) did not finish within 10 s on rank 8 "
        "(host b); all_reduce over ranks [2, 3] (intra-node, 1,048,576 B) did not finish within "
        "6 s on rank 2 (host a)"
    )
    many = fed(
        *(
            (hang.start_line(hang.Point("all_gather", "world", (r,), 8 << r), r, "h"), float(r))
            for r in range(5)
        )
    )
    assert many.describe(10.0).endswith("; and 2 more")
    assert many.describe(10.0).count("did not finish") == 3


def test_markers_are_not_progress_and_other_lines_are_not_markers():
    line = hang.start_line(ALL_REDUCE_2_3, 3, "node1")
    assert parse_progress(line) is None
    in_flight = hang.InFlight()
    assert not in_flight.feed("@@plan-probe-progress 1 2 intra_node all_reduce 8 B\n", 0.0)
    assert not in_flight.feed("NCCL INFO ...\n", 0.0)
    assert in_flight.feed(f"{hang.POINT_PREFIX} start {{not json\n", 0.0)  # ignored, not raised
    assert in_flight.describe(1.0) is None


def test_timed_out_and_failed_messages_are_one_line():
    hung = fed((hang.start_line(ALL_REDUCE_2_3, 3, "node1"), 0.0)).describe(30.0)
    assert timed_out_message(60, hung, []) == (
        "probe timed out after 60 s: all_reduce over ranks [2, 3] (intra-node, 1,048,576 B) did "
        "not finish within 30 s on rank 3 (host node1); stopped torchrun and its workers"
    )
    assert timed_out_message(60, None, []) == (
        "probe timed out after 60 s (a rank hung or a node never joined the rendezvous); "
        "stopped torchrun and its workers"
    )
    watchdog = "rank 3 on node1 failed: DistBackendError: Watchdog caught collective operation timeout"
    assert failed_message(watchdog, hung, ["/o/plan-probe-nccl-trace-rank3"]) == (
        f"probe failed: {hung}; {watchdog}; NCCL flight-recorder dumps: "
        "/o/plan-probe-nccl-trace-rank3 (read them with torchfrtrace)"
    )
    killed = "rank 1 on node1 died of SIGKILL"  # not a timeout: the death is the cause
    assert failed_message(killed, hung, []) == f"probe failed: {killed}"


def test_flight_recorder_env_and_its_dumps(tmp_path):
    env = hang.flight_recorder_env(str(tmp_path))
    prefix = str(tmp_path / hang.FLIGHT_RECORDER_FILE_PREFIX)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0 and int(env["TORCH_FR_BUFFER_SIZE"]) > 0
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    old = tmp_path / f"{hang.FLIGHT_RECORDER_FILE_PREFIX}0"
    old.write_bytes(b"x")
    os.utime(old, (1000.0, 1000.0))  # an earlier run's dump is not this run's
    for rank in (1, 2, 3):
        (tmp_path / f"{hang.FLIGHT_RECORDER_FILE_PREFIX}{rank}").write_bytes(b"x")
    dumps = hang.flight_recorder_dumps(env, since_s=2000.0)
    assert dumps == [f"{prefix}{rank}" for rank in (1, 2, 3)]
    assert hang.dumps_note(dumps) == (
        f"; NCCL flight-recorder dumps: {prefix}1, {prefix}2 and 1 more (read them with torchfrtrace)"
    )
    assert hang.flight_recorder_dumps({}, 0.0) == [] and hang.dumps_note([]) == ""


def test_flight_recorder_dumps_go_beside_the_profile(tmp_path, monkeypatch):
    from pathlib import Path

    from planner.probe.launcher import ProbeOptions, flight_recorder_directory

    assert flight_recorder_directory(ProbeOptions(out=tmp_path / "m.yaml")) == str(tmp_path)
    assert flight_recorder_directory(ProbeOptions(merge_into=tmp_path / "p.yaml")) == str(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert flight_recorder_directory(ProbeOptions()) == str(Path.cwd())
