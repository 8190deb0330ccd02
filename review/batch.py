"""Judge requests through the providers' batch APIs, at their batch price (half).

A batch run fills the same call cache an ordinary run reads, in two rounds: every judge-1
request the cache cannot answer goes out as Anthropic Message Batches or OpenAI Batches;
once they end, every judge-2 request those answers lead to goes out the same way. The
ordinary review then runs over the pool and finds its answers in the cache, so it sends
only what a batch could not answer (an errored or expired request, an unusable answer):
those are retried one by one at full price. Which requests a round needs is learned by
running the review itself with ``defer`` (review.judges), so a batch asks exactly what an
ordinary run would.

Every batch created is recorded, before anything else happens, in a state file beside the
reviews (``reviews.jsonl.batches.json``, replaced atomically). A run that is killed while
a batch is processing finds it there and polls it again; a request recorded in a batch of
its round is never submitted again (its failure is retried online instead).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.policies.make import make_policy
from records.trajectory import Trajectory, Usage
from review.judges import CallCache, Judge, JudgeRequest, Ledger, SpendCapReached, review_trajectory

# Both vendors bill batch requests at half their price.
BATCH_DISCOUNT = 0.5
# Per-batch limits: Anthropic 100,000 requests or 256 MB; OpenAI 50,000 requests or a
# 200 MB input file. A little under the byte limits, for the envelope around each request.
LIMITS: dict[str, tuple[int, int]] = {"anthropic": (100_000, 250_000_000), "openai": (50_000, 190_000_000)}
OPENAI_ENDPOINTS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


class BatchError(Exception):
    """A batch could not be submitted or read (after the SDK's retries)."""


@dataclass
class BatchRecord:
    id: str
    provider: Literal["anthropic", "openai"]
    stage: str  # "judge1" or "judge2"
    keys: list[str]  # the custom_ids: the requests' cache keys
    state: Literal["submitted", "collected"] = "submitted"
    input_file_id: str | None = None
    outcome: dict[str, int] = field(default_factory=dict)  # once collected: answered / failed


class BatchState:
    """The batches of one review output, persisted after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.batches: list[BatchRecord] = []
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.batches = [BatchRecord(**item) for item in data["batches"]]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise BatchError(f"{path}: not a batch state file ({exc}); move it away to submit anew") from exc

    def add(self, record: BatchRecord) -> None:
        self.batches.append(record)
        self.save()

    def save(self) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump({"batches": [asdict(b) for b in self.batches]}, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    def of(self, stage: str) -> list[BatchRecord]:
        return [b for b in self.batches if b.stage == stage]


@dataclass
class BatchOptions:
    poll_s: float = 60.0
    discount: float = BATCH_DISCOUNT
    on_event: Callable[[str], None] | None = None  # progress lines


@dataclass
class BatchSummary:
    submitted: Counter[str] = field(default_factory=Counter)  # batches created, by stage
    resumed: Counter[str] = field(default_factory=Counter)  # batches found in the state file and polled
    requests: Counter[str] = field(default_factory=Counter)  # requests submitted, by stage
    answered: Counter[str] = field(default_factory=Counter)  # usable answers put in the cache
    failed: Counter[str] = field(default_factory=Counter)  # by reason: retried one by one after


@dataclass
class Outcome:
    """One request's result in a batch: its text and usage, or why there is none."""

    custom_id: str
    text: str | None = None
    usage: Usage | None = None
    failure: str | None = None


# ---- the two providers ------------------------------------------------------------------


class AnthropicBatches:
    provider: Literal["anthropic", "openai"] = "anthropic"

    def __init__(self, judge: Judge) -> None:
        import anthropic

        spec = judge.spec
        self.client = anthropic.Anthropic(
            base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=spec.max_retries
        )

    def submit(self, requests: list[tuple[str, dict[str, Any]]]) -> tuple[str, str | None]:
        batch = self.client.messages.batches.create(requests=[{"custom_id": key, "params": body} for key, body in requests])  # type: ignore[misc]
        return batch.id, None

    def poll(self, batch_id: str) -> tuple[bool, str]:
        batch = self.client.messages.batches.retrieve(batch_id)
        counts = batch.request_counts
        return (
            batch.processing_status == "ended",
            f"{counts.processing} processing, {counts.succeeded} succeeded, {counts.errored} errored, {counts.expired} expired",
        )

    def results(self, batch_id: str) -> Iterator[Outcome]:
        for item in self.client.messages.batches.results(batch_id):
            result = item.result
            if result.type != "succeeded":
                error = getattr(result, "error", None)
                detail = getattr(getattr(error, "error", None), "message", None)
                yield Outcome(item.custom_id, failure=result.type + (f": {detail}" if detail else ""))
                continue
            message = result.message
            texts = [block.text for block in message.content if block.type == "text"]
            u = message.usage
            read = u.cache_read_input_tokens or 0
            written = u.cache_creation_input_tokens or 0
            usage = Usage(
                input_tokens=u.input_tokens + read + written, output_tokens=u.output_tokens, cached_input_tokens=read, api_calls=1
            )
            yield Outcome(item.custom_id, text="".join(texts), usage=usage)


class OpenAIBatches:
    provider: Literal["anthropic", "openai"] = "openai"

    def __init__(self, judge: Judge) -> None:
        import openai

        spec = judge.spec
        self.endpoint = OPENAI_ENDPOINTS[spec.kind]
        self.kind = spec.kind
        self.client = openai.OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=spec.max_retries)

    def submit(self, requests: list[tuple[str, dict[str, Any]]]) -> tuple[str, str | None]:
        lines = [json.dumps({"custom_id": key, "method": "POST", "url": self.endpoint, "body": body}) for key, body in requests]
        upload = self.client.files.create(file=("relearn-review.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")
        batch = self.client.batches.create(
            input_file_id=upload.id, endpoint=self.endpoint, completion_window="24h", metadata={"source": "relearn review"}
        )  # type: ignore[arg-type]
        return batch.id, upload.id

    def poll(self, batch_id: str) -> tuple[bool, str]:
        batch = self.client.batches.retrieve(batch_id)
        counts = batch.request_counts
        said = f"{batch.status}" + (f", {counts.completed} of {counts.total} done, {counts.failed} failed" if counts else "")
        return batch.status in ("completed", "failed", "expired", "cancelled"), said

    def results(self, batch_id: str) -> Iterator[Outcome]:
        # An expired batch has both files: what ran, and "batch_expired" for the rest. A
        # failed one (its input refused whole) has neither: its requests count as no result.
        batch = self.client.batches.retrieve(batch_id)
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            for line in self.client.files.content(file_id).text.splitlines():
                if line.strip():
                    yield self._outcome(json.loads(line))

    def _outcome(self, item: dict[str, Any]) -> Outcome:
        custom_id = item["custom_id"]
        response = item.get("response") or {}
        if item.get("error") or response.get("status_code") != 200:
            error = item.get("error") or (response.get("body") or {}).get("error") or {}
            return Outcome(custom_id, failure=f"{error.get('code') or response.get('status_code')}: {error.get('message', '')}")
        body = response["body"]
        u = body.get("usage") or {}
        if self.kind == "chat":
            text = ((body.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
            usage = Usage(
                input_tokens=u.get("prompt_tokens"),
                output_tokens=u.get("completion_tokens"),
                cached_input_tokens=(u.get("prompt_tokens_details") or {}).get("cached_tokens"),
                api_calls=1,
            )
        else:
            text = "".join(
                part.get("text", "")
                for out in body.get("output") or []
                if out.get("type") == "message"
                for part in out.get("content") or []
                if part.get("type") == "output_text"
            )
            usage = Usage(
                input_tokens=u.get("input_tokens"),
                output_tokens=u.get("output_tokens"),
                cached_input_tokens=(u.get("input_tokens_details") or {}).get("cached_tokens"),
                api_calls=1,
            )
        return Outcome(custom_id, text=text, usage=usage)


def _body(request: JudgeRequest, policy: Any) -> dict[str, Any]:
    """The request as JSON on the wire: the SDK keyword arguments with extra_body merged in
    (the judge's reasoning settings and extra fields included, as a live call sends them)."""
    wire = request.wire(policy)
    extra = wire.pop("extra_body", None) or {}
    return {**wire, **extra}


def provider_for(judge: Judge) -> AnthropicBatches | OpenAIBatches:
    return AnthropicBatches(judge) if judge.spec.kind == "anthropic" else OpenAIBatches(judge)


# ---- the rounds -------------------------------------------------------------------------


def batch_prefill(
    todo: list[Trajectory],
    judges: tuple[Judge, Judge],
    cache: CallCache,
    ledger: Ledger,
    state: BatchState,
    options: BatchOptions,
) -> BatchSummary:
    """Fill ``cache`` with batch answers to what reviewing ``todo`` will ask (only verified
    trajectories: the caller filters). Raises BatchError when a batch cannot be used."""
    summary = BatchSummary()
    for stage, judge in (("judge1", judges[0]), ("judge2", judges[1])):
        pending: dict[str, JudgeRequest] = {}
        for trajectory in todo:
            deferred: list[JudgeRequest] = []
            review_trajectory(trajectory, judges[0], judges[1], cache, ledger, defer=deferred)
            pending.update((r.key, r) for r in deferred if r.role == stage)
        _round(stage, judge, pending, cache, ledger, state, options, summary)
    return summary


def _say(options: BatchOptions, text: str) -> None:
    if options.on_event:
        options.on_event(text)


def _round(
    stage: str,
    judge: Judge,
    pending: dict[str, JudgeRequest],
    cache: CallCache,
    ledger: Ledger,
    state: BatchState,
    options: BatchOptions,
    summary: BatchSummary,
) -> None:
    client = provider_for(judge)
    recorded = {key for b in state.of(stage) for key in b.keys}
    fresh = [r for key, r in pending.items() if key not in recorded]
    open_batches = [b for b in state.of(stage) if b.state == "submitted"]
    summary.resumed[stage] += len(open_batches)
    if fresh:
        _check_cap(stage, fresh, ledger, options)
        max_requests, max_bytes = LIMITS[client.provider]
        policy = make_policy(fresh[0].spec)  # one client for the round: every request has its spec
        for chunk in _chunks([(r.key, _body(r, policy)) for r in fresh], max_requests, max_bytes):
            try:
                batch_id, file_id = client.submit(chunk)
            except Exception as exc:  # noqa: BLE001 - the SDKs' errors, after their retries
                raise BatchError(f"{stage}: submitting a batch of {len(chunk)} requests failed: {exc}") from exc
            record = BatchRecord(batch_id, client.provider, stage, [key for key, _body in chunk], input_file_id=file_id)
            state.add(record)  # recorded at once: a killed run polls it instead of submitting again
            open_batches.append(record)
            summary.submitted[stage] += 1
            summary.requests[stage] += len(chunk)
            _say(options, f"{stage}: submitted batch {batch_id} ({len(chunk)} requests)")
    for record in open_batches:
        _wait(client, record, stage, options)
        _collect(client, record, judge, pending, cache, ledger, state, options, summary)


def _check_cap(stage: str, requests: list[JudgeRequest], ledger: Ledger, options: BatchOptions) -> None:
    """A batch cannot be stopped part way, so the spend cap is checked against what it will
    cost before it is sent: its input counted, its output as long as the pricing table's
    assumption (with the reasoning tokens assumed for the judge's settings), both at the
    batch price."""
    ledger.before_call()
    if ledger.cap_usd is None:
        return
    from review.estimate import load_prices
    from review.reading import count_tokens

    assumptions = load_prices().assumptions
    output = assumptions.judge1_output_tokens if stage == "judge1" else assumptions.judge2_output_tokens
    spec = requests[0].spec
    output += assumptions.reasoning(spec)[0]
    tokens = sum(count_tokens(r.system) + count_tokens(r.user) for r in requests)
    cost = (tokens * spec.price_in_per_mtok + len(requests) * output * spec.price_out_per_mtok) / 1_000_000 * options.discount
    if ledger.spent_usd + cost > ledger.cap_usd:
        raise SpendCapReached(
            f"{stage}: a batch of {len(requests)} requests would cost about ${cost:.4f}, over what is left of the spend cap "
            f"(${ledger.cap_usd:.2f}, ${ledger.spent_usd:.4f} spent); nothing was submitted"
        )


def _chunks(requests: list[tuple[str, dict[str, Any]]], max_requests: int, max_bytes: int) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    chunk: list[tuple[str, dict[str, Any]]] = []
    size = 0
    for request in requests:
        length = len(json.dumps(request[1]).encode())
        if chunk and (len(chunk) >= max_requests or size + length > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(request)
        size += length
    if chunk:
        yield chunk


def _wait(client: AnthropicBatches | OpenAIBatches, record: BatchRecord, stage: str, options: BatchOptions) -> None:
    said = ""
    while True:
        try:
            done, now = client.poll(record.id)
        except Exception as exc:  # noqa: BLE001 - the SDKs' errors, after their retries
            raise BatchError(f"{stage}: polling batch {record.id} failed: {exc} (a rerun polls it again)") from exc
        if now != said:
            _say(options, f"{stage}: batch {record.id}: {now}")
            said = now
        if done:
            return
        time.sleep(options.poll_s)


def _collect(
    client: AnthropicBatches | OpenAIBatches,
    record: BatchRecord,
    judge: Judge,
    pending: dict[str, JudgeRequest],
    cache: CallCache,
    ledger: Ledger,
    state: BatchState,
    options: BatchOptions,
    summary: BatchSummary,
) -> None:
    stage = record.stage
    outcome: Counter[str] = Counter()
    try:
        results = list(client.results(record.id))
    except Exception as exc:  # noqa: BLE001 - the SDKs' errors, after their retries
        raise BatchError(f"{stage}: reading the results of batch {record.id} failed: {exc} (a rerun reads them again)") from exc
    answered: set[str] = set()
    for result in results:
        request = pending.get(result.custom_id)
        if request is None:
            continue  # answered meanwhile (a rerun's cache), or no longer asked
        answered.add(result.custom_id)
        if result.failure is not None:
            summary.failed[result.failure.split(":")[0]] += 1
            outcome["failed"] += 1
            continue
        cost = request.spec.cost_usd(result.usage) * options.discount if result.usage else 0.0
        ledger.charge(cost, result.usage, batched=True)
        parsed, problem = judge.parse(result.text or "", request.schema)
        if parsed is None:  # paid for, unusable: asked again one by one, as a live call would be
            summary.failed["unusable answer"] += 1
            outcome["failed"] += 1
            continue
        cache.put(
            result.custom_id, {"text": result.text, "cost_usd": cost, "model": request.spec.model, "batch": record.id}, unattributed=True
        )
        summary.answered[stage] += 1
        outcome["answered"] += 1
    missing = sum(1 for key in record.keys if key in pending and key not in answered)
    if missing:
        summary.failed["no result"] += missing
        outcome["failed"] += missing
    record.state = "collected"
    record.outcome = dict(outcome)
    state.save()
    _say(options, f"{stage}: batch {record.id}: {outcome['answered']} answered, {outcome['failed']} to retry one by one")
