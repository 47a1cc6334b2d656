"""`pytest --cpu-durations=N`: the N tests that took the most CPU time (0 lists all), and the total.

Wall time on a shared machine says more about the neighbours than about a test; CPU time (user +
system of the pytest process and of the children it waited for, such as a `genoformer fit` run
in a subprocess) does not. Each phase's time travels on its report, so that with pytest-xdist the
controller sums every worker's tests; `--cpu-durations-file PATH` writes them all as TSV
(test id, setup, call, teardown, wall seconds), a line as each test ends, so that a run cut short
still leaves what it measured. Collection and start-up are counted apart.
"""

from __future__ import annotations

import resource
import time

import pytest


def cpu_seconds() -> float:
    """User + system time of this process and of its waited-for children, in seconds."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu times")
    group.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests that took the most CPU time (0: all), and the total",
    )
    group.addoption(
        "--cpu-durations-file",
        default=None,
        metavar="PATH",
        help="write every test's CPU seconds per phase to PATH (TSV)",
    )


class CpuTimes:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tests: dict[str, dict[str, float]] = {}
        self.collection = {}
        # pytest-xdist's workers measure, its controller writes
        self.path = None if hasattr(config, "workerinput") else config.getoption("cpu_durations_file")
        if self.path:
            with open(self.path, "w") as f:
                f.write("test\tsetup\tcall\tteardown\twall\n")

    def _timed(self, item: pytest.Item, phase: str):
        before, wall = cpu_seconds(), time.perf_counter()
        yield
        item.stash.setdefault(PHASES, {})[phase] = (cpu_seconds() - before, time.perf_counter() - wall)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._timed(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._timed(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._timed(item, "teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        cpu, wall = item.stash.get(PHASES, {}).get(call.when, (0.0, 0.0))
        outcome.get_result().user_properties.append(("cpu_s", (cpu, wall)))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self, session):
        before = cpu_seconds()
        yield
        self.collection["main"] = cpu_seconds() - before

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, (cpu, wall) in report.user_properties:
            if key == "cpu_s":
                phases = self.tests.setdefault(report.nodeid, {})
                phases[report.when] = cpu
                phases["wall"] = phases.get("wall", 0.0) + wall
                if self.path and report.when == "teardown":
                    with open(self.path, "a") as f:
                        f.write(
                            f"{report.nodeid}\t{phases.get('setup', 0):.3f}\t{phases.get('call', 0):.3f}\t"
                            f"{cpu:.3f}\t{phases['wall']:.3f}\n"
                        )

    def pytest_terminal_summary(self, terminalreporter) -> None:
        totals = {nodeid: sum(v for k, v in phases.items() if k != "wall") for nodeid, phases in self.tests.items()}
        ranked = sorted(totals.items(), key=lambda kv: -kv[1])
        count = self.config.getoption("cpu_durations")
        if count is not None:
            terminalreporter.write_sep("=", "CPU time per test (setup + call + teardown)")
            for nodeid, seconds in ranked[: count or None]:
                terminalreporter.write_line(f"{seconds:9.2f}s  {nodeid}")
            terminalreporter.write_line(
                f"tests: {sum(totals.values()):.1f} CPU-s in {len(totals)} tests; this process since it started: "
                f"{cpu_seconds():.1f} CPU-s (collection {self.collection.get('main', 0.0):.1f})"
            )


PHASES = pytest.StashKey[dict]()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("cpu_durations") is not None or config.getoption("cpu_durations_file"):
        config.pluginmanager.register(CpuTimes(config), "cpu_times_recorder")
