"""What every verb shares: the consoles, the exit codes, the list of problems."""

from __future__ import annotations

from rich.console import Console

# Exit codes, the same for every verb.
EXIT_OK, EXIT_PARTIAL, EXIT_USAGE = 0, 1, 2
SHOWN_PROBLEMS = 20

out = Console()
err = Console(stderr=True)


def show_problems(title: str, problems: list[str]) -> None:
    if not problems:
        return
    err.print(f"[bold]{title}[/bold] ({len(problems)}):")
    for problem in problems[:SHOWN_PROBLEMS]:
        err.print(f"  {problem}", markup=False, highlight=False)
    if len(problems) > SHOWN_PROBLEMS:
        err.print(f"  ... and {len(problems) - SHOWN_PROBLEMS} more")
