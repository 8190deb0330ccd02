"""A pipeline table derived from the options dataclasses of its verb (``relearn.options``): one
field per declared option the pipeline has, with the option's type, default, bounds and help,
so ``[train]`` says what ``relearn train`` says and a new option reaches both at once.

A table is a strict model: a field nobody reads is an error (with the nearest known name), not
a silent no-op. Its class adds what only the pipeline has (``variants``, ``heldout_tasks``) and
the checks across fields; ``options_of_table`` turns it back into the verb's options.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from relearn.options import Option, build, options_of

TABLE_OPTIONS = "__options_classes__"  # the attribute naming the dataclasses a table was derived from
SET_BY_PIPELINE = "__set_by_pipeline__"  # the attribute naming the options the pipeline sets itself, each with why


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _field(option: Option, defaults: dict[str, Any]) -> Any:
    d = option.declared
    bounds = {name: getattr(d, name) for name in ("ge", "gt", "le", "min_length") if getattr(d, name) is not None}
    if option.name in defaults:
        return Field(defaults[option.name], description=d.help, **bounds)
    if option.factory is not dataclasses.MISSING:
        return Field(default_factory=option.factory, description=d.help, **bounds)
    return Field(... if option.required else option.default, description=d.help, **bounds)


def table_options(*classes: type, exclude: dict[str, str] | None = None) -> list[Option]:
    """The options of ``classes`` a pipeline table holds: all but the command line's own."""
    return [o for cls in classes for o in options_of(cls) if o.declared.front != "cli" and o.name not in (exclude or {})]


def table(name: str, *classes: type, exclude: dict[str, str] | None = None, base: type[BaseModel] = Strict, **defaults: Any) -> Any:
    """A table model of the options of ``classes``, less ``exclude``: those the pipeline sets
    itself, each with the reason (a mask variant is its mode); ``defaults`` replaces an
    option's default where the pipeline's differs."""
    fields: dict[str, Any] = {}
    for option in table_options(*classes, exclude=exclude):
        key = option.declared.table_name or option.name
        fields[key] = (option.declared.table_type or option.type, _field(option, defaults))
    model = create_model(name, __base__=base, **fields)
    setattr(model, TABLE_OPTIONS, classes)
    setattr(model, SET_BY_PIPELINE, dict(exclude or {}))
    return model


def options_of_table(config: BaseModel, cls: type, **given: Any) -> Any:
    """``cls`` built from a table's values (by option name) and ``given`` (what the pipeline
    sets itself: paths, the mode of a variant, the Ray address)."""
    values: dict[str, Any] = {}
    for option in options_of(cls):
        key = option.declared.table_name or option.name
        if key in type(config).model_fields:
            values[option.name] = getattr(config, key)
    return build(cls, {**values, **given})
