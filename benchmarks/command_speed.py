"""How long every `genoformer` command takes to answer `--help`, a mistyped option and a value of
the wrong type, each in a fresh interpreter as a user's shell starts it (median of --repeats runs),
and `genoformer --help` and `--version`.

    python -m benchmarks.command_speed                      # a table on stdout
    python -m benchmarks.command_speed --out speed.json     # and the figures as JSON
    python -m benchmarks.command_speed --commands prepare_timeseries forecast --repeats 5

The machine's CPU count and load average are printed with the table: on a shared machine the
figures move with the load.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from genoformer.cli import TOOL_COMMANDS, TRAINING_COMMANDS, parsing_function

REPO_ROOT = Path(__file__).resolve().parents[1]


def seconds(args: list[str], repeats: int) -> tuple[float, int]:
    """(median wall seconds, exit code) of `genoformer ARGS` in a fresh interpreter."""
    times, code = [], 0
    for _ in range(repeats):
        began = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", "from genoformer.cli import main; main()", *args],
                                cwd=REPO_ROOT, capture_output=True, text=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", nargs="+", default=[*TOOL_COMMANDS, *TRAINING_COMMANDS])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [{"command": "genoformer", "help": seconds(["--help"], args.repeats)[0],
             "version": seconds(["--version"], args.repeats)[0]}]
    for command in args.commands:
        row = {"command": command, "help": seconds([command, "--help"], args.repeats)[0],
               "unknown_option": seconds([command, "--no_such_option", "1"], args.repeats)[0]}
        if wrong_value(command):
            row["wrong_value"] = seconds(wrong_value(command), args.repeats)[0]
        rows.append(row)
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"median of {args.repeats} runs, seconds")
    print("| command | --help | unknown option | wrong value |\n|---|---|---|---|")
    for row in rows:
        if row["command"] == "genoformer":
            print(f"| genoformer | {row['help']:.2f} | (--version {row['version']:.2f}) | |")
            continue
        wrong = f"{row['wrong_value']:.2f}" if "wrong_value" in row else ""
        print(f"| {row['command']} | {row['help']:.2f} | {row['unknown_option']:.2f} | {wrong} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"cpus": os.cpu_count(), "load_average": load, "repeats": args.repeats,
                                        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
