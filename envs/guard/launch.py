"""relearn's launcher for a test runner: ``python launch.py FRAMEWORK SCRIPT ARGS...`` or
``python launch.py FRAMEWORK -m MODULE ARGS...``, run from the work directory.

It runs the runner as the interpreter would have (``__main__``, ``__file__``, ``sys.argv``, the
script's own folder on ``sys.path``) but for one thing: the work directory is never at the head
of ``sys.path``, so nothing a patch adds there can stand in front of a module the runner or its
tests import from the standard library or the installed packages. Python before 3.11 (most
SWE-bench images) has neither ``-P`` nor ``PYTHONSAFEPATH``.

- ``-m MODULE``: ``python -m`` puts the work directory first; here it is left out, as ``-P``
  leaves it out.
- ``SCRIPT`` in a folder of its own (Django's ``tests/runtests.py``, SymPy's ``bin/test``): that
  folder goes first, as the interpreter puts it; the work directory is not on the path unless the
  runner puts it there itself (SymPy's ``bin/test`` does, and keeps that).
- ``SCRIPT`` in the work directory itself: the runner still imports its siblings (the package,
  the tests), but from the end of the path, after the standard library and installed packages.

Before the runner starts, the guard (``relearn_guard``, beside this file) takes the identity of
the runner's machinery; it is loaded from this folder by its path, and this folder is taken off
``sys.path`` again.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_guard():
    import importlib.util

    spec = importlib.util.spec_from_file_location("relearn_guard", os.path.join(HERE, "relearn_guard.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["relearn_guard"] = module
    spec.loader.exec_module(module)
    return module


def main():
    while sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == os.path.realpath(HERE):
        del sys.path[0]
    if len(sys.argv) < 3:
        sys.stderr.write("usage: launch.py FRAMEWORK (SCRIPT | -m MODULE) [ARGS...]\n")
        sys.exit(2)
    framework, args = sys.argv[1], sys.argv[2:]
    guard = _load_guard()
    workdir = os.path.realpath(os.getcwd())
    if args[0] == "-m":
        if len(args) < 2:
            sys.stderr.write("launch.py: -m needs a module\n")
            sys.exit(2)
        if framework != "pytest":
            guard.start(framework)  # pytest's plugin starts when pytest registers it (-p relearn_guard)
        import runpy

        sys.argv = [args[1]] + args[2:]  # runpy sets argv[0] to the module's file, as -m does
        runpy._run_module_as_main(args[1], alter_argv=True)
        return
    script = args[0]
    folder = os.path.dirname(os.path.realpath(script))
    if folder == workdir:
        sys.path.append(folder)
    else:
        sys.path.insert(0, folder)
    with open(script, "rb") as handle:
        source = handle.read()
    code = compile(source, script, "exec", dont_inherit=True)
    guard.start(framework)
    sys.argv = list(args)
    main_module = sys.modules["__main__"]
    namespace = main_module.__dict__
    builtins = namespace["__builtins__"]
    namespace.clear()
    import importlib.machinery

    loader = importlib.machinery.SourceFileLoader("__main__", script)
    namespace.update(
        {
            "__name__": "__main__",
            "__file__": script,
            "__builtins__": builtins,
            "__doc__": None,
            "__package__": None,
            "__spec__": None,
            "__loader__": loader,
            "__cached__": None,
        }
    )
    exec(code, namespace)


if __name__ == "__main__":
    main()
