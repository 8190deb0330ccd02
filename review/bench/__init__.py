"""The labelled review benchmark: the case format (``review.bench.cases``), the scorer
(``review.bench.score``) and the shipped set over the mini suite (``cases/``, made by
``scripts/generate_review_bench.py``)."""

from pathlib import Path

SHIPPED = Path(__file__).parent / "cases" / "mini.jsonl.zst"
