"""Counts test cases of the given Bazel test targets and prints `N passed, M failed`.

Usage: junit_summary.py [--bep=FILE] TESTLOGS_DIR BAZEL_EXIT_CODE LABEL...

Each label's bazel-testlogs/<package>/<name>/test.xml is read; a target
without one, or whose suite reports failures without failed cases (crash,
timeout), counts as one failed case. With --bep (Bazel's
--build_event_json_file of the same run), a target Bazel says did not pass
(a binary that wrote a clean XML and then crashed, say) whose XML shows no
failure counts one failed case too. When Bazel could not build or run the
tests (exit code other than 0 or 3), every target counts as failed, since its
test.xml may be stale. A run that executed nothing is a failure.
Exit status: 0 only when nothing failed and Bazel itself succeeded.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET

# Bazel's overall test statuses that are a pass (FLAKY: passed on a retry).
PASSING = {"PASSED", "FLAKY"}


def bep_statuses(path):
    """Label -> overall status from a --build_event_json_file; {} when unreadable."""
    statuses = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                summary = event.get("id", {}).get("testSummary")
                if summary and "testSummary" in event:
                    # "@@//a:b" or "@//a:b" in some Bazel versions; `bazel query` says "//a:b".
                    label = summary.get("label", "").lstrip("@")
                    statuses[label] = event["testSummary"].get("overallStatus", "NO_STATUS")
    except OSError:
        return {}
    return statuses


def xml_path(testlogs, label):
    package, _, name = label.lstrip("/").partition(":")
    return os.path.join(testlogs, package, name, "test.xml")


def count_target(path):
    """Returns (passed, failed, skipped) test cases of one target."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return 0, 1, 0
    passed = failed = skipped = 0
    suite_failed = False
    for suite in tree.iter("testsuite"):
        if int(suite.get("failures", 0)) + int(suite.get("errors", 0)) > 0:
            suite_failed = True
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            skipped += 1
        else:
            passed += 1
    if (suite_failed and failed == 0) or passed + failed + skipped == 0:
        failed += 1
    return passed, failed, skipped


def main():
    args = sys.argv[1:]
    statuses = {}
    if args and args[0].startswith("--bep="):
        statuses = bep_statuses(args.pop(0)[len("--bep="):])
    testlogs, bazel_rc, labels = args[0], int(args[1]), args[2:]
    passed = failed = skipped = 0
    if bazel_rc not in (0, 3):
        failed = max(1, len(labels))
    else:
        for label in labels:
            p, f, s = count_target(xml_path(testlogs, label))
            status = statuses.get(label)
            if f == 0 and status is not None and status not in PASSING:
                f = 1  # Bazel saw it fail (exit status, crash after the XML, timeout)
            passed, failed, skipped = passed + p, failed + f, skipped + s
    if passed + failed == 0:
        failed = 1
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 0 if failed == 0 and bazel_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
