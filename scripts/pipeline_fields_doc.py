"""Write the pipeline file's field reference into docs/pipeline.md, from the pydantic models.

    python scripts/pipeline_fields_doc.py [--check]

Replaces what lies between the `fields:begin` and `fields:end` markers of docs/pipeline.md
with one table per pipeline table (field, type, default, the option's help where the table is derived from a verb's
options, else the comment beside the field in relearn/pipeline/config.py), so the page says what the file can say. Rerun it after changing
the config; `--check` exits 1 when the page is not current.
"""

from __future__ import annotations

import enum
import inspect
import re
import sys
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from relearn.options import options_of
from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.tables import SET_BY_PIPELINE, TABLE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent

PAGE = ROOT / "docs" / "pipeline.md"
BEGIN = "<!-- fields:begin (written by scripts/pipeline_fields_doc.py) -->"
END = "<!-- fields:end -->"


def type_text(annotation: object) -> str:
    """A field's type as a reader writes it in TOML terms; enums and literals list their values."""
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(type_text(a) for a in args)
    if annotation is type(None):
        return "none"
    if typing.get_origin(annotation) is dict:
        return "table"
    text = re.sub(r"<class '([^']+)'>", r"\1", str(annotation)).replace("typing.", "")
    return re.sub(r"\b[a-z_]+(\.[a-z_]+)*\.(?=[A-Za-z])", "", text)


def field_notes(cls: type) -> dict[str, str]:
    """The comment written beside each field in the model's source."""
    notes: dict[str, str] = {}
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # a table derived from options (relearn.pipeline.tables) has no source
        return notes
    for line in source.split("\n"):
        match = re.match(r"^    (\w+):[^#]*#\s*(.*)$", line)
        if match and not match.group(2).startswith(("type:", "noqa")):
            notes[match.group(1)] = match.group(2).strip()
    return notes


def nested_model(annotation: object) -> type[BaseModel] | None:
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def default_text(field: typing.Any) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    if field.default is PydanticUndefined:
        return "required"
    value = field.default.value if isinstance(field.default, enum.Enum) else field.default
    return f"`{value!r}`"


def tables(cls: type[BaseModel], path: str) -> list[str]:
    out = [f"### `[{path}]`\n" if path else "### Top level\n"]
    if cls.__doc__:
        out.append(" ".join(cls.__doc__.split()) + "\n")
    rows, below = [], []
    notes = field_notes(cls)
    for name, field in cls.model_fields.items():
        if field.exclude:
            continue
        key = field.alias or name
        sub = nested_model(field.annotation)
        if sub is not None:
            below.append((f"{path}.{key}" if path else key, sub))
            continue
        rows.append(
            f"| `{key}` | {type_text(field.annotation)} | {default_text(field).replace('|', chr(92) + '|')} | {field.description or notes.get(name, '')} |"
        )
    if rows:
        out.append("| field | type | default | note |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")
    for sub_path, sub in below:
        out.extend(tables(sub, sub_path))
    return out


def one_sided(cls: type[BaseModel], path: str) -> list[str]:
    """The options of the verbs behind each table that the file does not say, each with why."""
    rows = []
    if hasattr(cls, TABLE_OPTIONS):
        set_by_pipeline = getattr(cls, SET_BY_PIPELINE)
        for option in (o for options in getattr(cls, TABLE_OPTIONS) for o in options_of(options)):
            why = option.declared.why if option.declared.front == "cli" else set_by_pipeline.get(option.name)
            if why:
                rows.append(f"| `[{path}]` | `{option.name}` | {why} |")
    for name, field in cls.model_fields.items():
        sub = nested_model(field.annotation)
        if sub is not None:
            rows += one_sided(sub, f"{path}.{field.alias or name}" if path else field.alias or name)
    return rows


def reference() -> str:
    lacking = [
        "### What the file does not say\n",
        "The options of the verbs behind the tables that only the command line has, each with the reason "
        "(declared beside the option; `tests/test_options_declared.py` holds every other option to both).\n",
        "| table | option | why the file does not say it |\n|---|---|---|\n"
        + "\n".join(dict.fromkeys(one_sided(PipelineConfig, "")))
        + "\n",
    ]
    return "\n".join([BEGIN, *tables(PipelineConfig, ""), *lacking, END])


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    if BEGIN not in text or END not in text:
        print(f"{PAGE}: the markers {BEGIN!r} and {END!r} are missing", file=sys.stderr)
        return 2
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + reference() + text[end:]
    if "--check" in argv:
        if new != text:
            print(f"{PAGE}: the field reference is not current; run python scripts/pipeline_fields_doc.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
