"""An older commit's tree beside this one, for the benches that run it side by side (plan_speed, same_plans)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def base_tree(rev: str) -> Path:
    """A detached git worktree of `rev` under /tmp/speed-base-REV, made once and kept for later runs."""
    path = Path(f"/tmp/speed-base-{rev}")
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                       capture_output=True)
    return path
