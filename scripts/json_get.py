#!/usr/bin/env python3
"""Prints one field of a JSON file (a report) or counts JSON lines (a metrics file), parsed.

Usage: json_get.py FILE KEY [FORMAT]        the value of KEY (a.b for nested keys, a.0 for a list's first), printed
                                            with FORMAT (e.g. %.1f) when given
       json_get.py --count-lines FILE TYPE  how many lines of a JSON-lines file have "type": TYPE
"""
import json
import sys


def main(argv):
    if len(argv) >= 3 and argv[0] == "--count-lines":
        with open(argv[1]) as f:
            print(sum(1 for line in f if line.strip() and json.loads(line).get("type") == argv[2]))
        return 0
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        value = json.load(f)
    for part in argv[1].split("."):  # a list's element by its index: membership.0.step
        value = value[int(part)] if isinstance(value, list) else value[part]
    print(argv[2] % value if len(argv) == 3 else value, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
