"""The ``relearn`` command: one entry point (``main``), one module per group of verbs.

Exit codes, the same for every verb:
  0  everything asked for was done
  1  done, but some inputs were rejected (each is listed with file, line and field)
  2  nothing done: bad usage or unusable input
  3  (relearn run, relearn demo) a stage failed; the stages after it did not run
"""
