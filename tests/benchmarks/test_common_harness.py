"""benchmarks.common's harness: interleaved rounds, timing, the weights kept, the messages
collected, and the result files of `publish`."""

from __future__ import annotations

import json
import logging

import torch

from benchmarks.common import (
    TrainStep,
    interleaved_rounds,
    kept_weights,
    logged_messages,
    median,
    publish,
    time_calls,
)


def test_interleaved_rounds_alternate_the_measurements_and_keep_each_best():
    calls, rates = [], {"a": iter([3.0, 5.0, 4.0]), "b": iter([9.0, 7.0, 8.0])}

    def measure(name):
        def run():
            calls.append(name)
            return next(rates[name])
        return run

    pair = iter([{"cold": 1.0, "warm": 6.0}, {"cold": 2.0, "warm": 5.0}, {"cold": 0.5, "warm": 7.0}])
    best = interleaved_rounds({"a": measure("a"), "b": measure("b"), "pair": lambda: next(pair)}, rounds=3)
    assert calls == ["a", "b"] * 3  # one of each per round, not three of one then three of the other
    assert best == {"a": 5.0, "b": 9.0, "cold": 2.0, "warm": 7.0}
    fastest = interleaved_rounds({"t": iter([3.0, 1.0, 2.0]).__next__}, rounds=3, best=min)
    assert fastest == {"t": 1.0}


def test_time_calls_warms_up_first_and_times_each_call():
    counted = []
    times = time_calls(lambda: counted.append(1), torch.device("cpu"), warmup=2, calls=5)
    assert len(counted) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    assert median([5.0, 1.0, 3.0, 2.0]) == 3.0  # the upper middle: always a measured value


def test_a_train_step_changes_the_weights_and_kept_weights_puts_them_back():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(8, 4)
    step = TrainStep(lambda: model(x).square().mean(), torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.device("cpu"), torch.float32)
    with kept_weights(model):
        step.step()
        assert not torch.equal(model.weight, before[0])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_logged_messages_collects_inside_the_block_only():
    logger = logging.getLogger("genoformer.kernels")
    with logged_messages() as messages:
        logger.info("backend %r", "triton")
    logger.info("after the block")
    assert messages == ["backend 'triton'"]


def test_publish_writes_the_summary_the_text_and_the_section(tmp_path, capsys):
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose\n")
    publish(tmp_path / "out", "bench", {"rows": [1, 2]}, "## Bench\n\n| a |", markdown, "bench-section")
    assert json.loads((tmp_path / "out" / "bench.json").read_text()) == {"rows": [1, 2]}
    assert (tmp_path / "out" / "bench.md").read_text() == "## Bench\n\n| a |\n"
    text = markdown.read_text()
    assert text.startswith("# Benchmarks\n\nprose\n") and "<!-- bench-section:start -->\n## Bench" in text
    assert capsys.readouterr().out.strip().endswith("| a |")  # the text is printed last
    assert not list((tmp_path / "out").glob(".*tmp*"))  # nothing left of the atomic writes
