"""`magnetar spark`: the job list and refusing an unknown job (no Spark session needed)."""

from __future__ import annotations

import importlib.util

import pytest

from gateway._cli import main
from tests.conftest import skip_or_fail


def test_spark_list_names_every_job(capsys: pytest.CaptureFixture[str]) -> None:
    from spark.jobs import JOBS

    assert main(["spark", "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert listed == sorted(JOBS)


def test_spark_submit_unknown_job_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark", "submit", "no-such-job"]) == 2
    assert "no Spark job 'no-such-job'" in capsys.readouterr().err


def test_spark_submit_passes_arguments_to_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["spark", "submit", "top_keys", "--", "--help"])
    assert exc.value.code == 0
    assert "--topics" in capsys.readouterr().out


def test_spark_without_pyspark_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyspark", None)  # as when it is not installed
    assert main(["spark", "list"]) == 1
    assert "pip install 'magnetar[spark]'" in capsys.readouterr().err


def test_pyspark_finds_the_shim_package() -> None:
    """Spark registers the DefaultSource of every importable ``pyspark_*`` module (SPARK-45917)."""
    import pkgutil

    if importlib.util.find_spec("pyspark") is None:
        skip_or_fail("pyspark is not installed")
    found = [m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")]
    assert "pyspark_magnetar" in found
    from pyspark.sql.datasource import DataSource

    import pyspark_magnetar

    assert issubclass(pyspark_magnetar.DefaultSource, DataSource)
    assert pyspark_magnetar.DefaultSource.name() == "magnetar"
