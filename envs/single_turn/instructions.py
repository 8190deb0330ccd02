"""Instruction following: the prompt's verifiable constraints, checked by IFEval's own checkers.

The checkers are Google's IFEval instruction classes as packaged by ``if-verifiable`` (the
``instructions_registry`` of the IFEval release, offline: no dataset is loaded). Each
constraint names an instruction id (``punctuation:no_comma``, ``keywords:existence``, ...) and
its keyword arguments; the response follows the prompt when every checker passes (IFEval's
strict, prompt-level accuracy). ``length_constraints:number_sentences`` needs nltk's punkt
data, which no PyPI package ships: without it that constraint is an error, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envs.single_turn.tasks import Constraint


class ConstraintError(ValueError):
    """A constraint that cannot be checked (unknown id, bad kwargs, missing checker data)."""


@dataclass(frozen=True)
class InstructionResult:
    followed: bool
    per_constraint: dict[str, bool] = field(default_factory=dict)


def instruction_ids() -> list[str]:
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    return sorted(INSTRUCTION_DICT)


def verify_instructions(response: str, constraints: list[Constraint]) -> InstructionResult:
    import langdetect
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    # The language checkers call langdetect, which samples: a fixed seed makes a verdict
    # the same on every run.
    langdetect.DetectorFactory.seed = 0
    results: dict[str, bool] = {}
    for constraint in constraints:
        checker_class = INSTRUCTION_DICT.get(constraint.id)
        if checker_class is None:
            raise ConstraintError(f"unknown IFEval instruction {constraint.id!r}")
        checker = checker_class(constraint.id)
        try:
            checker.build_description(**constraint.kwargs)
        except TypeError as exc:
            raise ConstraintError(f"{constraint.id}: bad kwargs {constraint.kwargs}: {exc}") from None
        try:
            results[constraint.id] = bool(response.strip()) and bool(checker.check_following(response))
        except LookupError as exc:  # nltk data that is not installed
            raise ConstraintError(
                f"{constraint.id}: its checker needs data that is not installed ({str(exc).strip().splitlines()[0]})"
            ) from None
    return InstructionResult(all(results.values()), results)
