"""What :func:`~tmpl.report.make_training_safe` hands back: the changes, the proof, the result."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...chat_template import ChatTemplate


@dataclass(frozen=True)
class Change:
    """One edit of the template: where (line of the original), the text before and after, and why."""

    line: int
    before: str
    after: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: `{self.before}` -> `{self.after}` ({self.reason})"


@dataclass(frozen=True)
class ProofStep:
    """One check run on the fixed template, and what it found."""

    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


@dataclass
class FixResult:
    """A training-safe rewrite of a template, with its changes and the proof that it is one."""

    name: str
    source: str
    original: str
    changes: list[Change]
    proof: list[ProofStep]
    verdicts_before: dict[str, str]
    verdicts_after: dict[str, str]
    template: ChatTemplate
    notes: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        """The changes line by line, then the proof (what ``tmpl fix`` prints)."""
        lines = [f"# {self.name}: training-safe rewrite", ""]
        lines += [f"tool loop: {self.verdicts_before['tool_loop']} -> {self.verdicts_after['tool_loop']}"]
        lines += [f"several user turns: {self.verdicts_before['multi_user']} -> {self.verdicts_after['multi_user']}"]
        lines += ["", f"## Changes ({len(self.changes)})"] + [f"- {c}" for c in self.changes]
        lines += ["", "## Proof"] + [f"- {p}" for p in self.proof]
        if self.notes:
            lines += ["", "## Notes"] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"
