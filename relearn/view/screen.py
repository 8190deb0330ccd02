"""A trajectory on screen: its steps (the task, each assistant turn with what follows it, the
final patch), the header, and each step rendered with its defects marked (``marks``). The
viewer and ``relearn view --print`` both show this."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.rule import Rule
from rich.syntax import Syntax
from rich.text import Text

from records.pool_index import summarize_review
from records.review import Review
from records.trajectory import Trajectory, is_verified_positive
from relearn.masks.scopes import ACTION_SCOPE
from relearn.view.catalog import Catalog, Tokens
from relearn.view.marks import (
    STYLES,
    Numbered,
    RenderOptions,
    check_defect,
    collapse,
    excluded_share,
    keep_intervals,
    keep_legend,
    layout_assistant,
    legend,
    mark_defects,
    mark_keep,
    scoped_range,
)


@dataclass
class Step:
    kind: Literal["task", "turn", "diff"]
    messages: list[int]

    def title(self) -> str:
        if self.kind == "task":
            return "task"
        if self.kind == "diff":
            return "final patch"
        return f"turn (message {self.messages[0]})"


def steps_of(trajectory: Trajectory) -> list[Step]:
    """The task (messages before the first assistant turn), one step per assistant
    message with the results and messages that follow it, and the final patch."""
    steps: list[Step] = [Step("task", [])]
    for index, message in enumerate(trajectory.messages):
        if message.role == "assistant":
            steps.append(Step("turn", [index]))
        else:
            steps[-1].messages.append(index)
    steps.append(Step("diff", []))
    return steps


@dataclass(frozen=True)
class Heading:
    """A step's or a message's title on a rule, as rich's left-aligned ``Rule`` draws it,
    except that a title too wide for the screen wraps onto lines of its own above the rule:
    ``Rule`` cuts it with an ellipsis, and the part cut (the excluded share, the scope, an
    exit code) is what the reader came for."""

    title: Text
    rule_style: str = ""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.title.cell_len + 2 <= options.max_width:  # Rule keeps 2 columns for " ─"
            yield Rule(self.title, align="left", style=self.rule_style)
        else:
            yield self.title
            yield Rule(style=self.rule_style)


class TrajectoryView:
    """One trajectory, its review and its dataset figures, ready to render step by step."""

    def __init__(
        self,
        trajectory: Trajectory,
        review: Review | None = None,
        *,
        reviews_given: bool = False,
        tokens: Tokens | None = None,
        dataset_mode: str | None = None,
        ter: float | None = None,
        ter_source: str = "chars",
        position: int = 0,
        total: int | None = None,
        scope: str | None = ACTION_SCOPE,
    ) -> None:
        self.trajectory = trajectory
        self.review = review
        self.reviews_given = reviews_given or review is not None
        self.tokens = tokens
        self.dataset_mode = dataset_mode
        self.ter, self.ter_source = ter, ter_source
        self.position, self.total = position, total
        # The defect scope the text is struck under (``relearn masks --defect-scope``); None
        # where nothing is excluded (a dataset compiled in a mode that does not mask).
        self.scope = scope
        self.steps = steps_of(trajectory)
        self.defects = [Numbered(n, d, check_defect(trajectory, d)) for n, d in enumerate(review.defects if review else [], start=1)]
        for item in self.defects:
            if item.problem is None and not trajectory.messages[item.defect.message_index].generated:
                item.problem = "in a message the policy did not generate (never supervised)"
            elif item.problem is None and scope is None:
                item.problem = f"not excluded: the dataset's mode is {dataset_mode}"

    # -- what the trajectory contributes ------------------------------------------------
    @property
    def selected(self) -> bool:
        """Whether its generated text is supervised: in the dataset when one is given,
        else what ``relearn masks`` would select (ross with reviews, positive without)."""
        if self.dataset_mode is not None:
            return self.tokens is not None
        if not is_verified_positive(self.trajectory):
            return False
        if self.reviews_given:
            return self.review is not None and self.review.decision == "accept"
        return True

    def selection_note(self) -> Text:
        out = Text()
        if self.dataset_mode is not None:
            if self.tokens is not None:
                out.append(f"in the dataset ({self.dataset_mode})", STYLES["good"])
                out.append(f" · {self.tokens.eligible:,} eligible, {self.tokens.excluded:,} excluded tokens")
                if self.tokens.context.endswith(" as sent"):
                    rule = self.tokens.context.removesuffix(" as sent")
                    out.append(f" · {self.tokens.samples} samples, one a turn under the context as sent ({rule})", STYLES["context"])
                if self.tokens.targets in ("recorded", "partly_recorded"):
                    out.append(" · trained on the recorded token ids", STYLES["context"])
                elif self.tokens.targets == "ids_disagree":
                    out.append(" · recorded ids disagree with the text: the text trained", STYLES["warning"])
                if self.dataset_mode != "ross" and self.defects:
                    out.append(f" · the defects shown are not excluded in mode {self.dataset_mode}", STYLES["warning"])
            else:
                out.append(f"not in the dataset ({self.dataset_mode})", STYLES["bad"])
            return out
        mode = "ross" if self.reviews_given else "positive"
        if self.selected:
            out.append(f"would enter the dataset ({mode})", STYLES["good"])
        elif not is_verified_positive(self.trajectory):
            out.append("would not enter: not verified positive", STYLES["bad"])
        elif self.review is None:
            out.append("would not enter: no review", STYLES["bad"])
        else:
            out.append(f"would not enter: review rejected ({self.review.reason or 'no reason'})", STYLES["bad"])
        return out

    # -- header ---------------------------------------------------------------------------
    def header(self) -> Text:
        t = self.trajectory
        out = Text()
        where = f"trajectory {self.position + 1:,}" + (f"/{self.total:,}" if self.total is not None else "")
        out.append(where, STYLES["title"])
        out.append(f" · {t.id}\n")
        out.append("task ", STYLES["context"])
        out.append(t.task_id or "?", STYLES["title"])
        policy = t.policy
        out.append(" · policy ", STYLES["context"])
        out.append(policy.name or "?")
        if policy.checkpoint:
            out.append(f" @ {policy.checkpoint}")
        if policy.step is not None:
            out.append(f" step {policy.step}")
        if t.attempt is not None:
            out.append(f" · attempt {t.attempt}")
        out.append("\n")
        outcome = t.outcome
        if outcome is None:
            out.append("no outcome (not verified)", STYLES["warning"])
        else:
            if is_verified_positive(t):
                out.append("✓ resolved" if outcome.resolved is not None else "✓ positive", STYLES["good"])
            else:
                out.append("✗ unresolved" if outcome.resolved is not None else "✗ not positive", STYLES["bad"])
            if outcome.reward is not None:
                out.append(f" · reward {outcome.reward:g}")
            tests = (outcome.verdict or {}).get("tests") or {}
            for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
                group = tests.get(key) if isinstance(tests, dict) else None
                if isinstance(group, dict):
                    passed, failed = len(group.get("success") or []), len(group.get("failure") or [])
                    out.append(f" · {key} ", STYLES["context"])
                    out.append(f"{passed}/{passed + failed}", STYLES["good"] if not failed else STYLES["bad"])
        out.append(" · exit ", STYLES["context"])
        out.append(str(t.exit_status))
        out.append("\n")
        out.append_text(verifier_notes(t))
        if self.review is not None:
            out.append("review ", STYLES["context"])
            out.append(self.review.decision, STYLES["good"] if self.review.decision == "accept" else STYLES["bad"])
            if self.review.reason:
                out.append(f" ({self.review.reason})")
            counts: dict[str, int] = {}
            for item in self.defects:
                counts[item.defect.category] = counts.get(item.defect.category, 0) + 1
            out.append(f" · {len(self.defects)} defect{'s' if len(self.defects) != 1 else ''}")
            if counts:
                out.append(": " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
            kept = keep_intervals(self.review)
            if kept:
                audit = (self.review.model_extra or {}).get("audit") or {}
                out.append(f" · {len(kept)} keep interval{'s' if len(kept) != 1 else ''} (A ∩ K) · audit {audit.get('verdict', '—')}")
        elif self.reviews_given:
            out.append("not reviewed", STYLES["warning"])
        else:
            out.append("no reviews given", STYLES["context"])
        out.append(" · TER ", STYLES["context"])
        if self.ter is None:
            out.append("—")
        elif self.ter_source == "tokens" and self.tokens is not None:
            out.append(f"{self.ter:.1%}", STYLES["title"])
            out.append(f" ({self.tokens.excluded}/{self.tokens.eligible} tokens)")
        else:
            out.append(f"≈{self.ter:.1%}", STYLES["title"])
            out.append(" (characters)", STYLES["context"])
        out.append("\n")
        out.append_text(self.selection_note())
        return out

    # -- steps ------------------------------------------------------------------------
    def step(self, number: int, options: RenderOptions | None = None) -> Group:
        options = options or RenderOptions()
        step = self.steps[number]
        parts: list[RenderableType] = [Heading(Text(f"step {number}/{len(self.steps) - 1} · {step.title()}", STYLES["title"]))]
        if step.kind == "diff":
            parts.append(self.diff())
            return Group(*parts)
        for index in step.messages:
            parts.extend(self.message(index, options))
        if step.kind == "task" and not step.messages:
            parts.append(Text("(no messages before the first assistant turn)", STYLES["context"]))
        return Group(*parts)

    def message(self, index: int, options: RenderOptions) -> list[RenderableType]:
        message = self.trajectory.messages[index]
        title = Text()
        if message.role == "assistant":
            base = ("supervised" if self.selected else "eligible") if message.generated else "context"
            doc = layout_assistant(message, base)
            keep = [k for k in keep_intervals(self.review) if k.message_index == index]
            numbered = [n for n in self.defects if n.defect.message_index == index]
            spans = [
                (n, span)
                for n in numbered
                if n.problem is None and self.scope is not None and not keep
                if (span := scoped_range(doc, self.trajectory, n.defect, self.scope)) is not None
            ]
            share = excluded_share(doc, [span for _, span in spans])
            if message.generated:
                title.append(f"assistant · message {index} · generated · ")
                if not self.selected:
                    title.append("not supervised (trajectory not selected)", STYLES["warning"])
                elif share:
                    title.append(f"{share} excluded", STYLES["bad"])
                    title.append(f" ({self.scope} scope)", STYLES["context"])
                else:
                    title.append("supervised", STYLES["good"])
            else:
                title.append(f"assistant · message {index} · not generated · context only")
            if keep:  # a single-turn keep review: show what is kept, not struck defects
                body = mark_keep(doc, message, keep, options)
                body.rstrip()
                return [Heading(title, "dim"), body, keep_legend(self.review, keep)]
            body = mark_defects(doc, spans, options)
            body.rstrip()
            parts: list[RenderableType] = [Heading(title, "dim"), body]
            if numbered:
                parts.append(legend(numbered))
            return parts
        if message.role == "tool":
            title.append(f"tool result · message {index}")
            if message.name:
                title.append(f" · {message.name}")
            title.append(f" · {message.tool_call_id}")
            meta = message.metadata or {}
            if "exit_code" in meta:
                title.append(" · exit ")
                title.append(str(meta["exit_code"]), STYLES["good"] if meta["exit_code"] == 0 else STYLES["bad"])
            seconds = meta.get("duration_seconds")
            if isinstance(seconds, int | float):
                title.append(f" · {seconds:.2f} s")
        else:
            title.append(f"{message.role} · message {index}")
        title.append(" · context")
        text = message.content or ""
        body = collapse(text, options, "context") if message.role != "user" else Text(text, STYLES["context"])
        body.rstrip()
        defects = [n for n in self.defects if n.defect.message_index == index]
        parts = [Heading(title, "dim"), body]
        if defects:
            parts.append(legend(defects))
        return parts

    def diff(self) -> RenderableType:
        patch = self.trajectory.final_patch
        if not patch:
            return Text("(no final patch)", STYLES["context"])
        return Syntax(patch, "diff", theme="ansi_dark", word_wrap=True, background_color="default")

    def document(self, options: RenderOptions | None = None) -> Group:
        """Every step, for --print."""
        options = options or RenderOptions()
        return Group(self.header(), *(self.step(n, options) for n in range(len(self.steps))))

    # -- search -------------------------------------------------------------------------
    def step_text(self, number: int) -> str:
        """Everything a step shows, whole, for searching."""
        step = self.steps[number]
        if step.kind == "diff":
            return self.trajectory.final_patch or ""
        chunks: list[str] = []
        for index in step.messages:
            message = self.trajectory.messages[index]
            chunks += [message.content or "", message.reasoning_content or ""]
            for call in message.tool_calls or []:
                chunks.append(call.function.name)
                chunks += [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in call.function.arguments.values()]
        return "\n".join(chunks)


def load_view(catalog: Catalog, position: int) -> TrajectoryView:
    """The trajectory at a pool position with its review and figures; raises a located
    RecordError for an unreadable record."""
    trajectory = catalog.pool.load(position)
    review = catalog.reviews.review(trajectory.id) if catalog.reviews is not None else None
    dataset = catalog.dataset
    tokens = dataset.by_trajectory.get(trajectory.id) if dataset is not None else None
    if dataset is not None:
        ter, source = (tokens.ter if tokens else None), "tokens"
    else:
        eligible = catalog.summary(position).eligible_chars
        ter, source = (summarize_review(review).defect_chars / eligible if review is not None and eligible else None), "chars"
    return TrajectoryView(
        trajectory,
        review,
        reviews_given=catalog.reviews is not None,
        tokens=tokens,
        dataset_mode=str(dataset.stats.get("mode", "?")) if dataset is not None else None,
        ter=ter,
        ter_source=source,
        position=position,
        total=len(catalog.pool) if catalog.pool.ready.is_set() else None,
        scope=catalog.defect_scope(),
    )


def verifier_notes(trajectory: Trajectory) -> Text:
    """What the verifier refused, restored, neutralized, found contradictory or suspicious, one
    line each (nothing when it had nothing to say)."""
    outcome = trajectory.outcome
    verdict = (outcome.verdict if outcome else None) or {}
    out = Text()
    for label, key, style in (
        ("refused", "refused", "bad"), ("restored to the base", "restored_files", "warning"), ("neutralized", "neutralized", "warning"),
        ("disagreement", "disagreements", "bad"),
    ):  # fmt: skip
        items = verdict.get(key) or []
        if items:
            out.append(f"verifier {label}: ", STYLES[style])
            out.append("; ".join(str(i) for i in items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "") + "\n")
    if outcome is not None and outcome.suspicious:
        out.append("suspicious (kept out of review and training): ", STYLES["warning"])
        out.append("; ".join(outcome.suspicious[:3]) + "\n")
    return out
