"""``relearn review bench``: score a reviewer configuration on a labelled review benchmark.

Writes into the bench's folder:

- ``pool.jsonl``: the cases' trajectories, the reviewer's input;
- ``reviews.jsonl`` (and ``reviews.jsonl.calls.jsonl`` with judges): what the reviewer said,
  appended and resumable as ``relearn review`` writes them, so a rerun pays for nothing twice;
- ``timings.jsonl``: seconds per reviewed trajectory;
- ``bench-config.json``: which cases and which reviewer; a folder is never reused for another;
- ``bench.json`` and ``bench.md``: the figures (``review.bench.score``).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from records.pools import JsonlWriter, RecordError, iter_lines, read_trajectories_lenient, write_atomic, write_text_atomic
from records.review import Review, iter_reviews
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.ops.review import make_judges
from relearn.verbs.review import BenchOptions, LabelOptions
from review.bench import SHIPPED
from review.bench.cases import read_cases
from review.bench.score import score

if TYPE_CHECKING:
    from review.judges import Judge, Ledger

# The overall figures shown at the end and in bench.md, in this order.
SHOWN = [
    ("decision_accuracy", "decision accuracy"),
    ("decision_kappa", "decision Cohen's κ"),
    ("step_precision", "error steps: precision"),
    ("step_recall", "error steps: recall"),
    ("category_precision", "(step, category): precision"),
    ("category_recall", "(step, category): recall"),
    ("span_precision", "span precision (words)"),
    ("span_recall", "span recall (words)"),
    ("span_f1", "span F1 (words)"),
    ("minimality", "minimality (gold share of an error's excluded words)"),
    ("outside_words_per_error", "excluded words outside gold, per error"),
    ("collateral_damage", "collateral damage (gold-kept words excluded)"),
    ("collateral_words_per_trajectory", "gold-kept words excluded per trajectory"),
    ("no_valid_target_rate", "no_valid_target rate"),
    ("grounding_failure_case_rate", "cases with a quote that did not ground"),
    ("grounding_failure_quote_rate", "quotes that did not ground"),
    ("judge_error_rate", "judge errors / not reviewed"),
    ("cost_usd_per_trajectory", "cost per trajectory (USD)"),
    ("judge1_prompt_tokens_per_trajectory", "judge 1 prompt tokens per trajectory"),
    ("input_tokens_per_trajectory", "judge input tokens per trajectory"),
    ("cached_input_tokens_per_trajectory", "of which read from the prompt cache"),
    ("output_tokens_per_trajectory", "judge output tokens per trajectory"),
    ("latency_s_per_trajectory", "seconds per trajectory"),
]
# What the review ledger counts of the judges' billed tokens.
TOKENS = ("input_tokens", "cached_input_tokens", "output_tokens")
KIND_COLUMNS = [
    ("cases", "cases"),
    ("decision_accuracy", "decision"),
    ("step_recall", "step R"),
    ("category_recall", "cat. R"),
    ("span_f1", "span F1"),
    ("minimality", "minimality"),
    ("collateral_damage", "collateral"),
    ("no_valid_target_rate", "no target"),
]


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 0.01 and value else f"{value:.3f}"
    return str(value)


def reviewer_identity(judges: tuple[Judge, Judge] | None) -> dict[str, Any]:
    if judges is None:
        from review.heuristic import PROMPTS_VERSION

        return {"reviewer": "heuristic", "version": PROMPTS_VERSION}
    from review.judges import prompts_hash

    return {
        "reviewer": "judges",
        "prompts_hash": prompts_hash(),
        # A judge's reasoning settings only where it has some: a folder benched without them stays resumable.
        **{
            j.role: {"kind": j.spec.kind, "model": j.spec.model, "base_url": j.spec.base_url, "context": j.context}
            | ({"sampling": j.spec.sampling} if j.spec.sampling else {})
            for j in judges
        },
    }


@dataclass
class BenchSummary:
    result: dict[str, Any]  # what bench.json holds
    cases: int
    reviewer: str
    case_problems: list[str] = field(default_factory=list)  # unreadable cases
    unreadable: list[str] = field(default_factory=list)  # unreadable reviews
    not_reviewed: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return bool(self.case_problems or self.unreadable or self.not_reviewed)


def run_review_bench(
    options: BenchOptions, reporter: Reporter = SILENT, *, judges: tuple[Judge, Judge] | None | str = "from options"
) -> BenchSummary:
    """Review the bench's cases into ``options.output`` and score the reviews against their gold
    labels. ``judges``: already built (tests with their own retry settings); by default they
    are made from ``options.judges``. Raises ``OpError`` for a missing or empty case set, or a
    folder that holds another reviewer's or case set's bench."""
    # The judges' SDKs take seconds to import: loaded only when benchmarking.
    from review.run import review_pool

    if isinstance(judges, str):
        judges, _table = make_judges(options.judges)
    source = options.bench or SHIPPED
    if not source.exists():
        raise OpError(f"no such bench: {source}")
    problems: list[RecordError] = []
    cases = read_cases(source, problems)
    if not cases:
        raise OpError(f"{source} holds no readable case")
    digest = hashlib.sha256("\n".join(sorted(c.id + ":" + c.trajectory.id for c in cases)).encode())
    for case in cases:
        digest.update(case.gold.model_dump_json().encode())
    config = {"bench": str(source), "cases": len(cases), "cases_digest": digest.hexdigest()[:16], **reviewer_identity(judges)}
    directory = options.output
    config_path = directory / "bench-config.json"
    if config_path.exists():
        if json.loads(config_path.read_text()) != config:
            raise OpError(f"{directory} holds a bench of another reviewer or case set ({config_path}); choose another -o")
    else:
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(config_path, json.dumps(config, indent=2) + "\n")
    pool = directory / "pool.jsonl"
    write_atomic(pool, [c.trajectory for c in cases])
    reviews_path = directory / "reviews.jsonl"
    timings_path = directory / "timings.jsonl"
    # One worker measures each trajectory exactly: its seconds and the tokens the ledger counted
    # between two finished reviews. With more, only the run's totals are known.
    with stage(reporter, "bench", len(cases)), JsonlWriter(timings_path) as timings:
        last: dict[str, float] = {"latency_s": time.monotonic()}

        def done(review: Review | None, ledger: Ledger) -> None:
            now = {"latency_s": time.monotonic(), **{key: getattr(ledger, key, 0) for key in TOKENS}}
            if review is not None and options.workers == 1:
                timings.write({"trajectory_id": review.trajectory_id, **{key: round(now[key] - last.get(key, 0), 4) for key in now}})
            last.update(now)
            reporter.advance(1, spent=f"${ledger.spent_usd:.4f}")

        started = time.monotonic()
        summary, ledger = review_pool(
            pool, reviews_path, judges=judges, workers=options.workers, spend_cap_usd=options.spend_cap, on_done=done,
            include_suspicious=options.include_suspicious,
        )  # fmt: skip
        wall = time.monotonic() - started
    reviews: dict[str, Review] = {}
    unreadable: list[str] = [str(e) for e in summary.unreadable]
    for item in iter_reviews(reviews_path):
        if isinstance(item, Review):
            reviews[item.trajectory_id] = item
        else:
            unreadable.append(str(item))
    measured: dict[str, dict[str, float]] = {}
    for _number, text in iter_lines(timings_path) if timings_path.exists() else []:
        record = json.loads(text)
        measured[record.pop("trajectory_id")] = record
    result = score(cases, reviews, measured)
    result["config"] = config
    result["run"] = {
        "reviewed_now": summary.reviewed,
        "already_reviewed": summary.skipped,
        "not_reviewed": summary.not_reviewed,
        "wall_s": round(wall, 3),
        "workers": options.workers,
        "judge_calls": ledger.calls,
        "judge_calls_from_cache": ledger.cached,
        "spent_usd": ledger.spent_usd,
        **{key: getattr(ledger, key, None) for key in TOKENS},
    }
    write_text_atomic(directory / "bench.json", json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    write_text_atomic(directory / "bench.md", markdown(result))
    return BenchSummary(result, len(cases), str(config["reviewer"]), [str(p) for p in problems], unreadable, summary.errors)


def markdown(result: dict[str, Any]) -> str:
    config = result["config"]
    who = (
        config["reviewer"]
        if config["reviewer"] == "heuristic"
        else f"judge 1 {config['judge1']['model']} ({config['judge1']['kind']}), judge 2 {config['judge2']['model']} ({config['judge2']['kind']})"
    )
    lines = [
        f"# Review bench: {config['cases']} cases from `{config['bench']}`",
        "",
        f"Reviewer: {who}.",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    lines += [f"| {label} | {fmt(result['overall'][key])} |" for key, label in SHOWN]
    lines += [
        "",
        "## By kind of case",
        "",
        "| kind | " + " | ".join(label for _k, label in KIND_COLUMNS) + " |",
        "|---|" + "---|" * len(KIND_COLUMNS),
    ]
    lines += [
        f"| {kind} | " + " | ".join(fmt(figures[k]) for k, _label in KIND_COLUMNS) + " |" for kind, figures in result["by_kind"].items()
    ]
    lines += ["", "## Error detection by gold category", "", "| category | gold | found | precision | recall |", "|---|---|---|---|---|"]
    lines += [
        f"| {c} | {f['gold']} | {f['found']} | {fmt(f['precision'])} | {fmt(f['recall'])} |" for c, f in result["by_category"].items()
    ]
    lines += [
        "",
        "## Cases",
        "",
        "| case | gold | decision | gold errors | found errors | span TP/FP/FN words |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["cases"]:
        found = ", ".join(f"{s}:{c}" for s, c in row["errors"]) or "–"
        gold = ", ".join(f"{s}:{c}" for s, c in row["gold_errors"]) or "–"
        decision = row["decision"] + (f" ({row['reason'].split(':')[0]})" if row["decision"] == "reject" and row["reason"] else "")
        lines.append(
            f"| {row['case']} | {row['gold_decision']} | {decision} | {gold} | {found} | {row['word_tp']}/{row['word_fp']}/{row['word_fn']} |"
        )
    return "\n".join(lines) + "\n"


@dataclass
class LabelSummary:
    cases: int
    problems: list[str]  # reviews that could not be labelled, unreadable lines of either file


def run_label(options: LabelOptions, reporter: Reporter = SILENT) -> LabelSummary:
    """The latest review of each trajectory as a labelled case; raises ``OpError`` when none can be."""
    from review.bench.cases import BenchCase, case_from_review, write_cases

    latest: dict[str, Review] = {}
    problems: list[str] = []
    for item in iter_reviews(options.reviews):
        if isinstance(item, Review):
            latest[item.trajectory_id] = item
        else:
            problems.append(str(item))
    unreadable: list[RecordError] = []
    cases: list[BenchCase] = []
    for trajectory in read_trajectories_lenient(options.pool, unreadable):
        if trajectory.id in latest:
            try:
                cases.append(case_from_review(trajectory, latest[trajectory.id]))
            except ValueError as exc:
                problems.append(f"{options.reviews}: trajectory {trajectory.id}: {exc}")
    problems += [str(e) for e in unreadable]
    if not cases:
        raise OpError("no reviewed trajectory could be labelled" + (f" (first problem: {problems[0]})" if problems else ""))
    write_cases(options.output, cases)
    return LabelSummary(len(cases), problems)
