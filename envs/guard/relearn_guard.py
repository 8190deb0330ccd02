"""relearn's runner guard, loaded in the test process before any repository code.

It runs inside the task's own interpreter (SWE-bench images run Python 3.6 to 3.11), so it is
plain Python 3.6 with nothing but the standard library, and it never prints: the test output is
what is graded, and must stay byte for byte what the runner writes.

What it does: it takes the identity of the runner's test-call machinery when it loads (pytest's
``Function.runtest``, its runner and report functions, unittest's ``TestCase.run`` and result
methods), checks it again around every test and at the end, and records every change with
where the new object was defined; under pytest it also records every plugin registered after it
and every implementation of the test-call and report hooks, with the file it comes from. At the
end it writes a JSON report to ``$RELEARN_GUARD_REPORT`` (a path with a nonce, outside the
repository); the verifier reads it back and judges it (``envs.runner_guard``). Loaded as a
pytest plugin (``-p relearn_guard``) or by ``launch.py`` for scripts and ``-m`` runners.

PYTEST_DONT_REWRITE: this module is often imported before pytest (``launch.py``, ``site_hook.py``);
without the marker pytest warns in the graded log that it cannot rewrite its asserts.
"""

import atexit
import json
import os
import sys

REPORT = os.environ.get("RELEARN_GUARD_REPORT", "")
WORKDIR = os.path.realpath(os.getcwd())
PID = os.getpid()
# Hook names whose implementations decide what a test's outcome is, or how it is reported.
HOOK_PREFIXES = (
    "pytest_runtest_",
    "pytest_report_",
    "pytest_pyfunc_call",
    "pytest_collection_modifyitems",
    "pytest_pycollect_makeitem",
    "pytest_make_collect_report",
    "pytest_collectreport",
    "pytest_terminal_summary",
)

_watched = []  # [owner, attribute, label, object at load]
_changes = []
_seen_changes = set()
_plugins = []
_hooks = {}
_baseline_hooks = set()
_state = {
    "framework": "",
    "child": "",
    "tests": 0,
    "checks": 0,
    "finished": False,
    "guard_registered": False,
    "manager": None,
    "signature": None,
}
# Runners that rerun themselves in a child interpreter, where the tests then run (SymPy's
# ``bin/test`` starts ``python -R -c ...`` for hash randomization): the child loads the guard
# too (see ``site_hook.py``), and its report is folded into this one.
RERUNS_IN_CHILD = ("sympy",)
CHILD_VARIABLE = "RELEARN_GUARD_CHILD"
_children = []  # {"n", "command", "python", "required", "pid"}


def _inside(path):
    try:
        real = os.path.realpath(path)
    except (TypeError, ValueError):
        return False
    return real == WORKDIR or real.startswith(WORKDIR + os.sep)


def _rel(path):
    if not path:
        return ""
    try:
        real = os.path.realpath(path)
    except (TypeError, ValueError):
        return str(path)
    if real == WORKDIR or real.startswith(WORKDIR + os.sep):
        return os.path.relpath(real, WORKDIR)
    return str(path)


def _function(obj):
    """The plain function behind a method-like object (what its code and file are)."""
    for _ in range(8):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        elif hasattr(obj, "__func__"):
            obj = obj.__func__
        elif hasattr(obj, "__wrapped__") and not hasattr(obj, "__code__"):
            obj = obj.__wrapped__
        else:
            break
    return obj


def _describe(obj):
    """Qualified name and file (repository-relative when inside the work directory)."""
    if obj is None:
        return "(removed)", ""
    fn = _function(obj)
    code = getattr(fn, "__code__", None)
    name = "{}.{}".format(getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", getattr(fn, "__name__", type(fn).__name__)))
    if code is not None:
        return name, f"{_rel(code.co_filename)}:{code.co_firstlineno}"
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    return name, _rel(getattr(module, "__file__", "") or "")


def _watch(owner, names, prefix):
    if owner is None:
        return
    space = vars(owner)
    for name in names:
        if name in space:
            _watched.append([owner, name, prefix + "." + name, space[name]])


def _module(name):
    return sys.modules.get(name)


def _cls(module, name):
    return getattr(_module(module), name, None) if _module(module) is not None else None


UNITTEST_RESULT = (
    "addSuccess",
    "addFailure",
    "addError",
    "addSkip",
    "addExpectedFailure",
    "addUnexpectedSuccess",
    "addSubTest",
    "startTest",
    "stopTest",
    "wasSuccessful",
)


def watch_unittest():
    import unittest  # noqa: F401 - the runner's own machinery, from the standard library
    import unittest.case
    import unittest.result
    import unittest.runner
    import unittest.suite

    _watch(
        unittest.case.TestCase,
        ("run", "__call__", "_callTestMethod", "_callSetUp", "_callTearDown", "_addSkip", "debug", "_executeTestPart"),
        "unittest.case.TestCase",
    )
    _watch(getattr(unittest.case, "_Outcome", None), ("testPartExecutor",), "unittest.case._Outcome")
    _watch(unittest.result.TestResult, UNITTEST_RESULT, "unittest.result.TestResult")
    _watch(unittest.runner.TextTestResult, UNITTEST_RESULT + ("printErrors",), "unittest.runner.TextTestResult")
    _watch(unittest.runner.TextTestRunner, ("run", "_makeResult"), "unittest.runner.TextTestRunner")
    _watch(unittest.suite.TestSuite, ("run", "__call__"), "unittest.suite.TestSuite")
    _watch(unittest.suite.BaseTestSuite, ("run", "__call__"), "unittest.suite.BaseTestSuite")
    _watch(unittest.case, ("TestCase",), "unittest.case")
    _watch(unittest, ("TestCase", "TextTestRunner", "TestResult"), "unittest")


def watch_pytest():
    """pytest's test call, as loaded (pytest's own repository included: what the patch made it
    is the baseline, a change during the run is what counts)."""
    _watch(_cls("_pytest.python", "Function"), ("runtest", "setup", "_getobj"), "_pytest.python.Function")
    _watch(_module("_pytest.python"), ("pytest_pyfunc_call", "Function"), "_pytest.python")
    _watch(
        _cls("_pytest.unittest", "TestCaseFunction"),
        ("runtest", "setup", "teardown") + UNITTEST_RESULT,
        "_pytest.unittest.TestCaseFunction",
    )
    _watch(
        _module("_pytest.runner"),
        (
            "call_and_report",
            "call_runtest_hook",
            "runtestprotocol",
            "pytest_runtest_call",
            "pytest_runtest_makereport",
            "pytest_runtest_protocol",
            "check_interactive_exception",
        ),
        "_pytest.runner",
    )
    _watch(_cls("_pytest.runner", "CallInfo"), ("from_call", "__init__"), "_pytest.runner.CallInfo")
    _watch(_cls("_pytest.reports", "TestReport"), ("from_item_and_call", "__init__"), "_pytest.reports.TestReport")
    _watch(_cls("_pytest.reports", "BaseReport"), ("passed", "failed", "skipped"), "_pytest.reports.BaseReport")
    _watch(
        _module("_pytest.skipping"),
        ("pytest_runtest_makereport", "pytest_runtest_call", "pytest_runtest_setup", "pytest_report_teststatus"),
        "_pytest.skipping",
    )
    _watch(
        _cls("_pytest.terminal", "TerminalReporter"),
        ("pytest_runtest_logreport", "pytest_runtest_logstart"),
        "_pytest.terminal.TerminalReporter",
    )
    _watch(_cls("_pytest.junitxml", "LogXML"), ("pytest_runtest_logreport",), "_pytest.junitxml.LogXML")
    _watch(_module("_pytest.main"), ("pytest_runtestloop",), "_pytest.main")
    for module in ("pluggy._hooks", "pluggy.hooks", "pluggy._callers", "pluggy.callers"):
        for cls_name in ("HookCaller", "_HookCaller"):
            _watch(_cls(module, cls_name), ("__call__", "_hookexec", "call_historic"), module + "." + cls_name)
        _watch(_module(module), ("_multicall",), module)
    for module in ("pluggy._manager", "pluggy.manager"):
        _watch(_cls(module, "PluginManager"), ("_hookexec", "register", "unregister"), module + ".PluginManager")


# Runner code that loads from the repository (Django's, SymPy's): no baseline before it loads,
# so at the end each method is checked to be defined where its class is.
LATE = (
    ("django.test.runner", "DiscoverRunner", ("run_suite", "run_tests", "build_suite", "get_resultclass", "get_test_runner_kwargs")),
    ("django.test.runner", "RemoteTestResult", UNITTEST_RESULT),
    ("django.test.runner", "PDBDebugResult", UNITTEST_RESULT),
    ("django.test.testcases", "SimpleTestCase", ("__call__", "_setup_and_call", "run", "debug")),
    ("sympy.testing.runtests", "SymPyTests", ("test", "test_file", "_timeout", "_enhance_asserts", "get_test_files")),
    (
        "sympy.testing.runtests",
        "PyTestReporter",
        ("test_pass", "test_fail", "test_exception", "test_skip", "test_xfail", "test_xpass", "finish", "start"),
    ),
    ("sympy.utilities.runtests", "SymPyTests", ("test", "test_file", "_timeout", "_enhance_asserts", "get_test_files")),
    (
        "sympy.utilities.runtests",
        "PyTestReporter",
        ("test_pass", "test_fail", "test_exception", "test_skip", "test_xfail", "test_xpass", "finish", "start"),
    ),
)


def _record(label, old, new, when, how):
    key = (label, id(new))
    if key in _seen_changes:
        return
    _seen_changes.add(key)
    old_name, old_file = _describe(old)
    new_name, new_file = _describe(new)
    _changes.append({"what": label, "old": old_name, "old_file": old_file, "new": new_name, "new_file": new_file, "when": when, "how": how})


def check(when):
    _state["checks"] += 1
    for owner, name, label, original in _watched:
        now = vars(owner).get(name)
        if now is not original:
            _record(label, original, now, when, "replaced")


def _late_origins():
    for module_name, cls_name, names in LATE:
        cls = _cls(module_name, cls_name)
        if cls is None:
            continue
        home = os.path.realpath(getattr(_module(module_name), "__file__", "") or "")
        for name in names:
            fn = _function(vars(cls).get(name))
            code = getattr(fn, "__code__", None)
            if code is not None and home and os.path.realpath(code.co_filename) != home:
                _record(f"{module_name}.{cls_name}.{name}", None, vars(cls).get(name), "at the end", "defined outside its class's module")


def _shadows():
    """Top-level modules loaded from the work directory whose name is also found outside it
    (a module there stands in front of an installed or standard one)."""
    import importlib.machinery

    outside = [p for p in sys.path if p and isinstance(p, str) and not _inside(p)]
    found = []
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        path = getattr(module, "__file__", None)
        if not path or not _inside(path):
            continue
        try:
            other = importlib.machinery.PathFinder.find_spec(name, outside)
        except Exception:  # noqa: BLE001 - a finder that fails finds nothing
            other = None
        if other is not None or name in sys.builtin_module_names:
            found.append({"module": name, "file": _rel(path), "other": getattr(other, "origin", None) or "built-in"})
    return found


# --- pytest: the plugin ----------------------------------------------------------------------


def _hook_inventory(manager, baseline=False):
    relay = getattr(manager, "hook", None)
    if relay is None:
        return
    signature = []
    for hook_name in sorted(vars(relay)):
        if not hook_name.startswith(HOOK_PREFIXES):
            continue
        caller = getattr(relay, hook_name, None)
        try:
            impls = caller.get_hookimpls()
        except Exception:  # noqa: BLE001 - a caller of another shape has nothing to list
            continue
        for impl in impls:
            fn = getattr(impl, "function", None)
            plugin = getattr(impl, "plugin", None)
            if plugin is sys.modules.get(__name__):
                continue
            key = (hook_name, id(fn), id(plugin))
            signature.append(key)
            if baseline:
                _baseline_hooks.add(key)
            if key in _hooks:
                continue
            name, where = _describe(fn)
            _hooks[key] = {
                "hook": hook_name,
                "plugin": str(getattr(impl, "plugin_name", "")),
                "function": name,
                "file": where,
                "wrapper": bool(getattr(impl, "hookwrapper", False) or getattr(impl, "wrapper", False)),
                "at_load": key in _baseline_hooks,
            }
    _state["signature"] = tuple(signature)


def _plugin_file(plugin):
    path = getattr(plugin, "__file__", None)
    if path is None:
        module = sys.modules.get(getattr(type(plugin), "__module__", "") or "")
        path = getattr(module, "__file__", None)
        if isinstance(plugin, type):
            path = getattr(sys.modules.get(plugin.__module__), "__file__", None)
    return _rel(path or "")


def pytest_plugin_registered(plugin, manager):
    # A historic hook: every plugin registered before this one is replayed first, then this one.
    if plugin is sys.modules.get(__name__):
        if not _state["framework"]:
            start("pytest")  # imported by launch.py before pytest was: pytest's modules are loaded now
        if not _state["guard_registered"]:
            _state["guard_registered"] = True
            _state["manager"] = manager
            _hook_inventory(manager, baseline=True)
        return
    if not _state["guard_registered"] or manager is not _state["manager"]:
        return
    _plugins.append({"name": str(manager.get_name(plugin) or ""), "file": _plugin_file(plugin), "kind": type(plugin).__name__})
    _hook_inventory(manager)


def _hooks_changed(when):
    manager = _state["manager"]
    if manager is not None:
        before = _state["signature"]
        _hook_inventory(manager)
        if before != _state["signature"]:
            _state["checks"] += 1


def pytest_collection_finish(session):
    check("after collection")
    _hooks_changed("after collection")


def pytest_runtest_logstart(nodeid, location):
    check("before " + nodeid)
    _hooks_changed("before " + nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call":
        _state["tests"] += 1
    check(f"after the {report.when} of {report.nodeid}")


def pytest_sessionfinish(session, exitstatus):
    check("at the end of the session")
    _hooks_changed("at the end of the session")


def pytest_unconfigure(config):
    if config.pluginmanager is _state["manager"]:
        write(finished=True)


# --- the report ------------------------------------------------------------------------------


def write(finished):
    if not REPORT or os.getpid() != PID:
        return
    check("at the end" if finished else "at exit")
    _late_origins()
    if finished:
        _state["finished"] = True
    try:
        shadows = _shadows()
    except Exception as exc:  # noqa: BLE001 - the report goes out whatever this finds
        shadows = [{"module": "?", "file": "", "other": f"the check failed: {exc}"}]
    data = {
        "guard": 1,
        "framework": _state["framework"],
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
        "workdir": WORKDIR,
        "finished": _state["finished"],
        "tests": _state["tests"],
        "checks": _state["checks"],
        "watched": len(_watched),
        "changes": _changes,
        "plugins": _plugins,
        "hooks": [h for h in _hooks.values() if not h["at_load"]],
        "hooks_at_load": sum(1 for h in _hooks.values() if h["at_load"]),
        "shadows": shadows,
        "child": _state["child"],
        "children": [_with_report(child) for child in _children] if finished else [],
    }
    folder = os.path.dirname(REPORT)
    try:
        if folder and not os.path.isdir(folder):
            os.makedirs(folder)
        partial = f"{REPORT}.{PID}.partial"
        with open(partial, "w") as handle:
            json.dump(data, handle)
        os.replace(partial, REPORT)
    except OSError:
        pass


def _child_report(n):
    return os.path.join(os.path.dirname(REPORT), f"child-{n}.json")


def _with_report(child):
    """A child's record with its own report, read back (None when it wrote none)."""
    record = dict(child)
    try:
        with open(_child_report(child["n"])) as handle:
            record["report"] = json.load(handle)
    except (OSError, ValueError) as exc:
        record["report"] = None
        record["unread"] = type(exc).__name__
    return record


def _is_python(word):
    name = os.path.basename(str(word))
    if name.startswith("python") and all(c.isdigit() or c == "." for c in name[6:]):
        return True
    try:
        return os.path.realpath(str(word)) == os.path.realpath(sys.executable)
    except (TypeError, ValueError):
        return False


def _from_a_test():
    """Whether a test function is on the stack (a test that starts a subprocess of its own,
    which is the test's business, not the runner's rerun)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("test") and os.path.basename(code.co_filename).startswith("test_"):
            return True
        frame = frame.f_back
    return False


def _watch_children():
    """Every interpreter the runner starts (before any test runs) gets the guard: its
    environment carries ``RELEARN_GUARD_CHILD``, which ``site_hook.py`` (run from a ``.pth``
    file, before any repository code) consumes. A Python child that runs code must write a
    report; one started so that it cannot (``-S``) is recorded all the same, and its report is
    missing."""
    import subprocess

    original = subprocess.Popen._execute_child

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest, **kwargs):
        words = [args] if isinstance(args, (str, bytes)) else list(args)
        first = executable or (words[0] if words else "")
        python = not isinstance(args, (str, bytes)) and _is_python(first)
        runs_code = python and any(str(w) in ("-c", "-m") or not str(w).startswith("-") for w in words[1:])
        child = None
        if not _from_a_test() and (runs_code or not python):
            child = {
                "n": len(_children) + 1,
                "command": [str(w)[:200] for w in words[:4]],
                "python": python,
                "required": runs_code,
                "pid": None,
            }
            _children.append(child)
            env = dict(os.environ if env is None else env)
            env[CHILD_VARIABLE] = "{}:{}:{}".format(child["n"], _state["framework"], REPORT)
        result = original(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest, **kwargs)
        if child is not None:
            child["pid"] = getattr(self, "pid", None)
        return result

    _execute_child.__qualname__ = original.__qualname__
    subprocess.Popen._execute_child = _execute_child
    _watch(subprocess.Popen, ("_execute_child",), "subprocess.Popen")


def _at_exit():
    # pytest has written the report at unconfigure; this sees what changed after it.
    if not _state["finished"]:
        write(finished=_state["framework"] != "pytest")
    elif _state["framework"] == "pytest":
        count = len(_changes)
        check("at exit")
        if len(_changes) != count:
            write(finished=True)


def _wrap_unittest_run():
    """A check before every unittest test: ``TestCase.run`` is the guard's, and so part of the
    baseline (it calls the original; nothing a test sees changes)."""
    import unittest.case

    original = unittest.case.TestCase.run

    def run(self, result=None):
        _state["tests"] += 1
        check("before " + self.id())
        return original(self, result)

    run.__qualname__ = original.__qualname__
    run.__doc__ = original.__doc__
    unittest.case.TestCase.run = run


def start(framework, child=""):
    """Called by ``launch.py`` (unittest, SymPy) before the runner, and by ``site_hook.py`` in
    a runner's child (``child``: its number, given by the parent); pytest loads this module as
    a plugin, and it starts itself on import."""
    _state["framework"] = framework
    _state["child"] = child
    if framework != "pytest":
        _wrap_unittest_run()
    watch_unittest()
    if framework == "pytest":
        watch_pytest()
    if framework in RERUNS_IN_CHILD and not child and REPORT:
        _watch_children()
    atexit.register(_at_exit)
    write(finished=False)  # a report exists from the start: one never finished was cut short


# Imported by pytest for ``-p relearn_guard``: pytest's own modules are loaded, no repository
# code has run yet (conftest files and entry-point plugins load after ``-p`` plugins).
if "_pytest.config" in sys.modules and not _state["framework"]:
    start("pytest")
