"""relearn's eligible mask A against transformers' assistant mask, one chat template family at a time.

    python scripts/check_chat_templates.py POOL [FAMILY ...] [--tokenizer qwen3.6]

For each family (default: every ``NAME_training`` template the installed ``trl`` ships that
renders tool calls), every trajectory of POOL is rendered and compiled as ``relearn masks
--mode positive --chat-template NAME_training`` compiles it (no defects, recorded ids not
consulted: a pool sampled from another tokenizer still checks), and the same conversation is
rendered by ``apply_chat_template(..., return_assistant_tokens_mask=True)``, the mask TRL's
``assistant_only_loss`` trains. One line per family:

    family  kept/total  ids identical  A outside TRL's mask (+ its stop markers)  tokens only in TRL's mask

``kept``: compiled (the rest are refused, with the three commonest reasons below the line);
``ids identical``: of those kept, how many have the same token ids as transformers' render;
``A outside``: tokens relearn supervises that TRL's mask does not (must be 0), apart from the
tokens of a turn's stop marker (one the probe found the template ending a generated turn with,
so one the model generates to stop, such as DiffusionGemma's ``<|tool_response>`` after a call),
which are counted on their own, by marker and turns (a ``_training`` template that leaves its
model's stop token outside ``{% generation %}`` trains a model that never learns to stop there);
``only in TRL``: the decoded tokens TRL's mask has and A lacks, the commonest first (tokens the
model never generates: the generation prompt's, the newline after an end of turn). Both renders
are given the same messages: a turn in a shape the template refuses or misplaces is adapted for
both (``relearn.masks.adapt``: gpt-oss's merged analysis, DiffusionGemma's text then calls). The tables in docs/masks.md come from this script. Exit 1 when a kept
trajectory's ids differ or A has a token outside TRL's mask that is not a stop marker.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from records.pools import RecordError, iter_pool  # noqa: E402
from records.trajectory import Trajectory  # noqa: E402
from relearn.masks.compile import compile_one  # noqa: E402
from relearn.masks.template import RenderError, Turn, probe, render, template_input  # noqa: E402
from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template, trl_chat_templates, with_chat_template  # noqa: E402
from relearn.masks.tokens import encode_render  # noqa: E402

TRAINING = "_training"


@dataclass
class FamilyCheck:
    """One family's figures over the pool."""

    family: str
    total: int
    kept: int = 0
    ids_identical: int = 0
    a_outside: int = 0  # tokens of A outside TRL's mask, over the kept trajectories with identical ids
    # Of A outside TRL's mask, the tokens of a turn's stop marker: marker -> [tokens, turns].
    a_stops: dict[str, list[int]] = field(default_factory=dict)
    only_trl: Counter[str] = field(default_factory=Counter)  # decoded token -> count
    refused: Counter[str] = field(default_factory=Counter)  # reason -> trajectories
    seconds: float = 0.0

    @property
    def agrees(self) -> bool:
        return self.ids_identical == self.kept and self.a_outside == 0

    def line(self, shown: int) -> str:
        only = ", ".join(f"{token!r} {n}" for token, n in self.only_trl.most_common(shown)) or "none"
        stops = "".join(f" (+ stop {marker!r}: {tokens} tokens in {turns} turns)" for marker, (tokens, turns) in self.a_stops.items())
        return (
            f"{self.family}: kept {self.kept}/{self.total}, ids identical {self.ids_identical}/{self.kept}, "
            f"A outside TRL's mask {self.a_outside}{stops}, only in TRL's mask: {only} ({self.seconds:.1f} s)"
        )


def tool_families() -> list[str]:
    """Every ``_training`` template trl ships that renders tool calls, by family name."""
    return sorted(p.stem.removesuffix(TRAINING) for p in trl_chat_templates().glob(f"*{TRAINING}.jinja") if "tool_calls" in p.read_text())


def training_template(family: str) -> str:
    """The text of ``family``'s ``_training`` variant (its ``{% generation %}`` markers give TRL's mask)."""
    name = family if family.endswith(TRAINING) or Path(family).is_file() else family + TRAINING
    return resolve_chat_template(name)


def check_family(family: str, pool: list[Trajectory], base: Any, template_kwargs: dict[str, Any]) -> FamilyCheck:
    result = FamilyCheck(family, len(pool))
    started = time.perf_counter()
    tokenizer = with_chat_template(base, training_template(family))
    try:
        shape = probe(tokenizer, template_kwargs)
    except RenderError as exc:
        result.refused[f"probe: {exc}"[:120]] = len(pool)
        return result
    for trajectory in pool:
        try:
            rendered = render(trajectory, tokenizer, template_kwargs=template_kwargs, shape=shape)
            encoded = encode_render(tokenizer, rendered, False)
            sample = compile_one(rendered, trajectory, [], tokenizer, trajectory.id, exclude=False, encoded=encoded, recorded_ids=False)
        except Exception as exc:  # noqa: BLE001 - a refusal of any kind is a figure of the check, with its reason
            reason = str(exc) if isinstance(exc, RenderError) else f"{type(exc).__name__}: {exc}"
            result.refused[reason[:120]] += 1
            continue
        result.kept += 1
        chat = template_input(trajectory, shape=shape)
        theirs = tokenizer.apply_chat_template(
            chat.chat, tools=chat.tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **template_kwargs
        )
        ids = np.asarray(theirs["input_ids"])
        if not np.array_equal(ids, sample.input_ids):
            continue
        result.ids_identical += 1
        trl_mask = np.asarray(theirs["assistant_masks"], dtype=np.uint8)
        a = np.asarray(sample.eligible_mask, dtype=np.uint8)
        outside = (a == 1) & (trl_mask == 0)
        for marker, (lo, hi) in stop_spans(rendered.text, rendered.turns, shape.stops):
            at_stop = outside & (encoded.offsets[:, 0] < hi) & (encoded.offsets[:, 1] > lo)
            if at_stop.any():
                counts = result.a_stops.setdefault(marker, [0, 0])
                counts[0] += int(at_stop.sum())
                counts[1] += 1
                outside &= ~at_stop
        result.a_outside += int(outside.sum())
        result.only_trl.update(tokenizer.decode([int(i)]) for i in ids[(a == 0) & (trl_mask == 1)])
    result.seconds = time.perf_counter() - started
    return result


def stop_spans(text: str, turns: list[Turn], stops: tuple[str, ...]) -> list[tuple[str, tuple[int, int]]]:
    """Each turn's stop marker (the longest of ``stops`` it ends with) and its characters."""
    out = []
    for turn in turns:
        ending = [stop for stop in stops if text.startswith(stop, turn.end - len(stop)) and turn.end - len(stop) >= turn.start]
        if ending:
            stop = max(ending, key=len)
            out.append((stop, (turn.end - len(stop), turn.end)))
    return out


def read_pool(path: Path) -> list[Trajectory]:
    errors: list[RecordError] = []
    pool = [trajectory for _line, trajectory in iter_pool(path, errors)]
    for error in errors:
        print(f"skipped: {error}", file=sys.stderr)
    return pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pool", type=Path, help="Pool of trajectories (.jsonl or .jsonl.zst).")
    parser.add_argument("families", nargs="*", help="Template families (qwen3, glm4moe, ...; default: every trl family with tool calls).")
    parser.add_argument("--tokenizer", default="qwen3.6", help="The tokenizer (built-in name or folder) the templates render with.")
    parser.add_argument("--no-preserve-thinking", action="store_true", help="Render with preserve_thinking=False.")
    parser.add_argument("--shown", type=int, default=8, help="Tokens only in TRL's mask shown per family.")
    args = parser.parse_args(argv)
    pool = read_pool(args.pool)
    families = [f for arg in args.families for f in arg.split(",") if f] or tool_families()
    base = load_tokenizer(args.tokenizer)
    template_kwargs = {"preserve_thinking": not args.no_preserve_thinking}
    print(f"{args.pool}: {len(pool)} trajectories, tokenizer {args.tokenizer}, {len(families)} families")
    agree = True
    for family in families:
        result = check_family(family, pool, base, template_kwargs)
        print(result.line(args.shown), flush=True)
        for reason, count in result.refused.most_common(3):
            print(f"    refused {count}: {reason}")
        agree = agree and result.agrees
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
