"""The JSONL dataset parser's errors and vllm bench serve-style arrivals."""

import pytest

from planner.errors import SpecError
from planner.workload import arrival_times_seconds, load_dataset, workload_requests


def test_loads_and_cycles(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"input_len": 10, "output_len": 5}\n\n{"input_len": 3, "output_len": 1}\n')
    rows, lines = load_dataset(f)
    assert rows == ((10, 5), (3, 1))
    assert lines == (1, 3)  # the blank line 2 is skipped, the file's numbering kept
    reqs = workload_requests(rows, 3, float("inf"))
    assert [(r.input_len, r.output_len, r.arrival_seconds) for r in reqs] == [
        (10, 5, 0.0),
        (3, 1, 0.0),
        (10, 5, 0.0),
    ]


@pytest.mark.parametrize(
    "text, where",
    [
        ('{"input_len": 1, "output_len": 1}\nnot json\n', ": line 2: not valid JSON"),
        ('{"input_len": 1}\n', ": line 1: output_len: missing"),
        ('{"input_len": 1, "output_len": 1, "x": 2}\n', ": line 1: x: unknown field"),
        ('{"input_len": 0, "output_len": 1}\n', ": line 1: input_len: 0 is not positive"),
        ('{"input_len": 1.5, "output_len": 1}\n', ": line 1: input_len: 1.5 is not an integer"),
        ('{"input_len": true, "output_len": 1}\n', ": line 1: input_len: true is not an integer"),
        ("\n\n", ": no requests"),
        ('{"input_len": 100, "input_len": 5000, "output_len": 1}\n', ": line 1: input_len: given twice"),
        ('\n{"input_len": 100000000000000000000, "output_len": 10}\n', ": line 2: input_len: 100,000,000,000,000,000,000 "
                                                                      "is above 134,217,728 tokens"),
        ('{"input_len": ' + "1" * 5001 + ', "output_len": 1}\n', ": line 1: not a request line (Exceeds the limit"),
        ("[" * 5000 + "]" * 5000 + "\n", ": line 1: not a request line (nested too deeply)"),
    ],
)
def test_each_mistake_is_one_line_naming_file_line_and_field(tmp_path, text, where):
    f = tmp_path / "d.jsonl"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_dataset(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(f)) and where in msg


def test_a_file_too_large_is_not_read(tmp_path, monkeypatch):
    """/dev/zero never ends: the reader stops one byte past the cap and refuses."""
    import planner.workload as workload

    monkeypatch.setattr(workload, "MAX_DATASET_BYTES", 64)
    f = tmp_path / "d.jsonl"
    f.write_text('{"input_len": 10, "output_len": 5}\n' * 3)
    with pytest.raises(SpecError, match="larger than"):
        load_dataset(f)


def test_a_pipe_is_not_read(tmp_path):
    """A FIFO (or /dev/zero) would block or never end: refused before it is opened."""
    import os

    fifo = tmp_path / "d.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_dataset(fifo)


def test_unreadable_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_dataset(tmp_path / "missing.jsonl")


def test_arrivals_reproducible_and_scaled_like_vllm():
    a = arrival_times_seconds(100, 4.0, seed=3)
    assert a == arrival_times_seconds(100, 4.0, seed=3)
    assert a != arrival_times_seconds(100, 4.0, seed=4)
    assert list(a) == sorted(a)
    # vLLM rescales so the last request goes at num_prompts / rate.
    assert a[-1] == pytest.approx(25.0)
    assert arrival_times_seconds(3, float("inf")) == (0.0, 0.0, 0.0)


def test_arrivals_whose_gamma_draws_all_underflow_go_at_the_rescales_end():
    """A gamma shape of 1e-300 draws 0.0 every time: vLLM's rescale to N / rate would divide by
    0, so every request goes at N / rate = 2 / 4 = 0.5 s (the CLI refuses such shapes:
    requests.MIN_BURSTINESS); at the smallest shape taken the arrivals stay ordered and end there."""
    assert arrival_times_seconds(2, 4.0, burstiness=1e-300) == (0.5, 0.5)
    tiny = arrival_times_seconds(200, 4.0, seed=1, burstiness=0.01)
    assert list(tiny) == sorted(tiny) and tiny[-1] == pytest.approx(50.0)


def test_dataset_rows_are_shuffled_and_oversampled_as_vllm_bench_serve():
    """vllm bench serve's custom dataset: random.seed(0); random.shuffle(rows); the first N;
    when the file is shorter, random.seed(0) again and random.choice from those
    (benchmarks/datasets/datasets.py, vLLM 0.33.0)."""
    import random

    from planner.workload import sampled_dataset_lengths

    rows = tuple((100 * k, k) for k in range(1, 11))
    expected = list(rows)
    random.seed(0)
    random.shuffle(expected)
    assert sampled_dataset_lengths(rows, 4) == tuple(expected[:4])
    longer = sampled_dataset_lengths(rows, 15)
    random.seed(0)
    assert longer == (*expected, *(random.choice(expected) for _ in range(5)))
    assert sorted(sampled_dataset_lengths(rows, 10)) == sorted(rows)


def test_a_length_mix_weights_context_by_decode_steps_and_squares_prompts():
    """Rows (1,000 in, 100 out) and (100 in, 900 out): means I = 550, O = 500, I + O/2 = 800;
    decode-weighted context (100 * 1,050 + 900 * 550) / 1,000 = 600 (the long output decodes at
    the short prompt's context); pairs (1,000 * 1,001 / 2 + 100 * 101 / 2) / 2 = 252,775,
    against 550 * 551 / 2 = 151,525 for the mean prompt."""
    from planner.requests import ServeRequest

    mix = ServeRequest(input_len=550, output_len=500, dataset_lengths=((1000, 100), (100, 900)))
    assert mix.decode_context_tokens == 600
    assert mix.prompt_pairs == 252_775
    plain = ServeRequest(input_len=550, output_len=500)
    assert plain.decode_context_tokens == 800 and plain.prompt_pairs == 151_525


def test_a_key_given_twice_is_named_once(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"input_len": 100, "input_len": 5000, "output_len": 1}\n')
    with pytest.raises(SpecError) as e:
        load_dataset(f)
    assert str(e.value) == f"{f}: line 1: input_len: given twice"  # was wrapped in "not a request line (...)"


def test_a_bad_byte_names_its_line_and_a_byte_order_mark_is_read(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"input_len": 5, "output_len": 5}\n\n{"input_len": \xff5, "output_len": 5}\n')
    with pytest.raises(SpecError) as e:
        load_dataset(f)
    assert str(e.value) == f"{f}: line 3: not UTF-8 text (byte 0xff)"
    f.write_bytes(b'\xef\xbb\xbf{"input_len": 5, "output_len": 7}\n')
    assert load_dataset(f) == (((5, 7),), (1,))
