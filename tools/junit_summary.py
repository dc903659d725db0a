"""Counts test cases in bazel-testlogs/**/test.xml and prints `N passed, M failed`.

A target that failed without writing test cases (crash, timeout, build error)
counts as one failed case, so a red build can never print "0 failed".
Exit status: 0 only when nothing failed and bazel itself succeeded.
"""
import os
import sys
import xml.etree.ElementTree as ET


def count(testlogs):
    passed = failed = skipped = 0
    for dirpath, _, files in os.walk(testlogs):
        if "test.xml" not in files:
            continue
        try:
            tree = ET.parse(os.path.join(dirpath, "test.xml"))
        except ET.ParseError:
            failed += 1
            continue
        cases = list(tree.iter("testcase"))
        target_failed = False
        for suite in tree.iter("testsuite"):
            if int(suite.get("failures", 0)) + int(suite.get("errors", 0)) > 0:
                target_failed = True
        case_failures = 0
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                case_failures += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                skipped += 1
            else:
                passed += 1
        if target_failed and case_failures == 0:
            failed += 1
    return passed, failed, skipped


def main():
    testlogs, bazel_rc = sys.argv[1], int(sys.argv[2])
    passed, failed, skipped = count(testlogs) if os.path.isdir(testlogs) else (0, 0, 0)
    # bazel exit 3 = some test failed (already counted); anything else non-zero
    # is a build or infrastructure failure that produced no test.xml.
    if bazel_rc not in (0, 3) and failed == 0:
        failed = 1
    if passed + failed == 0:
        failed = 1  # a run that executed no test is a failure
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 0 if failed == 0 and bazel_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
