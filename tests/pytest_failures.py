"""A pytest plugin for device calls (`-p pytest_failures`, tests/ on PYTHONPATH): each failing test's report is
appended to $FAILURES_FILE as it happens, so a run cut at its time limit still says what failed and why; with
$DURATIONS_FILE set, every test's outcome and seconds (setup + call + teardown) too, so such a run still says which
files took its time."""

import os


def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.environ["FAILURES_FILE"], "a") as f:
            f.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
    durations = os.environ.get("DURATIONS_FILE")
    if durations:
        with open(durations, "a") as f:
            f.write(f"{report.duration:9.2f} {report.when:8s} {report.outcome:7s} {report.nodeid}\n")
