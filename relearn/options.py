"""Each option of a verb declared once: the field of its options dataclass.

An options dataclass (``TrainOptions``, ``MasksOptions``, ...) is the one place an option is
written: its type (a ``Literal`` names its choices), its default, and, in the field's
``option(...)``, its help, bounds, flags and which front-ends have it. The command line's
flags (``relearn.cli.declared``) and the pipeline file's tables (``relearn.pipeline.tables``)
are derived from it, so a new option is one field, and a test holds both front-ends to it.

An option both front-ends lack a reason to have is ``front="both"``; one that only one of them
has names the other's reason in ``why`` (the pipeline names its stages' files itself; a
launcher's option has no place in one process). A field whose type is another options
dataclass, declared with ``nested()``, spreads its options into the verb's and the table's.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, Literal

Front = Literal["both", "cli", "pipeline"]
_KEY = "relearn.option"


@dataclass(frozen=True)
class Declared:
    """What the front-ends need of one option beyond its type and default."""

    help: str
    front: Front = "both"
    why: str = ""  # why one front-end lacks it (required unless front is "both")
    flags: tuple[str, ...] = ()  # the command line's names, when not --the-field-name
    metavar: str | None = None  # what the value is, when the type does not say (TOKENS, SECONDS)
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    min_length: int | None = None  # a text or list that must not be shorter (a column name, a list of paths)
    argument: bool = False  # a positional argument of the verb, not a --flag
    exists: Literal["", "file", "dir", "path"] = ""  # a path that must exist, checked before the verb runs
    flag_only: bool = False  # a boolean flag without its --no- form (its default is False)
    table_name: str | None = None  # the pipeline table's name for it, when not the field's
    table_type: Any = None  # its type in the pipeline file, when written otherwise (paths kept as written, relative to the file)
    hidden: bool = False  # left off the help page (set by a launcher)

    def __post_init__(self) -> None:
        if self.front != "both" and not self.why:
            raise ValueError(f"an option only the {self.front} front-end has must say why the other lacks it")


@dataclass(frozen=True)
class Nested:
    """A field holding another options dataclass, whose options the front-ends spread in."""


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A field of an options dataclass with its declaration (``Declared``'s fields by keyword)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={_KEY: Declared(help=help, **declared)})


def same_as(cls: type, name: str) -> Any:
    """A field declared as ``cls``'s option ``name`` is (default and declaration): for a verb
    that takes another verb's option as it is (``review bench`` takes ``review``'s workers)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=field.default, default_factory=field.default_factory, metadata=field.metadata)


def nested(factory: Any) -> Any:
    return dataclasses.field(default_factory=factory, metadata={_KEY: Nested()})


@dataclass(frozen=True)
class Option:
    """One declared option as the front-ends read it: ``path`` reaches it through nested fields."""

    path: tuple[str, ...]
    type: Any
    default: Any  # dataclasses.MISSING for a required option
    factory: Any
    declared: Declared

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING and self.factory is dataclasses.MISSING

    def default_value(self) -> Any:
        return self.factory() if self.factory is not dataclasses.MISSING else self.default


def options_of(cls: type, prefix: tuple[str, ...] = ()) -> list[Option]:
    """Every declared option of ``cls``, nested ones spread in, in field order. A field without a
    declaration is the verb's own business (a derived value) and is not an option."""
    hints = typing.get_type_hints(cls)
    found: list[Option] = []
    for field in dataclasses.fields(cls):
        meta = field.metadata.get(_KEY)
        if isinstance(meta, Nested):
            found += options_of(hints[field.name], (*prefix, field.name))
        elif isinstance(meta, Declared):
            found.append(Option((*prefix, field.name), hints[field.name], field.default, field.default_factory, meta))
    return found


def build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of ``cls`` from flat values by option name, nested dataclasses built from
    theirs; an option not given keeps its default."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if isinstance(field.metadata.get(_KEY), Nested):
            kwargs[field.name] = build(hints[field.name], values)
        elif field.name in values:
            kwargs[field.name] = values[field.name]
    return cls(**kwargs)


def choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` or an ``Enum`` (or an optional one) allows; None for any other type."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return tuple(member.value for member in arg)
    return None
