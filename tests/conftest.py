from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._auth import Tokens
from tests._standalone import Standalone

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> None:
    """Skip a test whose outside engine is missing, except in CI, where it must be there."""
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("standalone")
    with Standalone(data) as s:
        yield s


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    """A secret key and the tokens it signs (:class:`tests._auth.Tokens`)."""
    return Tokens(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, tokens: Tokens) -> Iterator[Standalone]:
    """A standalone with token authentication and authorization on (super-user
    :data:`tests._auth.SUPER_USER`)."""
    with Standalone(tmp_path_factory.mktemp("secured"), conf=tokens.conf()) as s:
        yield s


def _fail_skip_in_ci(report: pytest.CollectReport | pytest.TestReport) -> None:
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every engine must be present: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())
