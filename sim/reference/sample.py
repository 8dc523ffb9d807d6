"""One rollout sample (a prompt's response) as it moves through the system."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Sample:
    sid: int
    prompt: int
    response: int
    start_version: int
    generated: int = 0  # tokens generated before the current residence on an engine
    joined_at: int = 0  # engine iteration counter when it (re)joined the running batch
    turn: int = 0  # agentic episodes: the turn it is on (prompt: the context so far, response: this answer)
    cached: int = 0  # tokens of its context its engine's prefix cache holds (not prefilled again)
    # (policy version, tokens) for every token generated so far, in order
    versions: list[tuple[int, int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.prompt + self.response

    def add_tokens(self, version: int, n: int) -> None:
        if n <= 0:
            return
        if self.versions and self.versions[-1][0] == version:
            self.versions[-1] = (version, self.versions[-1][1] + n)
        else:
            self.versions.append((version, n))
        self.generated += n
