"""Import throughput on a generated Codex-format corpus, against plain ``json.loads``.

    python bench/bench_import.py [--mb 200] [--steps 40] [--keep DIR]

The corpus is a tree of rollout files in the current Codex envelope (reasoning,
shell calls and outputs, apply_patch, token counts; see tests/codex_rollouts.py).
The baseline reads every line of every file and runs ``json.loads`` on it: the least
any importer must do. The import is the full ``relearn import codex`` path: parse,
pair calls, build and validate records, serialise and append them to a pool.

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.import_run import discover, import_files  # noqa: E402
from tests.codex_rollouts import session  # noqa: E402


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


def peak_rss(files: list[Path], pool: Path) -> int:
    """Peak resident memory of a fresh Python process that imports ``files`` into ``pool``."""
    pool.unlink(missing_ok=True)
    listing = pool.with_suffix(".files")
    listing.write_text("\n".join(map(str, files)))
    script = (
        "import resource, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from harness.import_run import import_files;"
        "import_files('codex', [Path(p) for p in Path(sys.argv[2]).read_text().splitlines()], Path(sys.argv[3]));"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    result = subprocess.run([sys.executable, "-c", script, str(Path(__file__).resolve().parent.parent), str(listing), str(pool)], check=True, capture_output=True, text=True)
    return int(result.stdout.strip()) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="corpus size in MB (default 200)")
    parser.add_argument("--steps", type=int, default=40, help="tool-call rounds per rollout (default 40)")
    parser.add_argument("--keep", type=Path, help="build the corpus here and keep it")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="relearn-bench-"))
    try:
        started = time.perf_counter()
        n_files, n_bytes = build_corpus(root / "corpus", args.mb, args.steps)
        print(f"corpus: {n_files} rollouts, {n_bytes / 1e6:.1f} MB, built in {time.perf_counter() - started:.1f} s")
        files = discover("codex", [root / "corpus"])

        base_s = baseline(files)
        start = time.perf_counter()
        summary = import_files("codex", files, root / "pool.jsonl", overwrite=True)
        import_s = time.perf_counter() - start
        assert summary.imported == n_files and not summary.rejected, summary.rejected[:3]

        mb = n_bytes / 1e6
        print(f"{'':28s}{'seconds':>10s}{'MB/s':>10s}{'traj/s':>10s}")
        print(f"{'json.loads of every line':28s}{base_s:10.2f}{mb / base_s:10.1f}{n_files / base_s:10.1f}")
        print(f"{'relearn import codex':28s}{import_s:10.2f}{mb / import_s:10.1f}{n_files / import_s:10.1f}")
        print(f"ratio (import time / json.loads time): {import_s / base_s:.2f}x")
        print(f"pool written: {(root / 'pool.jsonl').stat().st_size / 1e6:.1f} MB, {summary.messages} messages")
        print("\npeak memory of a process importing (fresh pool each time)")
        for share in (4, 1):
            part = files[: len(files) // share]
            size = sum(p.stat().st_size for p in part)
            print(f"  {len(part):5d} files, {size / 1e6:6.1f} MB: peak RSS {peak_rss(part, root / 'mem.jsonl') / 1e6:6.0f} MB")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
