"""scripts/hop-trace/instrument.patch must keep applying to the current code,
or the per-hop latency breakdown in the README can no longer be reproduced."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_instrument_patch_applies_to_the_current_tree():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    patch = ROOT / "scripts" / "hop-trace" / "instrument.patch"
    result = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"{patch} no longer applies; re-instrument the hops and regenerate it with git diff:\n{result.stderr}")
