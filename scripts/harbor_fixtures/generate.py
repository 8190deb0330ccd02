"""Run the fixture jobs with the real ``harbor`` CLI and copy what it wrote into the tests.

    python3 scripts/harbor_fixtures/generate.py --harbor BIN --work DIR [--out DIR]

make.sh calls this (after building the task image); read its header for what it needs.
Starts the scripted model servers (servers.py, in the project's venv), writes one Harbor
JobConfig per job into DIR/configs, runs ``harbor run -c`` for each (jobs land in DIR/jobs,
trial_uri and all), stops the servers, then copies each job folder into --out, leaving out
only files over ``MAX_BYTES`` (named in the copy's ``omitted.json``; the README says which).
Standard library only: it runs under any Python 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TASKS = HERE / "tasks"
MAX_BYTES = 100_000
# Harbor's records are the data an importer reads: kept whole whatever their size (a
# terminus-2 result.json with per-turn prompt ids runs to ~180 KB).
RECORD_SUFFIXES = (".json", ".jsonl")
# A placeholder the agents need to see set; no real key is ever used or written.
API_KEY = "sk-fixture-not-a-secret"
# The terminus-2 policy: what a vLLM-served RL policy looks like to Harbor (litellm's
# hosted_vllm provider needs the limits and prices spelt out).
VLLM_MODEL_INFO = {"max_input_tokens": 32768, "max_output_tokens": 4096, "input_cost_per_token": 1e-7, "output_cost_per_token": 4e-7}
# Codex's own config.toml, as Harbor's codex agent takes it (``config``): our provider, no
# retries (a retry would be a second answer from the script), no update check, no
# telemetry, nothing that adds tools or calls.
CODEX_CONFIG = {
    "model_provider": "fixture",
    "model_providers": {
        "fixture": {
            "name": "scripted Responses server",
            "base_url": "http://host.docker.internal/v1",  # Harbor replaces it with the agent's base_url
            "env_key": "OPENAI_API_KEY",
            "wire_api": "responses",
            "request_max_retries": 0,
            "stream_max_retries": 0,
            "supports_websockets": False,
        }
    },
    "check_for_update_on_startup": False,
    "analytics": {"enabled": False},
    "history": {"persistence": "none"},
    "features": {name: False for name in ("goals", "multi_agent", "apps", "plugins", "hooks", "memories", "image_generation")},
}


def job_configs(urls: dict[str, str], jobs_dir: Path, codex_port: int) -> dict[str, dict[str, Any]]:
    common: dict[str, Any] = {
        "jobs_dir": str(jobs_dir),
        "n_attempts": 1,
        "environment": {"type": "docker", "force_build": False, "delete": True},
    }

    def tasks(*names: str) -> dict[str, Any]:
        return {"datasets": [{"path": str(TASKS), "task_names": list(names)}]}

    def terminus(script: str, **extra: Any) -> dict[str, Any]:
        return {
            "name": "terminus-2",
            "model_name": f"hosted_vllm/qwen3.6-scripted-{script}",
            "kwargs": {"api_base": urls[script], "collect_rollout_details": True, "model_info": VLLM_MODEL_INFO},
            **extra,
        }

    return {
        "oracle": {
            **common,
            **tasks("fix-add", "broken-env"),
            "job_name": "oracle",
            "n_concurrent_trials": 1,
            "agents": [{"name": "oracle"}],
        },
        "terminus-2": {
            **common,
            **tasks("fix-add"),
            "job_name": "terminus-2",
            "n_concurrent_trials": 3,
            "agents": [terminus("solve"), terminus("flail"), terminus("sleep", override_timeout_sec=30)],
        },
        "codex": {
            **common,
            **tasks("fix-add"),
            "job_name": "codex",
            "n_concurrent_trials": 1,
            "agents": [
                {
                    "name": "codex",
                    "model_name": "openai/gpt-5.5",
                    "base_url": f"http://host.docker.internal:{codex_port}/v1",
                    "kwargs": {"config": CODEX_CONFIG, "reasoning_effort": "medium"},
                }
            ],
        },
    }


def start_servers(python: str, work: Path, bridge: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    urls_file = work / "urls.json"
    urls_file.unlink(missing_ok=True)
    log = open(work / "servers.out", "wb")  # noqa: SIM115 (lives as long as the servers)
    server = subprocess.Popen(
        [python, str(HERE / "servers.py"), "--urls", str(urls_file), "--responses-host", bridge, "--log", str(work / "requests")],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not urls_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            sys.exit(f"the scripted servers did not start; see {work / 'servers.out'}")
        time.sleep(0.5)
    return server, json.loads(urls_file.read_text())


def bridge_address() -> str:
    """The docker bridge's gateway: what ``host-gateway`` resolves to inside containers."""
    out = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def copy_job(job: Path, out: Path) -> list[str]:
    """Copy a job folder as Harbor wrote it, minus files over MAX_BYTES; returns those left out."""
    if out.exists():
        shutil.rmtree(out)
    omitted: list[str] = []
    for path in sorted(job.rglob("*")):
        rel = path.relative_to(job)
        if path.is_dir():
            (out / rel).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            size = path.stat().st_size
            if size > MAX_BYTES and path.suffix not in RECORD_SUFFIXES:
                omitted.append(f"{rel} ({size} bytes)")
                continue
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out / rel)
    if omitted:
        (out / "omitted.json").write_text(json.dumps({"max_bytes": MAX_BYTES, "omitted": omitted}, indent=1) + "\n")
    return omitted


TABLE_START = "<!-- trials: written by scripts/harbor_fixtures/generate.py -->"
TABLE_END = "<!-- /trials -->"


def trial_rows(out: Path) -> list[str]:
    """One Markdown row per trial folder, read off what Harbor wrote."""
    rows = [
        "| job / trial | task_name | agent, model | rewards | exception_type | trajectory sources | rollout_details | patch artifact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for job in sorted(p for p in out.iterdir() if p.is_dir()):
        for trial in sorted(p for p in job.iterdir() if p.is_dir()):
            result_path = trial / "result.json"
            if not result_path.exists():
                rows.append(f"| {job.name}/{trial.name} | (no result.json) | | | | | | |")
                continue
            result = json.loads(result_path.read_text())
            agent = result.get("agent_info") or {}
            model = agent.get("model_info") or {}
            model_text = f"{model.get('provider')}/{model.get('name')}" if model else "none"
            rewards = (result.get("verifier_result") or {}).get("rewards")
            exception = (result.get("exception_info") or {}).get("exception_type") or "none"
            sources = []
            trajectory = trial / "agent" / "trajectory.json"
            if trajectory.exists():
                document = json.loads(trajectory.read_text())
                agent_steps = sum(1 for step in document.get("steps", []) if step.get("source") == "agent")
                sources.append(f"`agent/trajectory.json` ({document.get('schema_version')}, {agent_steps} agent steps)")
            rollouts = sorted((trial / "agent").glob("sessions/**/rollout-*.jsonl"))
            if rollouts:
                sources.append(f"`agent/sessions/**/rollout-*.jsonl` ({len(rollouts)} file)")
            details = (result.get("agent_result") or {}).get("rollout_details") or []
            if details:
                fields = ", ".join(f"{key} x{len(value)}" for key, value in details[0].items() if isinstance(value, list))
                details_text = f"{len(details)} agent(s): {fields}"
            else:
                details_text = "none"
            diff = trial / "artifacts" / "final.diff"
            if diff.exists():
                patch = (
                    f"`artifacts/final.diff` ({diff.stat().st_size} bytes)"
                    if diff.stat().st_size
                    else "`artifacts/final.diff` (empty: no change)"
                )
            else:
                patch = "none"
            rows.append(
                f"| {job.name}/{trial.name} | `{result.get('task_name')}` | {agent.get('name')} {agent.get('version')}, {model_text} "
                f"| {json.dumps(rewards) if rewards is not None else 'none (not graded)'} | {exception} "
                f"| {'; '.join(sources) or 'none'} | {details_text} | {patch} |"
            )
    return rows


def write_table(out: Path) -> None:
    readme = out / "README.md"
    if not readme.exists():
        return
    text = readme.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        print(f"{readme}: no {TABLE_START} ... {TABLE_END} section; table not written")
        return
    head, rest = text.split(TABLE_START, 1)
    _old, tail = rest.split(TABLE_END, 1)
    readme.write_text(head + TABLE_START + "\n" + "\n".join(trial_rows(out)) + "\n" + TABLE_END + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harbor", required=True, help="The harbor executable (in a Python >= 3.12 venv).")
    parser.add_argument("--work", type=Path, required=True, help="Scratch folder outside the project: configs, jobs, server logs.")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "harbor", help="Where the job folders are copied.")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"), help="The project's Python (runs servers.py).")
    parser.add_argument("--only", nargs="*", help="Run only these jobs (oracle, terminus-2, codex).")
    args = parser.parse_args()

    work = args.work.resolve()
    jobs_dir = work / "jobs"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    server, urls = start_servers(args.python, work, bridge_address())
    codex_port = int(urls["codex"].rsplit(":", 1)[1].split("/", 1)[0])
    env = {
        **os.environ,
        "OPENAI_API_KEY": API_KEY,
        # litellm would try GitHub for its price list on every start; the copy it ships is enough.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    failed = []
    try:
        for name, config in job_configs(urls, jobs_dir, codex_port).items():
            if args.only and name not in args.only:
                continue
            if (jobs_dir / name).exists():
                shutil.rmtree(jobs_dir / name)
            path = work / "configs" / f"{name}.json"
            path.write_text(json.dumps(config, indent=1))
            print(f"== harbor run -c {path}", flush=True)
            started = time.monotonic()
            result = subprocess.run([args.harbor, "run", "-c", str(path), "--yes"], env=env, cwd=work)
            print(f"== {name}: exit {result.returncode} in {time.monotonic() - started:.0f} s", flush=True)
            if result.returncode != 0 or not (jobs_dir / name / "result.json").exists():
                failed.append(name)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    for name in sorted(p.name for p in jobs_dir.iterdir() if p.is_dir()):
        if args.only and name not in args.only:
            continue
        omitted = copy_job(jobs_dir / name, args.out / name)
        print(f"copied {name} -> {args.out / name}" + (f" (left out: {', '.join(omitted)})" if omitted else ""))
    write_table(args.out)
    if failed:
        sys.exit(f"harbor failed for: {', '.join(failed)} (see {jobs_dir})")


if __name__ == "__main__":
    main()
