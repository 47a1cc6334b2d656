"""How long every `genoformer` command takes to answer `--help`, a mistyped option and a value of
the wrong type, each in a fresh interpreter as a user's shell starts it (median of --repeats runs),
and `genoformer --help` and `--version`.

    python -m benchmarks.command_speed --out OUT          # every command, about 5 minutes on 2 cores
    python -m benchmarks.command_speed --out OUT --commands prepare_timeseries forecast --repeats 5

The load average is recorded with the table: on a shared machine the figures move with the load.
"""

from __future__ import annotations

import inspect
import os
import statistics
import subprocess
import sys
import time

from benchmarks.common import REPO_ROOT, Benchmark, Summary, table
from genoformer.cli import TOOL_COMMANDS, TRAINING_COMMANDS, parsing_function


def seconds(args: list[str], repeats: int) -> tuple[float, int]:
    """(median wall seconds, exit code) of `genoformer ARGS` in a fresh interpreter."""
    times, code = [], 0
    for _ in range(repeats):
        began = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-c", "from genoformer.cli import main; main()", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - began)
        code = result.returncode
    return statistics.median(times), code


def wrong_value(command: str) -> list[str]:
    """A numeric option of the command given a word (`--batch_size many`), or [] when it has none."""
    if command in TRAINING_COMMANDS:
        return [command, "--trainer.max_steps", "many"]
    for parameter in inspect.signature(parsing_function(TOOL_COMMANDS[command])).parameters.values():
        if parameter.annotation in (int, float):
            return [command, f"--{parameter.name}", "many"]
    return []


def arguments(parser) -> None:
    parser.add_argument("--commands", nargs="+", default=[*TOOL_COMMANDS, *TRAINING_COMMANDS])
    parser.add_argument("--repeats", type=int, default=3)


def measure(args) -> dict:
    commands, repeats = (["prepare"], 1) if args.smoke else (args.commands, args.repeats)
    load = os.getloadavg()[0]
    rows = [
        {
            "command": "genoformer",
            "help": seconds(["--help"], repeats)[0],
            "version": seconds(["--version"], repeats)[0],
        }
    ]
    for command in commands:
        row = {
            "command": command,
            "help": seconds([command, "--help"], repeats)[0],
            "unknown_option": seconds([command, "--no_such_option", "1"], repeats)[0],
        }
        if wrong_value(command):
            row["wrong_value"] = seconds(wrong_value(command), repeats)[0]
        rows.append(row)
    return {"repeats": repeats, "load_average": [load, os.getloadavg()[0]], "rows": rows}


def summarize(data: dict) -> Summary:
    rows = [
        {
            "command": r["command"],
            "--help s": r["help"],
            "unknown option s": r.get("unknown_option"),
            "wrong value s": r.get("wrong_value"),
            "--version s": r.get("version"),
        }
        for r in data["rows"]
    ]
    load = data["load_average"]
    return Summary(
        tables=[
            table(
                rows,
                f"Median of {data['repeats']} fresh interpreters; load average {load[0]:.1f} "
                f"before, {load[1]:.1f} after",
            )
        ]
    )


BENCHMARK = Benchmark(
    "command_speed", "Command-line answers: --help and option errors", __doc__, measure, summarize, arguments=arguments
)

if __name__ == "__main__":
    BENCHMARK.main()
