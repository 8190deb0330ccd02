"""What the `relearn envs` verbs accept (build, build-base, build-swebench, fetch-wheels, load,
check-image, audit, gc); the work is one module per verb in ``relearn.ops.envs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from relearn.options import nested, option, same_as
from relearn.verbs.containers import RAY_HELP, ContainerOptions, tasks_option

IDS_HELP = "Only these instance ids (repeatable)."


@dataclass
class AuditOptions:
    """Flag task images whose .git exposes future commits or the fix itself. Exits 1 when any is flagged.

    With --verdicts FILE, the verdicts instead: every one the verifier did not simply grade (a refused patch, files put back to the
    base commit, an executable bit dropped, a report that contradicts the log, something suspicious). Exits 1 when any patch was
    refused, contradicted or suspicious.
    """

    tasks: str = tasks_option()
    ids: list[str] = option(factory=list, help=IDS_HELP, flags=("--id",), metavar="ID")
    leaky: bool = option(False, "Mini suite: audit the deliberately leaky builds.")
    containers: ContainerOptions = nested(ContainerOptions)
    output: Path | None = option(
        None, "Append each task's audit to this JSON Lines file as it is made (instance_id, image, verdict, why; a task's latest line counts). `relearn masks --audit FILE` leaves the flagged tasks' trajectories out of the dataset.",
        flags=("--output", "-o"), metavar="FILE",
    )  # fmt: skip


@dataclass
class VerdictAuditOptions:
    verdicts: Path = option(
        help="Instead of images: list what the verifier refused, restored, neutralized, found contradictory or suspicious in these verdicts (`relearn verify -o`).",
        exists="file",
    )


@dataclass
class BuildOptions:
    """Build the task images (the base image first, if a task needs it) and check that the others are on the engine."""

    tasks: str = tasks_option()
    ids: list[str] = option(factory=list, help=IDS_HELP, flags=("--id",), metavar="ID")
    leaky: bool = option(False, "Mini suite: also commit the fix into .git history (to exercise `envs audit`).")


@dataclass
class BuildBaseOptions:
    """Build the offline base image: debootstrap (minbase + python3, pytest, git, patch) and docker import.

    Cached by tag: the tag names the Debian suite and package list.
    """

    force: bool = option(False, "Rebuild even if the image exists.")


@dataclass
class BuildSwebenchOptions:
    """Build SWE-bench instance images offline: the repository at the base commit from a checkout, a Python venv filled by pip from
    a wheelhouse in place of conda, the instance's install steps, and the `conda activate testbed` entry point the eval scripts call.

    Named as the row's image column (so verify finds it) unless --image-map/--image-template say otherwise. Supported: the
    pure-Python repositories of SWE-bench Verified (docs/swebench.md); the others are refused with the reason.
    """

    tasks: str = option(
        help="SWE-bench rows (.parquet/.jsonl/.json), e.g. ../shared/samples/swebench_verified.parquet.", flags=("--tasks", "-t"),
        metavar="ROWS",
    )  # fmt: skip
    ids: list[str] = option(help="Instances to build (repeatable).", flags=("--id", "-i"), metavar="ID")
    repo: str | None = option(
        None,
        "The instances' repository: a local git checkout or mirror holding the base commits, or a clone URL (online).",
        metavar="PATH|URL",
    )
    wheels: Path | None = option(
        None, "A wheelhouse (pip download) that pip installs from, offline; without it pip uses PyPI during the build.", exists="dir"
    )
    python: str | None = option(
        None, "Build with this Python version instead of the instance's (recorded in the image's labels).", metavar="VERSION"
    )
    python_image: str | None = option(
        None, "Build FROM this image (it must hold python<version>, git and bash) instead of a Debian suite.", metavar="IMAGE"
    )
    force: bool = option(False, "Rebuild an image that is already on the engine.")
    check: bool = option(True, "Check each built image against the contract (as `relearn envs check-image`).")
    plan: bool = option(
        False, "Only print each instance's recipe and the `relearn envs fetch-wheels` that fills its wheelhouse.", flag_only=True
    )
    containers: ContainerOptions = nested(ContainerOptions)


@dataclass
class CheckImageOptions:
    """Check an image against the contract a task needs, offline; list what is missing.

    Started without network: the repository at the work directory with the base commit in its history, the eval script's
    environment lines (`conda activate testbed`), the test command's interpreter and runner, the test files importing
    (docs/swebench.md, "The image contract"). Exits 1 when a check fails.
    """

    image: str | None = option(
        None, "The image to check (default: each selected task's own, after --image-map/--image-template).", argument=True, metavar="IMAGE"
    )
    tasks: str = tasks_option()
    ids: list[str] = option(factory=list, help=IDS_HELP, flags=("--id",), metavar="ID")
    containers: ContainerOptions = nested(ContainerOptions)


@dataclass
class FetchWheelsOptions:
    """Fill the wheelhouse that `relearn envs build-swebench --wheels` installs from offline, where PyPI answers.

    pip runs inside a container of the image's own base (the Debian suite with the instance's Python, or --python-image), so
    environment markers and wheel tags are the image's, and downloads what each install step of the build asks for, in the
    build's order: pip, setuptools and wheel; the repository's requirements file; the spec's packages and pins; the repository's
    own dependencies at the base commit, for the extras its install names; its build backend. Versions the spec leaves open are
    taken as of the environment-setup commit's date. Sdists are built into wheels there, those that compile C again with Debian's
    compiler; one that builds nowhere gives way to its project's newest wheel. The container reaches the index through this
    machine's proxy settings and certificates (PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE).

    The wheelhouse's relearn-wheelhouse.lock.json lists every file with its sha256 and, per instance, the Python pip ran on, the
    era, the build tools, how each step resolved and the sdists built or replaced (docs/swebench.md). Exits 1 when an instance
    failed or an sdist could not be made a wheel.
    """

    tasks: str = same_as(BuildSwebenchOptions, "tasks")
    ids: list[str] = option(help="Instances whose wheelhouse to fill (repeatable).", flags=("--id", "-i"), metavar="ID")
    wheels: Path = option(help="The wheelhouse to fill (made when missing); instances may share one.", metavar="DIR")
    repo: str | None = same_as(BuildSwebenchOptions, "repo")
    python: str | None = option(
        None, "Resolve for this Python version instead of the instance's (as build-swebench --python).", metavar="VERSION"
    )
    python_image: str | None = option(
        None, "Run pip in this image (as build-swebench --python-image) instead of a Debian suite's.", metavar="IMAGE"
    )
    era: bool = option(
        True,
        "Take versions the spec leaves open as of the environment-setup commit's date (pip --uploaded-prior-to); --no-era takes the newest.",
    )
    # The verb runs on this machine's engine with its defaults: it takes no image or limit options.
    containers: ContainerOptions = field(default_factory=ContainerOptions)


@dataclass
class GcOptions:
    """Remove relearn's orphaned containers and codex-cli networks (found by label), e.g. after a crash.

    With --ray, sweep the engine of every node of the cluster (one pinned task per node), and say what each node removed or why it
    could not.
    """

    everything: bool = option(False, "Remove every relearn container, not only orphans.", flags=("--all",))
    ray: str | None = option(None, RAY_HELP, metavar="ADDRESS")


@dataclass
class LoadOptions:
    """Load image tarballs into the engine (docker load), e.g. SWE-bench images saved on a machine with a registry."""

    path: Path = option(
        help="A folder of image tarballs (docker save: .tar, .tar.gz, .tgz, .tar.xz, .tar.zst), or one tarball.",
        argument=True, metavar="DIR", exists="path",
    )  # fmt: skip
    tasks: str | None = option(
        None,
        "Then say which of these tasks have their image (after --image-map/--image-template).",
        flags=("--tasks", "-t"),
        metavar="TASKS",
    )
    ids: list[str] = option(factory=list, help=IDS_HELP, flags=("--id",), metavar="ID")
    containers: ContainerOptions = nested(ContainerOptions)
