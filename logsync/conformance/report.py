"""The kit's verdicts: one `Outcome` per check, grouped by the RFC 004 section it tests,
printed as a table (or JSON) with the exit code the command returns. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, NA = "pass", "fail", "n/a"
EXIT_PASS, EXIT_FAIL, EXIT_UNUSABLE = 0, 1, 2
EXIT_INCOMPLETE = EXIT_UNUSABLE  # the run's own deadline or budget cut it short

# The sections the kit checks, in the order they print (RFC 004's numbering).
SECTIONS: dict[str, str] = {
    "§3": "identities",
    "§4": "events",
    "§5": "HLC",
    "§6": "version vectors",
    "§7.1": "version_vector",
    "§7.2": "ops",
    "§7.3": "artifact",
    "§7.4": "digests",
    "§7.5": "push",
    "§7.6": "snapshot",
    "§7.7": "change stream",
    "§8": "extensions",
    "§8.1": "page byte budget",
    "§11": "errors",
    "§12": "security",
    "§13": "versioning",
}


@dataclass(frozen=True)
class Outcome:
    """One check: its section, a short name, pass / fail / n/a, and one sentence (why it
    failed or is not applicable; empty or a note for a pass)."""

    section: str
    check: str
    verdict: str
    sentence: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"section": self.section, "check": self.check, "verdict": self.verdict,
                "sentence": self.sentence}


@dataclass
class Report:
    """Every outcome of one run against one peer, in the order they were found."""

    peer: str
    outcomes: list[Outcome] = field(default_factory=list)
    unusable: str | None = None  # why the peer could not be checked at all (exit 2)
    # the kit's own limit that cut the run short (exit 2 unless a check already failed)
    incomplete: str | None = None
    requests: int = 0
    seconds: float = 0.0

    def add(self, section: str, check: str, verdict: str, sentence: str = "") -> None:
        if section not in SECTIONS:
            raise ValueError(f"section {section!r} is not one the kit knows")
        self.outcomes.append(Outcome(section, check, verdict, " ".join(sentence.split())))

    def passed(self, section: str, check: str, note: str = "") -> None:
        self.add(section, check, PASS, note)

    def failed(self, section: str, check: str, sentence: str) -> None:
        self.add(section, check, FAIL, sentence)

    def not_applicable(self, section: str, check: str, reason: str) -> None:
        self.add(section, check, NA, reason)

    def section_verdict(self, section: str) -> str:
        verdicts = {o.verdict for o in self.outcomes if o.section == section}
        if FAIL in verdicts:
            return FAIL
        return PASS if PASS in verdicts else NA

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict == FAIL]

    def exit_code(self) -> int:
        if self.unusable is not None:
            return EXIT_UNUSABLE
        if self.failures():  # a failure stands however far the run got
            return EXIT_FAIL
        return EXIT_INCOMPLETE if self.incomplete is not None else EXIT_PASS

    def as_dict(self) -> dict[str, Any]:
        sections = []
        for section, title in SECTIONS.items():
            mine = [o for o in self.outcomes if o.section == section]
            sections.append({"section": section, "title": title,
                             "verdict": self.section_verdict(section),
                             "checks": [o.as_dict() for o in mine]})
        return {"peer": self.peer, "exit_code": self.exit_code(), "unusable": self.unusable,
                "incomplete": self.incomplete,
                "requests": self.requests, "seconds": round(self.seconds, 3),
                "sections": sections, "failures": [o.as_dict() for o in self.failures()]}

    def lines(self) -> list[str]:
        """The table: one line per section, then each failure (and each n/a reason)."""
        if self.unusable is not None:
            return [f"{self.peer}: cannot be checked: {' '.join(self.unusable.split())}"]
        out = [f"conformance of {self.peer} (RFC 004), {self.requests} requests, "
               f"{self.seconds:.1f} s"]
        for section, title in SECTIONS.items():
            mine = [o for o in self.outcomes if o.section == section]
            verdict = self.section_verdict(section)
            counted = sum(o.verdict != NA for o in mine)
            out.append(f"{section:<5} {title:<17} {verdict:<5} {counted} checks")
            for o in mine:
                if o.verdict == FAIL:
                    out.append(f"      FAIL {o.check}: {o.sentence}")
                elif o.verdict == NA and verdict == NA:
                    out.append(f"      n/a  {o.check}: {o.sentence}")
        if self.incomplete is not None:
            out.append(f"incomplete: {' '.join(self.incomplete.split())}; the checks after "
                       "it were not made")
        failed = len(self.failures())
        if failed:
            out.append(f"{failed} check{'s' if failed != 1 else ''} failed")
        elif self.incomplete is None:
            out.append("all applicable checks pass")
        return out
