#!/usr/bin/env python3
"""Runs test modules by dotted label, as Django's tests/runtests.py does: unittest's text
runner at the given verbosity; the exit status is 1 when a test failed or erred."""

import argparse
import sys
import unittest


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("labels", nargs="*", default=["tests"])
    parser.add_argument("--verbosity", type=int, default=1)
    args = parser.parse_args()
    suite = unittest.defaultTestLoader.loadTestsFromNames(args.labels)
    result = unittest.TextTestRunner(verbosity=args.verbosity).run(suite)
    return int(not result.wasSuccessful())


if __name__ == "__main__":
    sys.exit(main())
