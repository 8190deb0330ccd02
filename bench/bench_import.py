"""Import throughput on a generated Codex-format corpus, against plain ``json.loads``.

    python bench/bench_import.py [--mb 200] [--steps 40] [--chunks 20] [--keep DIR]

The corpus is a tree of rollout files in the current Codex envelope (reasoning,
shell calls and outputs, apply_patch, token counts; see harness/scripted/codex_sessions.py).
The baseline reads every line of every file and runs ``json.loads`` on it: the least
any importer must do. The import is the full ``relearn import codex`` path: parse,
pair calls, build records, serialise and append them to a new pool.

The two are timed in turns, a chunk of the corpus's files at a time (the baseline on the
chunk, then its import), so that load from other processes falls on both alike; both wall
and CPU time are summed over the chunks, and the CPU ratio is the one load disturbs least.

Other formats, each against the least its reader must do (``json.loads`` of every line, or
pyarrow reading every Parquet row into Python): ``chat`` rows (the SWE-Gym preset) in JSON Lines
and in Parquet, written from the Codex pool by ``relearn export chat``; NeMo Gym rollouts and
OpenHands resolver output, the real sample files of ``../shared/samples`` repeated (each copy
with its own ids) to ``--format-mb``; each timed in ``--format-turns`` turns, summed.

Memory: the peak resident memory of a fresh process importing a quarter of the corpus and
the whole of it, to show that import holds one input file at a time whatever the corpus's size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.parquet as pq

from harness.import_run import discover, import_files
from harness.importers.chat import ChatImporter, options_for
from harness.scripted.codex_sessions import session
from records.pools import iter_lines


def build_corpus(root: Path, target_mb: float, steps: int) -> tuple[int, int]:
    """Write rollout files under ``root`` until ``target_mb`` is reached."""
    filler = "lorem ipsum dolor sit amet, consectetur adipiscing elit; " * 12
    total = files = 0
    while total < target_mb * 1e6:
        day = root / "sessions" / "2026" / "06" / f"{files % 28 + 1:02d}"
        day.mkdir(parents=True, exist_ok=True)
        lines = session(session_id=f"019e0000-0000-7000-8000-{files:012d}", steps=steps, filler=f"{files} {filler}")
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (day / f"rollout-{files:06d}.jsonl").write_text(text)
        total += len(text.encode())
        files += 1
    return files, total


def baseline(files: list[Path]) -> float:
    start = time.perf_counter()
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                json.loads(line)
    return time.perf_counter() - start


T = TypeVar("T")


@dataclass
class Timing:
    wall: float = 0.0
    cpu: float = 0.0

    def add(self, work: Callable[[], T]) -> T:
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu
        return result


def timed_in_turns(files: list[Path], pools: Path, chunks: int) -> tuple[Timing, Timing, list[Path], int]:
    """The baseline and the import, a chunk of ``files`` at a time: the chunk's import appends to
    a new pool of its own (as ``relearn import`` does to a pool it starts). Returns both timings,
    the pools in the corpus's order and the messages imported."""
    pools.mkdir(parents=True, exist_ok=True)
    base, run = Timing(), Timing()
    written: list[Path] = []
    messages = 0
    size = max(1, -(-len(files) // chunks))
    for index in range(0, len(files), size):
        chunk = files[index : index + size]
        pool = pools / f"pool-{index:06d}.jsonl"
        base.add(lambda chunk=chunk: baseline(chunk))
        messages += run.add(lambda chunk=chunk, pool=pool: _imported(chunk, pool))
        written.append(pool)
    return base, run, written, messages


def _imported(files: list[Path], pool: Path) -> int:
    summary = import_files("codex", files, pool)
    assert summary.imported == len(files) and not summary.rejected, summary.rejected[:3]
    return summary.messages


def peak_rss(files: list[Path], pool: Path, fmt: str = "codex", preset: str = "") -> int:
    """Peak resident memory of a fresh Python process that imports ``files`` into ``pool``."""
    pool.unlink(missing_ok=True)
    listing = pool.with_suffix(".files")
    listing.write_text("\n".join(map(str, files)))
    script = (
        "import resource, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from harness.import_run import import_files; from harness.importers import chat;"
        "importer = chat.ChatImporter(chat.options_for(sys.argv[5])) if sys.argv[5] else None;"
        "import_files(sys.argv[4], [Path(p) for p in Path(sys.argv[2]).read_text().splitlines()], Path(sys.argv[3]), importer=importer);"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    here = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", script, here, str(listing), str(pool), fmt, preset], check=True, capture_output=True, text=True
    )
    return int(result.stdout.strip()) * 1024


SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def repeated_sample(sample: Path, target: Path, mb: float, renumber: Callable[[dict, int], None]) -> int:
    """``sample``'s lines again and again, each copy given its own ids by ``renumber``."""
    lines = [json.loads(line) for line in sample.read_text().splitlines() if line.strip()]
    size = copy = 0
    with open(target, "w", encoding="utf-8") as handle:
        while size < mb * 1e6:
            for line in lines:
                row = json.loads(json.dumps(line))
                renumber(row, copy)
                text = json.dumps(row) + "\n"
                handle.write(text)
                size += len(text.encode())
            copy += 1
    return size


def _nemo_copy(row: dict, copy: int) -> None:
    row["_ng_rollout_index"] = copy * 1000 + int(row.get("_ng_rollout_index") or 0)


def _openhands_copy(row: dict, copy: int) -> None:
    row["issue"]["number"] = copy * 1000 + int(row["issue"]["number"])


def parquet_baseline(path: Path) -> float:
    start = time.perf_counter()
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
        batch.to_pylist()
    return time.perf_counter() - start


def formats(root: Path, pool: Path, mb: float, turns: int) -> None:
    """Import throughput of the other formats, each beside its own baseline: the two timed in
    ``turns`` turns (baseline, then import, again and again), as the Codex corpus's chunks are,
    so that load from other processes falls on both alike."""
    from harness.exporters.chat import export_chat
    from records.pools import read_trajectories

    inputs: list[tuple[str, Path, Callable[[Path], float], Any]] = []
    export_chat(read_trajectories(pool), root / "chat.jsonl", "swe-gym")
    export_chat(read_trajectories(pool), root / "chat.parquet", "swe-gym")
    chat = ChatImporter(options_for("swe-gym"))
    inputs += [
        ("chat (swe-gym), JSONL", root / "chat.jsonl", lambda p: baseline([p]), chat),
        ("chat (swe-gym), Parquet", root / "chat.parquet", parquet_baseline, chat),
    ]
    repeated_sample(SAMPLES / "nemo_gym_deepswe_rollouts.jsonl", root / "nemo.jsonl", mb, _nemo_copy)
    inputs.append(("nemo-gym (deepswe sample)", root / "nemo.jsonl", lambda p: baseline([p]), None))
    repeated_sample(SAMPLES / "openhands_resolver_output_legacy.jsonl", root / "openhands.jsonl", mb, _openhands_copy)
    inputs.append(("openhands (resolver output)", root / "openhands.jsonl", lambda p: baseline([p]), None))
    names = {"chat": "chat", "nemo": "nemo-gym", "openhands": "openhands"}
    print(
        f"\n{'format (MB: the rows as JSON Lines)':36s}{'MB':>7s}{'baseline s':>12s}{'import s':>10s}{'MB/s':>8s}{'records':>9s}{'ratio':>8s}{'CPU ratio':>11s}"
    )
    for label, path, base, importer in inputs:
        # A Parquet file is the JSON Lines file's rows, compressed: MB/s counts the rows' JSON.
        size = path.with_suffix(".jsonl").stat().st_size / 1e6
        baseline_time, run = Timing(), Timing()
        pool = root / f"{path.stem}-{path.suffix[1:]}.pool.jsonl"
        for _ in range(turns):
            baseline_time.add(lambda path=path, base=base: base(path))
            pool.unlink(missing_ok=True)  # each turn starts a new pool, as the Codex corpus's chunks do
            summary = run.add(
                lambda path=path, pool=pool, importer=importer: import_files(names[path.stem], [path], pool, importer=importer)
            )
        assert summary.imported and not summary.rejected, summary.rejected[:3]
        base_s, seconds = baseline_time.wall, run.wall
        cpu = run.cpu / baseline_time.cpu
        print(
            f"{label:36s}{size:7.1f}{base_s:12.2f}{seconds:10.2f}{size / seconds:8.1f}{summary.imported:9d}{seconds / base_s:7.2f}x{cpu:10.2f}x"
        )
    # One Parquet file streams: its rows are read a batch at a time and written as they come.
    small = root / "chat-small.parquet"
    rows = pq.read_table(root / "chat.parquet")
    pq.write_table(rows.slice(0, max(1, rows.num_rows // 4)), small, compression="zstd")
    print("\npeak memory importing one chat Parquet file")
    for path in (small, root / "chat.parquet"):
        print(
            f"  {pq.ParquetFile(path).metadata.num_rows:6d} rows: peak RSS {peak_rss([path], root / 'mem-chat.jsonl', 'chat', 'swe-gym') / 1e6:6.0f} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="corpus size in MB (default 200)")
    parser.add_argument("--steps", type=int, default=40, help="tool-call rounds per rollout (default 40)")
    parser.add_argument("--keep", type=Path, help="build the corpus here and keep it")
    parser.add_argument("--chunks", type=int, default=20, help="chunks of the corpus timed in turns (default 20)")
    parser.add_argument("--format-mb", type=float, default=50.0, help="size of each other format's input in MB (0: skip them)")
    parser.add_argument("--format-turns", type=int, default=3, help="turns of baseline and import timed per other format (default 3)")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="relearn-bench-"))
    try:
        started = time.perf_counter()
        n_files, n_bytes = build_corpus(root / "corpus", args.mb, args.steps)
        print(f"corpus: {n_files} rollouts, {n_bytes / 1e6:.1f} MB, built in {time.perf_counter() - started:.1f} s")
        files = discover("codex", [root / "corpus"])

        shutil.rmtree(root / "pools", ignore_errors=True)
        base, run, pools, messages = timed_in_turns(files, root / "pools", args.chunks)
        with open(root / "pool.jsonl", "wb") as pool:  # the chunks' pools as one, for what follows
            for part in pools:
                pool.write(part.read_bytes())
        assert sum(1 for _ in iter_lines(root / "pool.jsonl")) == n_files

        mb = n_bytes / 1e6
        print(f"timed in {len(pools)} turns\n{'':28s}{'seconds':>10s}{'CPU s':>10s}{'MB/s':>10s}{'traj/s':>10s}")
        print(f"{'json.loads of every line':28s}{base.wall:10.2f}{base.cpu:10.2f}{mb / base.wall:10.1f}{n_files / base.wall:10.1f}")
        print(f"{'relearn import codex':28s}{run.wall:10.2f}{run.cpu:10.2f}{mb / run.wall:10.1f}{n_files / run.wall:10.1f}")
        print(f"ratio (import time / json.loads time): {run.wall / base.wall:.2f}x wall, {run.cpu / base.cpu:.2f}x CPU")
        print(f"pool written: {(root / 'pool.jsonl').stat().st_size / 1e6:.1f} MB, {messages} messages")
        print("\npeak memory of a process importing (fresh pool each time)")
        for share in (4, 1):
            part = files[: len(files) // share]
            size = sum(p.stat().st_size for p in part)
            print(f"  {len(part):5d} files, {size / 1e6:6.1f} MB: peak RSS {peak_rss(part, root / 'mem.jsonl') / 1e6:6.0f} MB")
        if args.format_mb:
            formats(root, root / "pool.jsonl", args.format_mb, args.format_turns)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
