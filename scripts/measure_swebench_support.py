"""Measure which SWE-bench instances build offline and grade right, following docs/swebench.md's
steps as a user would: `build-swebench --plan`, the `fetch-wheels` command it prints, the
offline build, then `relearn verify` of the gold patch, an empty patch and a wrong one (a
comment line added at the top of the first Python file the gold patch changes).

    python scripts/measure_swebench_support.py --tasks ../shared/samples/swebench_verified.parquet \\
        --mirror django/django=~/src/django --mirror sympy/sympy=~/src/sympy ... --out support/ \\
        [--per-version | --sample 40 --seed 2026] [--keep-images] [--regrade]

One row per instance is appended to OUT/support.jsonl as it finishes (a rerun skips the
instances already there); the table the docs show is printed at the end. Images are removed
after grading unless --keep-images: a Verified sweep would otherwise need tens of gigabytes.
Each row keeps, per graded patch, the verdict's resolved flag, error, disagreements and the
failing test ids, so that a wrong grade's reason can be read from the row itself.

--sample N --seed S draws N instances among the repositories that have a --mirror and the
versions the builder takes with a Debian Python (the others would only be rows saying
"needs --python-image"), shared among the repositories by size, at least one each, and
spread over each repository's versions; OUT/sample.json records the draw. --regrade reruns
only the three `relearn verify` gradings of the rows already in OUT/support.jsonl whose image
is still on the engine (kept by --keep-images), and rewrites those rows.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
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
    parser.add_argument("--sample", type=int, metavar="N", help="N instances drawn at random over the mirrors' repositories and versions")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed (--sample)")
    parser.add_argument("--keep-images", action="store_true")
    parser.add_argument("--regrade", action="store_true", help="only grade again the rows of OUT/support.jsonl whose image is kept")
    args = parser.parse_args()
    mirrors = dict(item.split("=", 1) for item in args.mirror)
    rows = {r["instance_id"]: r for r in pq.read_table(args.tasks).to_pylist()}
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "support.jsonl"
    if args.regrade:
        return regrade(rows, mirrors, args.tasks, args.out, set(args.ids))
    chosen = list(args.ids)
    if args.per_version:
        seen: set[tuple[str, str]] = set()
        for row in rows.values():
            if row["repo"] in mirrors and (row["repo"], row["version"]) not in seen:
                seen.add((row["repo"], row["version"]))
                chosen.append(row["instance_id"])
    if args.sample:
        drawn, left_out = sample(list(rows.values()), set(mirrors), args.sample, args.seed)
        chosen += [i for i in drawn if i not in chosen]
        record = {"sample": args.sample, "seed": args.seed, "instances": drawn, "versions left out": left_out}
        (args.out / "sample.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"sample of {len(drawn)} (seed {args.seed}); versions left out: {len(left_out)}", flush=True)
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


def sample(rows: list[dict], repos: set[str], size: int, seed: int) -> tuple[list[str], dict[str, str]]:
    """``size`` instance ids, and the (repository version)s left out with the builder's reason.

    Only versions the builder takes with a Debian Python are drawn from. Each repository gets
    one instance, the rest are shared by its number of instances (largest remainders); within
    a repository the versions take turns (in a seeded order), so that every version appears
    before any appears twice. Every draw is seeded by the seed and the repository's name, so
    adding a mirror changes no other repository's instances. The ids are returned with the
    repositories taking turns too, so that a sweep stopped early has covered all of them."""
    from envs.swebench_specs import DEBIAN_PYTHON, Unsupported, install_spec  # the builder's own decision
    from envs.tasks import Task

    pools: dict[str, dict[str, list[str]]] = {}
    left_out: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: r["instance_id"]):  # sorted: the draw must not depend on the file's order
        if row["repo"] not in repos or f"{row['repo']} {row['version']}" in left_out:
            continue
        if row["version"] not in pools.get(row["repo"], {}):
            try:
                python = install_spec(Task(**row)).python
            except Unsupported as exc:
                left_out[f"{row['repo']} {row['version']}"] = f"refused: {exc}"
                continue
            if python not in DEBIAN_PYTHON:
                left_out[f"{row['repo']} {row['version']}"] = f"Python {python}: no Debian suite, needs --python-image"
                continue
        pools.setdefault(row["repo"], {}).setdefault(row["version"], []).append(row["instance_id"])
    sizes = {repo: sum(map(len, versions.values())) for repo, versions in pools.items()}
    share = dict.fromkeys(sizes, 1) if size >= len(sizes) else {}
    rest = size - sum(share.values())
    weights = {repo: n - share.get(repo, 0) for repo, n in sizes.items()}
    exact = {repo: rest * w / max(1, sum(weights.values())) for repo, w in weights.items()}
    for repo in sizes:
        share[repo] = share.get(repo, 0) + int(exact[repo])
    for repo in sorted(sizes, key=lambda r: (int(exact[r]) - exact[r], r))[: size - sum(share.values())]:
        share[repo] += 1
    picks: dict[str, list[str]] = {}
    for repo in sorted(pools):
        rng = random.Random(f"{seed}:{repo}")
        versions = {v: rng.sample(ids, len(ids)) for v, ids in sorted(pools[repo].items())}
        order = rng.sample(sorted(versions), len(versions))
        mine: list[str] = []
        while len(mine) < min(share[repo], sizes[repo]):
            mine += [versions[v].pop() for v in order if versions[v]][: share[repo] - len(mine)]
        picks[repo] = mine
    turns = sorted(picks, key=lambda r: (-len(picks[r]), r))
    drawn = [picks[repo][turn] for turn in range(max(map(len, picks.values()), default=0)) for repo in turns if turn < len(picks[repo])]
    return drawn, left_out


def regrade(rows: dict[str, dict], mirrors: dict[str, str], tasks: Path, out: Path, ids: set[str]) -> int:
    """Grade again the rows whose image is still on the engine, each row rewritten as it is
    graded: a new file renamed over the old, so a stop midway loses nothing."""
    results = out / "support.jsonl"
    kept = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    for number, old in enumerate(kept, 1):
        instance, row = old["instance_id"], rows[old["instance_id"]]
        if ids and instance not in ids:
            continue
        if subprocess.run(["docker", "image", "inspect", row["image"]], capture_output=True).returncode != 0:
            print(f"[{number}/{len(kept)}] {instance}: no image {row['image']}, row kept as it was", flush=True)
            continue
        print(f"[{number}/{len(kept)}] {instance} ({row['repo']} {row['version']}): grading again", flush=True)
        mirror = Path(mirrors[row["repo"]]).expanduser() if row["repo"] in mirrors else None
        new = {k: v for k, v in old.items() if k not in ("graded", "outcome", "why", "verify_s")} | grade(row, mirror, tasks, out)
        lines = [json.loads(line) for line in results.read_text().splitlines()]  # read again: another run may have appended
        temporary = results.with_name(results.name + ".new")
        temporary.write_text("".join(json.dumps(new if r["instance_id"] == instance else r) + "\n" for r in lines))
        os.replace(temporary, results)
        print(f"    {new['outcome']}", flush=True)
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
    result |= grade(row, mirror, tasks, out)
    if not keep:
        subprocess.run(["docker", "image", "rm", "-f", row["image"]], capture_output=True)
    return result


def grade(row: dict, mirror: Path | None, tasks: Path, out: Path) -> dict:
    """`relearn verify` of the gold, an empty and a wrong patch in the instance's image: the
    row's verify_s, graded, outcome and (when not graded right) why."""
    instance = row["instance_id"]
    predictions = out / "predictions" / f"{instance}.jsonl"
    predictions.parent.mkdir(exist_ok=True)
    if mirror is not None or not predictions.exists():  # without the mirror (--regrade), the patches written before
        patches = {"gold": row["patch"], "empty": "", "wrong": wrong_patch(row, mirror) if mirror else None}
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
    result: dict = {}
    logs = out / "logs"
    code, text, result["verify_s"] = relearn(
        "verify",
        "-t",
        str(tasks),
        "-p",
        str(predictions),
        "-o",
        str(verdicts),
        "--memory",
        "6g",
        "--timeout",
        "1800",
        "--log-dir",
        str(logs),
    )
    graded = {v["model_name_or_path"]: v for v in map(json.loads, verdicts.read_text().splitlines())} if verdicts.exists() else {}
    result["graded"] = {name: _grade(v) | {"official": official_grade(row, v)} for name, v in graded.items()}
    if "gold" in graded and not graded["gold"].get("resolved"):  # a false negative: its log's end usually names the cause
        result["graded"]["gold"]["log_tail"] = (graded["gold"].get("log_tail") or "")[-1000:]
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
    return result


def official_grade(row: dict, verdict: dict) -> str | None:
    """swebench's own grade of the same test run: `get_eval_report`, the function its
    run_evaluation grades with, on the test output of the verdict's log between swebench's
    markers, unsanitized. The official harness itself cannot run here (its images come from a
    registry); this holds our grade against its grading of the very same output. None where
    the patch was not run (refused, or not applied)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
    from swebench.harness.grading import get_eval_report

    from envs.tasks import Task
    from envs.verify import swebench_test_spec

    logged = Path(verdict["log_path"]).read_text(errors="replace") if verdict.get("log_path") else ""
    run = re.search(r"^\$ tests \(exit status [^)]*\)\n", logged, re.M)
    if run is None:
        return None
    spec = swebench_test_spec(Task(**row), row["base_commit"])
    log = Path(verdict["log_path"]).with_suffix(".official.log")
    log.write_text(f"{START_TEST_OUTPUT}\n{logged[run.end() :]}\n{END_TEST_OUTPUT}\n")
    prediction = {"instance_id": row["instance_id"], "model_name_or_path": verdict.get("model_name_or_path"), "model_patch": "-"}
    report = get_eval_report(spec, prediction, str(log), include_tests_status=False)[row["instance_id"]]
    return "resolved" if report["resolved"] else "unresolved"


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
    """What a reader needs to tell why a patch graded as it did, without the verdicts file."""
    tests = verdict.get("tests") or {}
    lists = {k: v for k, v in tests.items() if k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    return {
        "resolved": verdict.get("resolved"),
        **{k: [len(v.get("success", [])), len(v.get("failure", []))] for k, v in lists.items()},
        "failing": {k: v.get("failure", [])[:20] for k, v in lists.items() if v.get("failure")},  # the first 20: enough to see a pattern
        **{k: verdict.get(k) for k in ("error", "disagreements", "refused", "suspicious", "timed_out", "patch_applied", "log_path")},
    }


def _not_right(result: dict) -> str:
    """Why a row is not graded right, from the row alone: the gold patch's listed tests that
    failed and swebench's grade of the same output (which tells a verifier's fault from a run
    that really failed), or the patch that resolved though it must not."""
    if result["outcome"] != "graded wrong":
        return result["outcome"]
    graded = result["graded"]
    gold = graded.get("gold", {})
    if not gold.get("resolved"):
        counts = ", ".join(f"{k} {v[0]}/{sum(v)}" for k in ("FAIL_TO_PASS", "PASS_TO_PASS") if (v := gold.get(k)) is not None)
        why = gold.get("error") or "; ".join(gold.get("disagreements") or []) or counts or "no verdict"
        official = f"; swebench's grade of the same output: {gold['official']}" if gold.get("official") else ""
        return f"gold unresolved ({why}){official}"
    resolved = [name for name in ("empty", "wrong") if graded.get(name, {}).get("resolved")]
    if resolved:
        return f"{' and '.join(resolved)} patch resolved"
    return "gold resolved with a listed test not passing"


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not set(line.strip()) <= set("─━│┃┏┓┗┛┡┩└┘┌┐╇╈")]
    return " / ".join(lines[-3:])[-600:]


def table(results: list[dict]) -> str:
    """Per repository: instances tried (and their versions), built, gold resolved, graded
    right, our grade against swebench's of the same output, and what failed."""
    lines = [
        "| repository | instances (versions) | built offline | gold resolved | graded right | same grade as swebench's of the same output | not right |",
        "|---|---|---|---|---|---|---|",
    ]
    for repo in sorted({r["repo"] for r in results}):
        mine = [r for r in results if r["repo"] == repo]
        built = [r for r in mine if r["outcome"] in ("graded right", "graded wrong")]
        gold = [r for r in built if r["graded"].get("gold", {}).get("resolved")]
        right = [r for r in mine if r["outcome"] == "graded right"]
        compared = [g for r in built for g in r["graded"].values() if g.get("official")]
        same = [g for g in compared if (g["official"] == "resolved") == bool(g["resolved"])]
        versions = lambda rs: ", ".join(sorted({r["version"] for r in rs}, key=lambda v: [int(x) for x in re.findall(r"\d+", v)]))  # noqa: E731
        failed = (
            "; ".join(f"{r['instance_id']} ({r['version']}): {_not_right(r)}" for r in mine if r["outcome"] != "graded right") or "none"
        )
        agree = f"{len(same)} of {len(compared)} patches" if compared else "not compared"
        lines.append(f"| `{repo}` | {len(mine)} ({versions(mine)}) | {len(built)} | {len(gold)} | {len(right)} | {agree} | {failed} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
