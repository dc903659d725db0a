"""Merges JSON files into one object keyed by each file's name without .json (run.sh's gtest.json)."""
import json
import os
import sys


def main(argv):
    merged = {}
    for path in argv[2:]:
        name = os.path.basename(path)[: -len(".json")] if path.endswith(".json") else path
        try:
            with open(path, encoding="utf-8") as f:
                merged[name] = json.load(f)
        except (OSError, ValueError) as error:
            merged[name] = {"unreadable": str(error)}
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
