"""A verb's flags derived from its options dataclass (``relearn.options``): one typer parameter
per declared option, so no flag's type, default or help is written twice.

A flag shows what it takes in the ecosystem's words: its choices (``[ross|positive]``), ``N``
for a count, ``X`` for a number, ``PATH``/``FILE``/``DIR``, or the declaration's own metavar
(``TOKENS``, ``ADDRESS``); bounds are checked before the verb runs and named in the help.
"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from relearn.options import Option, build, choices, options_of

OPTIONS_CLASS = "options_class"  # the attribute naming the dataclass a verb was derived from


def _plain(annotation: Any) -> Any:
    """The type inside ``X | None`` (or ``list[X]``'s X)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _plain(args[0])
    if typing.get_origin(annotation) is list:
        return _plain(args[0])
    return annotation


def metavar(option: Option) -> str | None:
    if option.declared.metavar:
        return option.declared.metavar
    allowed = choices(option.type)
    if allowed is not None:
        return "[" + "|".join(str(value) for value in allowed) + "]"
    plain = _plain(option.type)
    if plain is bool:
        return None
    if isinstance(plain, type) and issubclass(plain, enum.Enum):
        return "[" + "|".join(str(member.value) for member in plain) + "]"
    if plain is Path:
        return {"file": "FILE", "dir": "DIR"}.get(option.declared.exists, "PATH")
    return {int: "N", float: "X", str: "TEXT"}.get(plain, None)


def bounds_text(option: Option) -> str:
    d = option.declared
    parts = [f"at least {d.ge:g}" if d.ge is not None else "", f"above {d.gt:g}" if d.gt is not None else ""]
    parts.append(f"at most {d.le:g}" if d.le is not None else "")
    return ", ".join(part for part in parts if part)


def _checked(option: Option) -> Callable[[Any], Any]:
    d = option.declared

    def check(value: Any) -> Any:
        if d.min_length is not None and value is not None and len(value) < d.min_length:
            raise typer.BadParameter(f"give at least {d.min_length}" if isinstance(value, list | tuple) else "must not be empty")
        if d.ge is None and d.gt is None and d.le is None:
            return value
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is None:
                continue
            if (d.ge is not None and item < d.ge) or (d.gt is not None and item <= d.gt) or (d.le is not None and item > d.le):
                raise typer.BadParameter(f"{item} is not {bounds_text(option)}")
        return value

    return check


def flag_name(option: Option) -> str:
    return "--" + option.name.replace("_", "-")


def parameter(option: Option) -> inspect.Parameter:
    """The typer parameter of one option."""
    d = option.declared
    help_text = d.help + (f" ({bounds_text(option)})" if bounds_text(option) else "")
    extra: dict[str, Any] = {}
    if d.exists:
        extra = {"exists": True, "dir_okay": d.exists != "file", "file_okay": d.exists != "dir"}
    if d.ge is not None or d.gt is not None or d.le is not None or d.min_length is not None:
        extra["callback"] = _checked(option)
    if d.argument:
        info: Any = typer.Argument(metavar=d.metavar or option.name.upper(), help=help_text, hidden=d.hidden, **extra)
    else:
        flags = d.flags or ((flag_name(option),) if d.flag_only else ())
        info = typer.Option(*flags, metavar=metavar(option), help=help_text, hidden=d.hidden, **extra)
    default = inspect.Parameter.empty if option.required else option.default_value()
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[option.type, info])


def command(
    cls: type,
    run: Callable[..., None],
    *,
    doc: str | None = None,
    skip: Sequence[str] = (),
    extra: Sequence[inspect.Parameter] = (),
) -> Callable[..., None]:
    """A typer command whose flags are ``cls``'s declared options (less those only the pipeline
    has and those in ``skip``, which the verb sets itself) and ``extra`` (the verb's own,
    passed to ``run`` by keyword): it calls ``run(options, **extra)``. Its help is ``doc``, or
    the dataclass's docstring."""
    declared = [o for o in options_of(cls) if o.declared.front != "pipeline" and o.name not in skip]
    names = [o.name for o in declared] + [p.name for p in extra]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise TypeError(f"{cls.__name__}: two options would be the same flag: {', '.join(duplicated)}")
    own = {p.name for p in extra}

    def verb(**values: Any) -> None:
        extras = {name: values.pop(name) for name in own}
        run(build(cls, values), **extras)

    params = [parameter(o) for o in declared] + list(extra)
    verb.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    verb.__annotations__ = {p.name: p.annotation for p in params}
    verb.__doc__ = doc if doc is not None else cls.__doc__
    setattr(verb, OPTIONS_CLASS, cls)
    return verb
