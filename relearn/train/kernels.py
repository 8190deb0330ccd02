"""Fast GPU kernels: which are installed, which this run uses, and a refusal when they are asked
for and missing.

The kernels are not ours: transformers picks them itself when the packages import and the
inputs are on a device they run on (``flash-linear-attention`` for the Gated DeltaNet rule,
``causal-conv1d`` for its short convolution; ``flash-attn`` behind ``--attn
flash_attention_2/3``), and falls back to its PyTorch reference code otherwise, which is
correct but slow and memory-hungry at 65,536 tokens. So the trainer only finds out, before it
builds the model, what will run, writes that into ``run.json``, and with ``--kernels fast``
refuses to start on the reference path. Install them on a GPU machine with
``pip install 'relearn[gpu]'`` (pyproject's ``gpu`` extra).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import asdict, dataclass
from typing import Any

INSTALL_HINT = "pip install --no-build-isolation 'relearn[gpu]' (flash-attn, flash-linear-attention, causal-conv1d; on a CUDA machine)"
MODES: tuple[str, ...] = ("auto", "fast")


@dataclass(frozen=True)
class Kernel:
    name: str  # the import name
    distribution: str  # the pip name
    role: str  # what it replaces
    present: bool
    version: str | None
    needed: bool  # this run's model and flags would call it
    used: bool  # needed, present and on a device it runs on


@dataclass(frozen=True)
class KernelReport:
    mode: str
    device: str
    kernels: tuple[Kernel, ...]

    @property
    def missing(self) -> list[Kernel]:
        return [k for k in self.kernels if k.needed and not k.used]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "device": self.device,
            "used": [k.distribution for k in self.kernels if k.used],
            "reference": [k.role for k in self.kernels if k.needed and not k.used],
            "kernels": {k.distribution: {key: v for key, v in asdict(k).items() if key not in ("distribution",)} for k in self.kernels},
        }

    def describe(self) -> str:
        used = [f"{k.distribution} {k.version}" for k in self.kernels if k.used]
        reference = [k.role for k in self.missing]
        parts = [f"fast kernels: {', '.join(used)}" if used else "no fast kernels"]
        if reference:
            parts.append(f"PyTorch reference path for {', '.join(reference)}")
        return "; ".join(parts)


def _probe(name: str, distribution: str) -> tuple[bool, str | None]:
    # Importing, not only finding the package: a flash-attn built against another torch is
    # installed but unusable, and transformers would quietly fall back.
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means the kernel will not run
        return False, None
    try:
        return True, importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return True, None


def detect(*, linear_attention: bool, attn: str, device: str, mode: str = "auto") -> KernelReport:
    """What this run would use. ``linear_attention``: the model has Gated DeltaNet layers;
    ``attn``: the ``--attn`` implementation; ``device``: ``cuda`` or ``cpu``."""
    gpu = device == "cuda"
    wanted = [
        ("fla", "flash-linear-attention", "the gated delta rule", linear_attention),
        ("causal_conv1d", "causal-conv1d", "the short causal convolution", linear_attention),
        ("flash_attn", "flash-attn", "flash attention 2", attn == "flash_attention_2"),
        ("flash_attn_interface", "flash-attn-3", "flash attention 3 (flash-attention's hopper/ build)", attn == "flash_attention_3"),
    ]
    kernels = []
    for name, distribution, role, needed in wanted:
        present, version = _probe(name, distribution) if (needed or gpu) else (False, None)
        kernels.append(Kernel(name, distribution, role, present, version, needed, needed and present and gpu))
    return KernelReport(mode, device, tuple(kernels))


def refusal(report: KernelReport) -> str | None:
    """Why ``--kernels fast`` cannot run, or ``None`` when it can (or was not asked for)."""
    if report.mode != "fast":
        return None
    if report.device != "cuda":
        return f"--kernels fast needs a CUDA GPU (this process sees {report.device}); the fast kernels do not run on CPU"
    missing = report.missing
    if not missing:
        return None
    names = ", ".join(f"{k.distribution} (import {k.name}) for {k.role}" for k in missing)
    return f"--kernels fast: missing {names}. Install them with {INSTALL_HINT}, or use --kernels auto for the reference path"
