"""Measure which SWE-bench instances build offline and grade right, following docs/swebench.md's
steps as a user would: `build-swebench --plan`, the `fetch-wheels` command it prints, the
offline build, then `relearn verify` of the gold patch, an empty patch and a wrong one (a
comment line added at the top of the first Python file the gold patch changes).

    python scripts/measure_swebench_support.py --tasks ../shared/samples/swebench_verified.parquet \\
        --mirror django/django=~/src/django --mirror sympy/sympy=~/src/sympy ... --out support/ [--per-version]

One row per instance is appended to OUT/support.jsonl as it finishes (a rerun skips the
instances already there); the table the docs show is printed at the end. Images are removed
after grading unless --keep-images: a Verified sweep would otherwise need tens of gigabytes.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

RELEARN = str(Path(sys.executable).parent / "relearn")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--mirror", action="append", default=[], help="REPO=PATH: a checkout or mirror holding the base commits")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--id", action="append", default=[], dest="ids", help="instances to try (default: see --per-version)")
    parser.add_argument("--per-version", action="store_true", help="the first instance of every (repository, version) the mirrors cover")
    parser.add_argument("--keep-images", action="store_true")
    args = parser.parse_args()
    mirrors = dict(item.split("=", 1) for item in args.mirror)
    rows = {r["instance_id"]: r for r in pq.read_table(args.tasks).to_pylist()}
    chosen = list(args.ids)
    if args.per_version:
        seen: set[tuple[str, str]] = set()
        for row in rows.values():
            if row["repo"] in mirrors and (row["repo"], row["version"]) not in seen:
                seen.add((row["repo"], row["version"]))
                chosen.append(row["instance_id"])
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "support.jsonl"
    done = {json.loads(line)["instance_id"] for line in results.read_text().splitlines()} if results.exists() else set()
    for number, instance in enumerate(chosen, 1):
        if instance in done:
            continue
        row = rows[instance]
        print(f"[{number}/{len(chosen)}] {instance} ({row['repo']} {row['version']})", flush=True)
        result = measure(row, Path(mirrors[row["repo"]]).expanduser(), args.tasks, args.out, args.keep_images)
        with results.open("a") as handle:
            handle.write(json.dumps(result) + "\n")
        print(f"    {result['outcome']}", flush=True)
    print(table([json.loads(line) for line in results.read_text().splitlines()]))
    return 0


def relearn(*args: str, timeout: float = 3600) -> tuple[int, str, float]:
    started = time.monotonic()
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}  # wide tables: one line per row, for the parsing below
    done = subprocess.run([RELEARN, *args], capture_output=True, text=True, timeout=timeout, env=env)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def measure(row: dict, mirror: Path, tasks: Path, out: Path, keep: bool) -> dict:
    instance = row["instance_id"]
    wheels = out / "wheels" / instance
    result: dict = {"instance_id": instance, "repo": row["repo"], "version": row["version"]}
    code, text, _ = relearn("envs", "build-swebench", "-t", str(tasks), "-i", instance, "--repo", str(mirror), "--plan")
    if code != 0 or "refused" in text:
        return {**result, "outcome": "refused", "why": _last(text)}
    result["python"] = re.search(r"python (\S+)", text).group(1)
    if "no Debian suite" in text:
        return {**result, "outcome": f"needs --python-image (Python {result['python']})"}
    fetch = next((line.strip() for line in text.splitlines() if line.strip().startswith("relearn envs fetch-wheels")), None)
    if fetch is None:
        return {**result, "outcome": "refused", "why": _last(text)}
    words = [str(wheels) if w == "WHEELS" else w for w in shlex.split(fetch)][1:]  # as printed, the wheelhouse named
    code, text, result["fetch_s"] = relearn(*words)
    if code != 0:
        return {**result, "outcome": "fetch failed", "why": _last(text)}
    code, text, result["build_s"] = relearn(
        "envs",
        "build-swebench",
        "-t",
        str(tasks),
        "-i",
        instance,
        "--repo",
        str(mirror),
        "--wheels",
        str(wheels),
        "--force",
        "--memory",
        "4g",
    )
    if code != 0:
        return {**result, "outcome": "build failed", "why": _last(text)}
    predictions = out / "predictions" / f"{instance}.jsonl"
    predictions.parent.mkdir(exist_ok=True)
    patches = {"gold": row["patch"], "empty": "", "wrong": wrong_patch(row, mirror)}
    predictions.write_text(
        "".join(
            json.dumps({"instance_id": instance, "model_name_or_path": k, "model_patch": v}) + "\n"
            for k, v in patches.items()
            if v is not None
        )
    )
    verdicts = out / "verdicts" / f"{instance}.jsonl"
    verdicts.parent.mkdir(exist_ok=True)
    verdicts.unlink(missing_ok=True)
    code, text, result["verify_s"] = relearn(
        "verify", "-t", str(tasks), "-p", str(predictions), "-o", str(verdicts), "--memory", "6g", "--timeout", "1800"
    )
    graded = {v["model_name_or_path"]: v for v in map(json.loads, verdicts.read_text().splitlines())} if verdicts.exists() else {}
    result["graded"] = {name: _grade(v) for name, v in graded.items()}
    f2p, p2p = len(json.loads(row["FAIL_TO_PASS"])), len(json.loads(row["PASS_TO_PASS"]))
    gold = graded.get("gold", {})
    tests = gold.get("tests") or {}
    right = (
        bool(gold.get("resolved"))
        and len(tests.get("FAIL_TO_PASS", {}).get("success", [])) == f2p
        and len(tests.get("PASS_TO_PASS", {}).get("success", [])) == p2p
        and not graded.get("empty", {}).get("resolved", True)
        and not graded.get("wrong", {"resolved": False}).get("resolved", True)
    )
    result["outcome"] = "graded right" if right else "graded wrong"
    if not right:
        result["why"] = _last(text)
    if not keep:
        subprocess.run(["docker", "image", "rm", "-f", row["image"]], capture_output=True)
    return result


def wrong_patch(row: dict, mirror: Path) -> str | None:
    paths = [p for p in re.findall(r"^diff --git a/(\S+)", row["patch"], re.M) if p.endswith(".py")]
    if not paths:
        return None
    shown = subprocess.run(["git", "-C", str(mirror), "show", f"{row['base_commit']}:{paths[0]}"], capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    text = shown.stdout
    diff = "".join(difflib.unified_diff(text.splitlines(True), ("# not a fix\n" + text).splitlines(True), f"a/{paths[0]}", f"b/{paths[0]}"))
    return f"diff --git a/{paths[0]} b/{paths[0]}\n{diff}"


def _grade(verdict: dict) -> dict:
    tests = verdict.get("tests") or {}
    return {
        "resolved": verdict.get("resolved"),
        **{k: [len(v.get("success", [])), len(v.get("failure", []))] for k, v in tests.items() if k in ("FAIL_TO_PASS", "PASS_TO_PASS")},
    }


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not set(line.strip()) <= set("─━│┃┏┓┗┛┡┩└┘┌┐╇╈")]
    return " / ".join(lines[-3:])[-600:]


def table(results: list[dict]) -> str:
    """Per repository: versions tried, built, graded right, and what failed."""
    lines = [
        "| repository | versions tried | built offline | graded right (gold resolved, every listed test passing; empty and wrong not) | not |",
        "|---|---|---|---|---|",
    ]
    for repo in sorted({r["repo"] for r in results}):
        mine = [r for r in results if r["repo"] == repo]
        built = [r for r in mine if r["outcome"] in ("graded right", "graded wrong")]
        right = [r for r in mine if r["outcome"] == "graded right"]
        versions = lambda rs: ", ".join(sorted({r["version"] for r in rs}, key=lambda v: [int(x) for x in re.findall(r"\d+", v)]))  # noqa: E731
        failed = "; ".join(f"{r['version']}: {r['outcome']}" for r in mine if r["outcome"] != "graded right") or "none"
        lines.append(f"| `{repo}` | {len(mine)} ({versions(mine)}) | {len(built)} | {len(right)} | {failed} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
