"""What an installed taskwarden declares about itself."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import taskwarden

ROOT = Path(__file__).resolve().parent.parent


def test_the_declared_licence_ships_with_the_package() -> None:
    meta = metadata.metadata("taskwarden")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_versions_agree() -> None:
    assert metadata.version("taskwarden") == taskwarden.__version__


def test_importing_the_main_module_does_not_run_the_cli() -> None:
    """Tools that import every module (documentation builders, test
    collectors) must not start the CLI by doing so."""
    done = subprocess.run(
        [sys.executable, "-c", "import taskwarden.__main__"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["demo", "--format", "text"]])
def test_the_cli_runs_with_docstrings_stripped(argv: list[str], tmp_path: Path) -> None:
    """``python -OO`` (or PYTHONOPTIMIZE=2, set in some images) drops
    docstrings: the CLI's help text must not live only in one."""
    tmp_path.chmod(0o700)
    if argv[0] == "demo":
        argv = [*argv, "--db", str(tmp_path / "demo.db")]
    done = subprocess.run(
        [sys.executable, "-OO", "-m", "taskwarden", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "taskwarden" in done.stdout
