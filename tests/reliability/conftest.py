"""Campaign scale and the figures report of the reliability campaign.

The short campaign runs in every ``python -m pytest`` run. The long one runs
with ``--run-slow`` or with ``TASKWARDEN_LONG=1`` in the environment. Every
campaign records its figures (kills survived, operations, inputs tried,
anything lost); they are printed in the terminal summary and, when
``TASKWARDEN_RELIABILITY_REPORT`` names a file, written there as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest

import taskwarden

from ..conftest import is_long

REPORT_ENV = "TASKWARDEN_RELIABILITY_REPORT"

_FIGURES: dict[str, dict[str, Any]] = {}
_STARTED = time.time()


@pytest.fixture(scope="session")
def long_campaign(request: pytest.FixtureRequest) -> bool:
    """True for the long campaign (``--run-slow`` or ``TASKWARDEN_LONG=1``)."""
    return is_long(request.config)


class Figures:
    """Adds a campaign's numbers to the session report (values accumulate)."""

    def record(self, campaign: str, **numbers: Any) -> None:
        entry = _FIGURES.setdefault(campaign, {})
        for key, value in numbers.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                entry[key] = entry.get(key, 0) + value
            else:
                entry[key] = value


@pytest.fixture(scope="session")
def figures() -> Figures:
    return Figures()


def _report(config: pytest.Config) -> dict[str, Any]:
    return {
        "mode": "long" if is_long(config) else "short",
        "taskwarden_version": taskwarden.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "seconds": round(time.time() - _STARTED, 1),
        "campaigns": _FIGURES,
    }


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _FIGURES:
        return
    report = _report(config)
    terminalreporter.write_sep("-", f"taskwarden reliability figures ({report['mode']})")
    for name, numbers in sorted(_FIGURES.items()):
        shown = ", ".join(f"{k}={v}" for k, v in numbers.items())
        terminalreporter.write_line(f"{name}: {shown}")
    target = os.environ.get(REPORT_ENV)
    if target:
        Path(target).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        terminalreporter.write_line(f"figures written to {REPORT_ENV}")
