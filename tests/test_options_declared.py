"""Each option declared once (``relearn.options``) and reachable from both front-ends: the verb's
flags and its pipeline table are derived from the same declaration, an option one front-end
lacks says why, help pages name choices instead of Python types, and mistakes get one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.main import get_command
from typer.testing import CliRunner

from relearn.cli.declared import OPTIONS_CLASS
from relearn.cli.main import app
from relearn.options import Declared, options_of
from relearn.pipeline.config import PipelineConfig, PipelineError, load_pipeline
from relearn.pipeline.tables import SET_BY_PIPELINE, TABLE_OPTIONS

# The verbs a pipeline stage runs: their options must be declared, so the stage's table follows.
STAGE_VERBS = {
    "collect", "import", "verify", "review pool", "masks", "train", "analyze nll", "eval run",
    "single-turn import", "single-turn verify", "single-turn review",
}  # fmt: skip
PYTHON_TYPE = re.compile(r"<(str|int|float|bool|path|file|directory|list\[[^>]*\]|int range|float range|[a-z]+\[[^>]*\])>")


def verbs(command: Any = None, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every leaf command of ``relearn``, by its words (``review pool``)."""
    command = command or get_command(app)
    subs = getattr(command, "commands", None)
    if not subs:
        return {" ".join(path): command}
    found: dict[str, Any] = {}
    for name, sub in subs.items():
        found.update(verbs(sub, (*path, name)))
    return found


def tables(model: type[BaseModel] = PipelineConfig) -> list[type[BaseModel]]:
    """Every table of the pipeline file derived from a verb's options."""
    found = [model] if hasattr(model, TABLE_OPTIONS) else []
    for field in model.model_fields.values():
        for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found += tables(candidate)
    return found


def flags_of(command: Any) -> set[str]:
    return {param.name for param in command.params}


def test_every_stage_verb_is_derived_from_its_declarations() -> None:
    derived = {name for name, command in verbs().items() if getattr(command.callback, OPTIONS_CLASS, None)}
    assert STAGE_VERBS <= derived, f"stage verbs whose flags are written by hand: {sorted(STAGE_VERBS - derived)}"


def test_every_option_is_in_both_front_ends_or_says_why_not() -> None:
    by_class: dict[type, list[tuple[str, Any]]] = {}
    for name, command in verbs().items():
        cls = getattr(command.callback, OPTIONS_CLASS, None)
        if cls is not None:
            by_class.setdefault(cls, []).append((name, command))
    problems, checked = [], 0
    for table in tables():
        fields = {f.alias or name for name, f in table.model_fields.items()} | set(table.model_fields)
        set_by_pipeline: dict[str, str] = getattr(table, SET_BY_PIPELINE)
        for cls in getattr(table, TABLE_OPTIONS):
            # The verbs whose options are this class or hold it nested.
            users = [(n, c) for owner, found in by_class.items() for n, c in found if cls is owner or cls in _nested_classes(owner)]
            assert users, f"{table.__name__}: no verb declares {cls.__name__}"
            for option in options_of(cls):
                checked += 1
                where, front = f"{table.__name__} / {cls.__name__}.{option.name}", option.declared.front
                in_table = (option.declared.table_name or option.name) in fields
                if front == "both" and not in_table and not set_by_pipeline.get(option.name):
                    problems.append(f"{where}: not in the table and no reason given")
                if front == "cli" and in_table:
                    problems.append(f"{where}: declared command-line only but the table has it")
                for verb, command in users:
                    if front != "pipeline" and option.name not in flags_of(command):
                        problems.append(f"{where}: `relearn {verb}` lacks it")
                    if front == "pipeline" and option.name in flags_of(command):
                        problems.append(f"{where}: declared pipeline only but `relearn {verb}` has it")
    assert checked > 100 and not problems, "\n".join(problems)


def _nested_classes(cls: type) -> set[type]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    found: set[type] = set()
    for field in dataclasses.fields(cls):
        inner = hints[field.name]
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            found |= {inner, *_nested_classes(inner)}
    return found


def test_a_one_sided_option_must_say_why() -> None:
    with pytest.raises(ValueError, match="must say why"):
        Declared(help="a flag", front="cli")
    assert Declared(help="a flag", front="cli", why="the pipeline names it").why


@pytest.mark.parametrize("verb", sorted(STAGE_VERBS))
def test_help_names_choices_not_python_types(verb: str) -> None:
    result = CliRunner().invoke(app, [*verb.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert not PYTHON_TYPE.findall(result.output), f"relearn {verb} --help shows Python types: {PYTHON_TYPE.findall(result.output)}"


def test_every_help_page_names_choices_not_python_types() -> None:
    shown = {}
    for name in verbs():
        output = CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "200"}).output
        if PYTHON_TYPE.search(output):
            shown[name] = sorted(set(PYTHON_TYPE.findall(output)))
    assert not shown, f"help pages showing Python types: {shown}"


def test_the_train_flags_and_the_train_table_come_from_one_declaration() -> None:
    """The option the issue found in the pipeline only now has its flag, with its default."""
    help_text = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output
    assert "--gradient-checkpointing / --no-gradient-checkpointing" in help_text
    assert "--loss-norm [trajectory|token]" in help_text
    train_table = PipelineConfig.model_fields["train"].annotation.__args__[0]  # TrainConfig | None
    assert train_table.model_fields["gradient_checkpointing"].default is True
    assert "zero" not in train_table.model_fields  # a launcher's option: command line only


def test_a_usage_error_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", str(tmp_path), "--out", str(tmp_path / "o"), "--ctx", "0", "--tiny", "qwen3"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Invalid value for '--ctx': 0 is not at least 1"), result.stderr
    assert "relearn train --help" in lines[0]
    bad_choice = CliRunner().invoke(app, ["train", str(tmp_path), "--out", str(tmp_path / "o"), "--loss-norm", "mean"])
    assert bad_choice.exit_code == 2 and bad_choice.stderr.startswith("error: ") and "'trajectory', 'token'" in bad_choice.stderr


def test_a_mistyped_pipeline_field_names_the_nearest(tmp_path: Path) -> None:
    path = tmp_path / "PIPELINE.toml"
    path.write_text(
        'workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n[masks]\nvarients = ["ross"]\n[train]\ntiny = "qwen3"\nzz = 1\n'
    )
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    message = str(raised.value)
    assert "masks.varients: no such field; did you mean `variants`?" in message
    assert "train.zz: no such field; known: " in message and "epochs" in message


def test_the_trainer_takes_what_the_masks_stage_keeps(tmp_path: Path) -> None:
    """[train].ctx follows [masks].ctx unless written, and is never shorter: a shorter one would
    refuse samples the masks stage compiled."""
    base = 'workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n[masks]\nctx = 16384\n[train]\ntiny = "qwen3"\n'
    path = tmp_path / "PIPELINE.toml"
    path.write_text(base)
    config = load_pipeline(path)
    assert config.train is not None and config.train.ctx == 16384
    path.write_text(base + "ctx = 8192\n")
    with pytest.raises(PipelineError, match="train.ctx 8192 is shorter than masks.ctx 16384"):
        load_pipeline(path)
