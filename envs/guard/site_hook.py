"""relearn's runner guard, loaded when an interpreter starts, where neither the command line nor
an environment variable can bring it.

``relearn_guard.pth``, which the test script copies into the site-packages of the task's
interpreter (the container is thrown away after the run), runs this file at interpreter start,
before ``sys.path`` gets the work directory and before any repository code, but only when one of
two things holds (every other interpreter of the environment only pays for that test):

- the command line names the guard as a pytest plugin (``-p relearn_guard``) and the process is
  not tox itself: tox runs pytest with an environment of its own, filtered by ``passenv``, so
  the guard cannot come through ``PYTHONPATH`` and its report path cannot come through
  ``RELEARN_GUARD_REPORT``. Here the guard module is imported by its path (a ``relearn_guard.py``
  in the work directory cannot stand in front of it), with the report path the ``.pth`` line
  carries; pytest then finds it loaded and registers it, and it starts as it does under
  ``launch.py``;
- ``RELEARN_GUARD_CHILD`` is set: the guard of a runner that reruns itself in a child (SymPy's
  ``bin/test``) put it into that child's environment. The child's guard starts here, writes its
  own report beside the parent's, and takes the variable out so that the processes the tests
  start do not load it.

Plain Python 3.6 with the standard library; it never prints, and never raises (a failure here
leaves the report missing, which the verifier reads as a run nobody watched).
"""

import os
import sys

GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relearn_guard.py")
VARIABLE = "RELEARN_GUARD_CHILD"


def _load(report):
    loaded = sys.modules.get("relearn_guard")
    if loaded is not None:
        return loaded
    import importlib.util

    spec = importlib.util.spec_from_file_location("relearn_guard", GUARD)
    module = importlib.util.module_from_spec(spec)
    sys.modules["relearn_guard"] = module
    spec.loader.exec_module(module)
    module.REPORT = report
    return module


def _names_the_plugin(args):
    for i, word in enumerate(args):
        if word == "-prelearn_guard" or (word == "-p" and args[i + 1 : i + 2] == ["relearn_guard"]):
            return True
    return False


def _main(pytest_report):
    child = os.environ.pop(VARIABLE, "")
    if child:
        number, framework, parent_report = child.split(":", 2)
        if number.isdigit() and parent_report:
            report = os.path.join(os.path.dirname(parent_report), f"child-{number}.json")
            _load(report).start(framework, child=number)
        return
    args = list(getattr(sys, "argv", None) or [])
    if pytest_report and args and "tox" not in os.path.basename(str(args[0])) and _names_the_plugin(args[1:]):
        _load(pytest_report)


try:
    _main(PYTEST_REPORT)  # noqa: F821 - given by the .pth line that runs this file
except Exception:  # noqa: BLE001 - never in the way of the interpreter; a missing report says it
    pass
