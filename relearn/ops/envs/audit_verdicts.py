"""``relearn envs audit --verdicts``: what the verifier did to the verdicts beyond grading them."""

from __future__ import annotations

from dataclasses import dataclass

from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.envs import VerdictAuditOptions


@dataclass
class VerdictNotes:
    instance_id: str
    patch_hash: str
    resolved: bool
    notes: list[str]  # "refused: ...", "restored: FILE", "neutralized: ...", "disagreement: ...", "suspicious: ..."
    flagged: bool  # refused, contradicted or suspicious (restored and neutralized alone are not)


@dataclass
class VerdictAuditSummary:
    noted: list[VerdictNotes]  # only the verdicts the verifier did something to
    verdicts: int  # read in all
    unreadable: list[str]  # "file:line: not a verdict: why"

    @property
    def flagged(self) -> int:
        return sum(n.flagged for n in self.noted)


def run_audit_verdicts(options: VerdictAuditOptions, reporter: Reporter = SILENT) -> VerdictAuditSummary:
    from envs.verify import Verdict
    from records.pools import iter_lines

    if not options.verdicts.is_file():
        raise OpError(f"{options.verdicts}: no such verdicts file")
    noted: list[VerdictNotes] = []
    unreadable: list[str] = []
    total = 0
    with stage(reporter, "reading verdicts"):
        for number, text in iter_lines(options.verdicts):
            reporter.advance()
            try:
                verdict = Verdict.model_validate_json(text)
            except ValueError as exc:
                unreadable.append(f"{options.verdicts}:{number}: not a verdict: {str(exc).splitlines()[0]}")
                continue
            total += 1
            notes = [f"refused: {r}" for r in verdict.refused] + [f"restored: {f}" for f in verdict.restored_files]
            notes += [f"neutralized: {n}" for n in verdict.neutralized] + [f"disagreement: {d}" for d in verdict.disagreements]
            notes += [f"suspicious: {s}" for s in verdict.suspicious]
            if notes:
                flagged = bool(verdict.refused or verdict.disagreements or verdict.suspicious)
                noted.append(VerdictNotes(verdict.instance_id, verdict.patch_hash, verdict.resolved, notes, flagged))
    return VerdictAuditSummary(noted, total, unreadable)
