"""Counts test cases of the given Bazel test targets and prints `N passed, M failed`.

Usage: junit_summary.py TESTLOGS_DIR BAZEL_EXIT_CODE LABEL...

Each label's bazel-testlogs/<package>/<name>/test.xml is read; a target
without one, or whose suite reports failures without failed cases (crash,
timeout), counts as one failed case. When Bazel could not build or run the
tests (exit code other than 0 or 3), every target counts as failed, since its
test.xml may be stale. A run that executed nothing is a failure.
Exit status: 0 only when nothing failed and Bazel itself succeeded.
"""
import os
import sys
import xml.etree.ElementTree as ET


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
    testlogs, bazel_rc, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    passed = failed = skipped = 0
    if bazel_rc not in (0, 3):
        failed = max(1, len(labels))
    else:
        for label in labels:
            p, f, s = count_target(xml_path(testlogs, label))
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
