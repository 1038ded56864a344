"""The README's Python examples run as written, and print what they say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) >= 3


def test_every_python_example_runs_and_prints_what_its_comment_says(tmp_path: Path) -> None:
    """In order, in one fresh directory (later examples reuse the ledger the
    earlier ones made); a ``print(...)  # text`` line must print ``text``."""
    tmp_path.chmod(0o700)
    checked = 0
    for block in BLOCKS:
        proc = subprocess.run(
            [sys.executable, "-c", block],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        promised = re.findall(r"^\s*print\(.*\)\s+# (.+)$", block, flags=re.M)
        printed = proc.stdout.splitlines()
        for line in promised:
            assert line in printed, (line, printed)
        checked += len(promised)
    assert checked >= 1
