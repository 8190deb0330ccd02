"""The ``relearn`` command: one entry point (``main``), one module per group of verbs.

Exit codes, the same for every verb (every help page ends with them: ``relearn.cli.help_layout``):
  0  everything asked for was done
  1  done, but some inputs were rejected (each is listed with file, line and field) or nothing
     matched (another pool's reviews, an empty pool, filters that keep nothing: a warning says so)
  2  nothing done: bad usage or unusable input
  3  (relearn run, relearn demo) a stage failed; the stages after it did not run
  130  interrupted (Ctrl-C); the line names the command that goes on (import: also what it kept)

A problem is one line on stderr, ``error: <what is wrong with which path>; <what to do>``, never a
traceback (``relearn.cli.errors``); an error relearn did not foresee says it is a bug (exit 1), and
``--debug`` shows the traceback.
"""
