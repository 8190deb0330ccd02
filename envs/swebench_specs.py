"""How a SWE-bench instance's environment is made: its Python version, what pip installs,
the steps in the repository before and for its own install.

Taken from swebench's own specs (``MAP_REPO_VERSION_TO_SPECS``) when the installed swebench
has them (up to 4.x; 5.x moved them into per-task Dockerfiles of a separate repository);
otherwise from the small table below, written from those specs for the pure-Python
repositories of SWE-bench Verified. Repositories that compile extensions at install time
or need a conda environment file are refused with the reason.

``packages`` are conda package names in swebench's specs; the builder installs them with
pip (the names agree for every repository supported here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from envs.tasks import Task

# Python versions the offline builder can get from a Debian suite (debootstrap).
DEBIAN_PYTHON = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}

REFUSED = {
    "astropy/astropy": "compiles C extensions at install time (`pip install -e .[test]`) against pinned numpy; needs a compiler toolchain and conda's libraries",
    "matplotlib/matplotlib": "compiles C/C++ extensions, downloads qhull and needs TeX Live, ffmpeg and ImageMagick at image build",
    "scikit-learn/scikit-learn": "compiles Cython/C extensions at install time (`--no-build-isolation`) against pinned numpy and scipy",
    "pydata/xarray": "its environment is a conda environment.yml (ci/requirements/environment.yml) with non-Python packages",
}


class Unsupported(ValueError):
    """The builder cannot make this instance's image; the message says why."""


@dataclass(frozen=True)
class InstallSpec:
    repo: str
    version: str
    python: str
    install: str
    packages: tuple[str, ...] = ()  # conda-style names, installed with pip
    pip_packages: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()  # files in the repository; the first that exists is used, as swebench does
    pre_install: tuple[str, ...] = ()  # shell lines run in the repository before the install
    apt_packages: tuple[str, ...] = ()  # Debian packages the image needs (from pre_install's apt-get lines)
    source: str = "relearn table"


# --- relearn's table --------------------------------------------------------------------------

_PYTEST_PINS = {
    "4.4": [
        "atomicwrites==1.4.1",
        "attrs==23.1.0",
        "more-itertools==10.1.0",
        "pluggy==0.13.1",
        "py==1.11.0",
        "setuptools==68.0.0",
        "six==1.16.0",
    ],
    "4.5": [
        "atomicwrites==1.4.1",
        "attrs==23.1.0",
        "more-itertools==10.1.0",
        "pluggy==0.11.0",
        "py==1.11.0",
        "setuptools==68.0.0",
        "six==1.16.0",
        "wcwidth==0.2.6",
    ],
    "4.6": [
        "atomicwrites==1.4.1",
        "attrs==23.1.0",
        "more-itertools==10.1.0",
        "packaging==23.1",
        "pluggy==0.13.1",
        "py==1.11.0",
        "six==1.16.0",
        "wcwidth==0.2.6",
    ],
    "5.0": [
        "atomicwrites==1.4.1",
        "attrs==23.1.0",
        "more-itertools==10.1.0",
        "packaging==23.1",
        "pluggy==0.13.1",
        "py==1.11.0",
        "wcwidth==0.2.6",
    ],
    "5.3": ["attrs==23.1.0", "more-itertools==10.1.0", "packaging==23.1", "pluggy==0.13.1", "py==1.11.0", "wcwidth==0.2.6"],
    "5.4": ["py==1.11.0", "packaging==23.1", "attrs==23.1.0", "more-itertools==10.1.0", "pluggy==0.13.1"],
    "6.0": [
        "attrs==23.1.0",
        "iniconfig==2.0.0",
        "more-itertools==10.1.0",
        "packaging==23.1",
        "pluggy==0.13.1",
        "py==1.11.0",
        "toml==0.10.2",
    ],
    "6.2": ["attrs==23.1.0", "iniconfig==2.0.0", "packaging==23.1", "pluggy==0.13.1", "py==1.11.0", "toml==0.10.2"],
    "7.0": ["attrs==23.1.0", "iniconfig==2.0.0", "packaging==23.1", "pluggy==0.13.1", "py==1.11.0"],
    "7.1": ["attrs==23.1.0", "iniconfig==2.0.0", "packaging==23.1", "pluggy==0.13.1", "py==1.11.0", "tomli==2.0.1"],
    "7.4": ["iniconfig==2.0.0", "packaging==23.1", "pluggy==1.3.0", "exceptiongroup==1.1.3", "tomli==2.0.1"],
}
_PYTEST_PINS.update({"5.1": _PYTEST_PINS["5.0"], "5.2": _PYTEST_PINS["5.0"], "6.3": _PYTEST_PINS["6.2"], "7.2": _PYTEST_PINS["7.1"]})
_PYTEST_PINS.update({v: _PYTEST_PINS["7.4"] for v in ("8.0", "8.1", "8.2", "8.3", "8.4")})
_FLASK_PINS_20 = ["setuptools==70.0.0", "Werkzeug==2.3.7", "Jinja2==3.0.1", "itsdangerous==2.1.2", "click==8.0.1", "MarkupSafe==2.1.3"]
_FLASK_PINS = ["setuptools==70.0.0", "click==8.1.3", "itsdangerous==2.1.2", "Jinja2==3.1.2", "MarkupSafe==2.1.1", "Werkzeug==2.3.7"]
_SEABORN_PINS = [
    "contourpy==1.1.0", "cycler==0.11.0", "fonttools==4.42.1", "importlib-resources==6.0.1", "kiwisolver==1.4.5", "matplotlib==3.7.2",
    "numpy==1.25.2", "packaging==23.1", "pillow==10.0.0", "pyparsing==3.0.9", "pytest", "python-dateutil==2.8.2", "pytz==2023.3.post1",
    "scipy==1.11.2", "six==1.16.0", "tzdata==2023.1", "zipp==3.16.2",
]  # fmt: skip
_SPHINX_SEDS_3 = [
    "sed -i 's/Jinja2>=2.3/Jinja2<3.0/' setup.py",
    "sed -i 's/sphinxcontrib-applehelp/sphinxcontrib-applehelp<=1.0.7/' setup.py",
    "sed -i 's/sphinxcontrib-devhelp/sphinxcontrib-devhelp<=1.0.5/' setup.py",
    "sed -i 's/sphinxcontrib-qthelp/sphinxcontrib-qthelp<=1.0.6/' setup.py",
    "sed -i 's/alabaster>=0.7,<0.8/alabaster>=0.7,<0.7.12/' setup.py",
    "sed -i \"s/'packaging',/'packaging', 'markupsafe<=2.0.1',/\" setup.py",
]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)) or (0,)


def _table_spec(repo: str, version: str) -> InstallSpec | None:
    v = _version_key(version)
    if repo == "sympy/sympy":
        if v >= (1, 13):
            return InstallSpec(
                repo,
                version,
                "3.9",
                "python -m pip install -e .",
                pip_packages=("mpmath==1.3.0",),
                requirements=("requirements-dev.txt", "requirements-test.txt"),
            )
        return InstallSpec(
            repo,
            version,
            "3.9",
            "python -m pip install -e .",
            packages=("mpmath", "flake8"),
            pip_packages=("mpmath==1.3.0", "flake8-comprehensions"),
        )
    if repo == "pytest-dev/pytest":
        pins = _PYTEST_PINS.get(version)
        if pins is None:
            return None
        pre = ("sed -i 's/>=>=/>=/' setup.cfg",) if version == "6.3" else ()
        return InstallSpec(repo, version, "3.9", "python -m pip install -e .", pip_packages=tuple(pins), pre_install=pre)
    if repo == "psf/requests":
        return InstallSpec(repo, version, "3.9", "python -m pip install .", packages=("pytest",))
    if repo == "pallets/flask":
        python, pins = ("3.9", _FLASK_PINS_20) if version == "2.0" else ("3.10", _FLASK_PINS) if version == "2.1" else ("3.11", _FLASK_PINS)
        return InstallSpec(
            repo, version, python, "python -m pip install -e .", pip_packages=tuple(pins), requirements=("requirements/dev.txt",)
        )
    if repo == "pylint-dev/pylint":
        pins: tuple[str, ...] = ("astroid==3.0.0a6", "setuptools") if v >= (3, 0) else ()
        apt: tuple[str, ...] = ()
        if version == "2.8":
            pins, apt = ("pyenchant==3.2",), ("libenchant-2-dev", "hunspell-en-us")
        return InstallSpec(
            repo, version, "3.9", "python -m pip install -e .", pip_packages=pins, requirements=("requirements_test.txt",), apt_packages=apt
        )
    if repo == "sphinx-doc/sphinx":
        pre = ["sed -i 's/pytest/pytest -rA/' tox.ini"]
        if (3, 0) <= v <= (4, 4):
            pre += _SPHINX_SEDS_3
            if v >= (4, 2):
                pre += [
                    "sed -i 's/sphinxcontrib-htmlhelp>=2.0.0/sphinxcontrib-htmlhelp>=2.0.0,<=2.0.4/' setup.py",
                    "sed -i 's/sphinxcontrib-serializinghtml>=1.1.5/sphinxcontrib-serializinghtml>=1.1.5,<=1.1.9/' setup.py",
                ]
            elif v == (4, 1):
                pre += [
                    "grep -q 'sphinxcontrib-htmlhelp>=2.0.0' setup.py && sed -i 's/sphinxcontrib-htmlhelp>=2.0.0/sphinxcontrib-htmlhelp>=2.0.0,<=2.0.4/' setup.py || sed -i 's/sphinxcontrib-htmlhelp/sphinxcontrib-htmlhelp<=2.0.4/' setup.py",
                    "grep -q 'sphinxcontrib-serializinghtml>=1.1.5' setup.py && sed -i 's/sphinxcontrib-serializinghtml>=1.1.5/sphinxcontrib-serializinghtml>=1.1.5,<=1.1.9/' setup.py || sed -i 's/sphinxcontrib-serializinghtml/sphinxcontrib-serializinghtml<=1.1.9/' setup.py",
                ]
            else:
                pre += [
                    "sed -i 's/sphinxcontrib-htmlhelp/sphinxcontrib-htmlhelp<=2.0.4/' setup.py",
                    "sed -i 's/sphinxcontrib-serializinghtml/sphinxcontrib-serializinghtml<=1.1.9/' setup.py",
                ]
        apt = ("graphviz",) if v >= (7, 2) else ()
        python = "3.10" if v >= (8, 0) else "3.9"
        pins = ("tox==4.16.0", "tox-current-env==0.0.11", "Jinja2==3.0.3")
        return InstallSpec(
            repo, version, python, "python -m pip install -e .[test]", pip_packages=pins, pre_install=tuple(pre), apt_packages=apt
        )
    if repo == "django/django":
        python = "3.5" if v <= (2, 2) else "3.6" if v <= (3, 2) else "3.8" if v < (4, 1) else "3.9" if v < (5, 0) else "3.11"
        if v <= (2, 2):
            return InstallSpec(
                repo, version, python, "python setup.py install", pip_packages=("setuptools",), requirements=("tests/requirements/py3.txt",),
                pre_install=("echo 'en_US UTF-8' > /etc/locale.gen", "locale-gen en_US.UTF-8"), apt_packages=("locales",),
            )  # fmt: skip
        return InstallSpec(
            repo, version, python, "python -m pip install -e .", requirements=("tests/requirements/py3.txt",), apt_packages=("locales",)
        )
    if repo == "mwaskom/seaborn":
        pins = [*_SEABORN_PINS, "pandas==1.3.5" if version == "0.11" else "pandas==2.0.0"]
        install = "python -m pip install -e ." if version == "0.11" else "python -m pip install -e .[dev]"
        return InstallSpec(repo, version, "3.9", install, pip_packages=tuple(pins))
    return None


TABLE_REPOS = (
    "django/django",
    "mwaskom/seaborn",
    "pallets/flask",
    "psf/requests",
    "pylint-dev/pylint",
    "pytest-dev/pytest",
    "sphinx-doc/sphinx",
    "sympy/sympy",
)


# --- swebench's own specs (swebench up to 4.x) ---------------------------------------------------


def _swebench_specs() -> tuple[dict[str, Any], dict[str, Any], str] | None:
    try:
        from swebench.harness import constants  # type: ignore[attr-defined]
    except ImportError:
        return None
    specs = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None)
    if not specs:
        return None
    import swebench

    return specs, getattr(constants, "MAP_REPO_TO_REQS_PATHS", {}), f"swebench {getattr(swebench, '__version__', '?')} specs"


def _from_swebench(repo: str, version: str, spec: dict[str, Any], reqs_paths: dict[str, Any], source: str) -> InstallSpec:
    packages = str(spec.get("packages") or "")
    if packages == "environment.yml":
        raise Unsupported(f"{repo} {version}: its environment is a conda environment.yml")
    requirements = tuple(reqs_paths.get(repo, ())) if packages == "requirements.txt" else ()
    apt: list[str] = []
    pre: list[str] = []
    for line in spec.get("pre_install") or []:
        if line.lstrip().startswith("apt-get"):
            apt += apt_packages_of(line)
        elif re.search(r"\b(wget|curl)\b", line):
            raise Unsupported(f"{repo} {version}: its pre-install step downloads at build time ({line.strip()[:80]})")
        else:
            pre.append(line)
    return InstallSpec(
        repo, version, str(spec["python"]), str(spec.get("install") or "python -m pip install -e ."),
        packages=tuple(packages.split()) if packages not in ("", "requirements.txt") else (),
        pip_packages=tuple(spec.get("pip_packages") or ()), requirements=requirements, pre_install=tuple(pre),
        apt_packages=tuple(dict.fromkeys(apt)), source=source,
    )  # fmt: skip


def apt_packages_of(line: str) -> list[str]:
    """The packages an ``apt-get install`` line (possibly after ``&&``) names."""
    out: list[str] = []
    for command in re.split(r"&&|;", line):
        words = command.split()
        if words[:1] in (["apt-get"], ["apt"]) and "install" in words:
            after = words[words.index("install") + 1 :]
            out += [w for w in after if not w.startswith("-")]
    return out


def install_spec(task: Task) -> InstallSpec:
    """The instance's environment recipe; Unsupported with the reason when there is none."""
    repo, version = task.repo, task.version
    if not repo:
        raise Unsupported(f"{task.instance_id}: the row has no repo")
    if repo in REFUSED:
        raise Unsupported(f"{repo} is not supported by the offline builder: it {REFUSED[repo]}; load or pull the official image")
    found = _swebench_specs()
    if found is not None:
        specs, reqs_paths, source = found
        spec = specs.get(repo, {}).get(version)
        if spec is not None:
            return _from_swebench(repo, version, spec, reqs_paths, source)
    spec_ = _table_spec(repo, version)
    if spec_ is None:
        known = ", ".join(TABLE_REPOS)
        raise Unsupported(
            f"{repo} {version or '(no version)'}: no install recipe (the installed swebench has no specs for it, and relearn's table covers {known})"
        )
    return spec_
