"""benchmarks.common, the harness: rounds, timing, budgets, failures recorded, statistics, child
processes, cells and verdicts, result files and the command line every script shares."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest
import torch

from benchmarks.common import (
    Attempts,
    Benchmark,
    Budget,
    Summary,
    Timer,
    TrainStep,
    at_least,
    at_most,
    block_bootstrap,
    fmt,
    interleaved_rounds,
    kept_weights,
    logged_messages,
    markdown_table,
    median,
    read_result,
    render,
    rotating_rounds,
    run_logged,
    table,
    time_calls,
    verdict,
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
    assert interleaved_rounds({"t": iter([3.0, 1.0, 2.0]).__next__}, rounds=3, best=min) == {"t": 1.0}


def test_rotating_rounds_start_each_round_one_measurement_later_and_keep_every_round():
    calls = []
    kept = rotating_rounds({name: (lambda name=name: calls.append(name) or len(calls)) for name in "abc"}, rounds=3)
    assert calls == list("abcbcacab")
    assert kept == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}


def test_time_calls_and_the_timer_warm_up_first_and_time_each_call():
    counted = []
    times = time_calls(lambda: counted.append(1), torch.device("cpu"), warmup=2, calls=5)
    assert len(counted) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    assert median([5.0, 1.0, 3.0, 2.0]) == 3.0  # the upper middle: always a measured value
    x = torch.ones(3, requires_grad=True)
    x.grad = torch.ones(3)
    assert Timer("cpu", warmup_ms=0, rep_ms=1)(lambda: x.sum(), grad_to_none=[x]) >= 0 and x.grad is None


def test_a_budget_is_spent_after_its_seconds_and_attempts_record_failures():
    assert not Budget(60).spent and Budget(-1).spent and "60 s" in Budget(60).skipped()
    attempts = Attempts()
    assert attempts.attempt("fine", lambda: 3) == (3, None)
    value, error = attempts.attempt("broken", lambda: 1 / 0)
    assert value is None and error == "ZeroDivisionError: division by zero"
    assert len(attempts.tracebacks) == 1 and attempts.tracebacks[0].startswith("== broken\nTraceback")


def test_a_train_step_changes_the_weights_and_kept_weights_puts_them_back():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(8, 4)
    step = TrainStep(
        lambda: model(x).square().mean(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.device("cpu"),
        torch.float32,
    )
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


def test_the_block_bootstrap_brackets_the_weighted_mean_difference():
    rng = np.random.default_rng(1)
    bases = rng.integers(100, 200, size=400).astype(float)
    mean, low, high = block_bootstrap(0.01 * bases + rng.normal(0, 0.5, 400), bases)
    assert low < mean < high and low < 0.01 < high and high - low < 0.005
    assert block_bootstrap(np.ones(5), np.ones(5)) == (1.0, 1.0, 1.0)  # no spread, no interval


def test_run_logged_keeps_the_output_and_raises_with_its_tail(tmp_path):
    run_logged([sys.executable, "-c", "print('hello')"], tmp_path / "ok.log")
    assert (tmp_path / "ok.log").read_text() == "hello\n"
    with pytest.raises(RuntimeError, match=r"failed \(3\)(.|\n)*line 29"):
        run_logged(
            [sys.executable, "-c", "import sys; print('\\n'.join(f'line {i}' for i in range(30))); sys.exit(3)"],
            tmp_path / "bad.log",
        )


def test_cells_tables_and_verdicts():
    assert [fmt(v) for v in (None, 12345, 0.72371, 1.9164, 95050.4, 2.5e-5, float("nan"), "ok")] == [
        "",
        "12,345",
        "0.724",
        "1.92",
        "95,050",
        "2.5e-05",
        "NaN",
        "ok",
    ]
    assert fmt(1.9164, 5) == "1.9164"
    assert at_least("fast", 1.3, 1.2, "x") == {"target": "fast", "measured": "1.30x", "status": "MET"}
    assert at_most("small", 0.4, 0.3, measured="worst 0.4 (phage)")["status"] == "NOT MET"
    assert at_most("missing", None, 1.0)["status"] == "NOT MEASURED" == verdict("t", "m", None)["status"]
    text = markdown_table([{"a": 1.5, "b": "x|y"}, {"a": None, "b": "z"}])
    assert text.splitlines() == ["| a | b |", "| ---: | --- |", "| 1.50 | x\\|y |", "|  | z |"]
    assert table([{"a": 1}, {"b": 2}], "cap")["columns"] == ["a", "b"]


def _toy(measured: list) -> Benchmark:
    def arguments(parser):
        parser.add_argument("--size", type=int, default=4)

    def measure(args):
        measured.append(args)
        return {"cases": {str(args.size): 2.0 * args.size}}

    def summarize(data):
        rows = [{"size": int(k), "ms": v} for k, v in data["cases"].items()]
        worst = max(r["ms"] for r in rows)
        return Summary(
            tables=[table(rows, "Toy")],
            targets=[at_most("ms <= 10", worst, 10.0, " ms")],
            notes=["a fact"],
            failed=worst > 100,
        )

    def merge(runs):
        return {"cases": {k: v for run in runs for k, v in run["cases"].items()}}

    return Benchmark(
        "toy", "Toy benchmark", "A toy.", measure, summarize, baseline="nothing", arguments=arguments, merge=merge
    )


def test_a_benchmark_measures_writes_its_result_and_prints_it(tmp_path, capsys):
    measured = []
    result = _toy(measured).main(["--out", str(tmp_path), "--smoke", "--size", "3"])
    assert measured[0].smoke and measured[0].size == 3
    assert read_result(tmp_path / "toy.json") == json.loads((tmp_path / "toy.json").read_text()) == result
    assert result["command"] == "python -m benchmarks.toy --out " + str(tmp_path) + " --smoke --size 3"
    assert result["environment"]["device_type"] in ("cpu", "cuda") and result["baseline"] == "nothing"
    assert result["summary"]["targets"][0]["status"] == "MET" and result["data"] == {"cases": {"3": 6.0}}
    printed = capsys.readouterr().out
    assert printed.startswith("## Toy benchmark\n\n`python -m benchmarks.toy") and "| 3 | 6.00 |" in printed
    assert " · same-run baseline: nothing" in printed and printed.rstrip().endswith("- a fact")
    assert not list(tmp_path.glob(".*"))  # nothing left of the atomic write


def test_from_summarizes_earlier_results_again_and_joins_several(tmp_path):
    toy = _toy([])
    toy.main(["--out", str(tmp_path / "a"), "--size", "3"])
    toy.main(["--out", str(tmp_path / "b"), "--size", "7"])
    joined = toy.main(
        [
            "--out",
            str(tmp_path),
            "--name",
            "toy_both",
            "--from",
            str(tmp_path / "a" / "toy.json"),
            str(tmp_path / "b" / "toy.json"),
        ]
    )
    assert joined["name"] == "toy_both" and (tmp_path / "toy_both.json").is_file()
    assert joined["data"] == {"cases": {"3": 6.0, "7": 14.0}} and "; then " in joined["command"]
    assert joined["summary"]["targets"][0]["status"] == "NOT MET"
    assert render(joined, headline_only=True).count("| 7 | 14.0 |") == 1


def test_the_command_line_refuses_what_it_cannot_do(tmp_path, capsys):
    toy = _toy([])
    with pytest.raises(SystemExit):
        toy.main(["--out", str(tmp_path), "--name", "../elsewhere"])
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="is not a benchmark result file"):
        toy.main(["--out", str(tmp_path), "--from", str(tmp_path / "other.json")])
    assert "--name must be a file name" in capsys.readouterr().err
