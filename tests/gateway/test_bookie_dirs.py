"""Where a bookie's journal and ledgers go: journalDirectory, ledgerDirectories and
indexDirectories."""

from __future__ import annotations

import pytest

from gateway._bookies import bookie_directories
from gateway._config import ConfigError, load_config


def _dirs(flags: dict[str, str], name: str | None = None) -> tuple[str, list[str]]:
    return bookie_directories(load_config(None, flags, environ={}), "/data/bookie", name)


def test_by_default_everything_is_under_the_data_directory():
    assert _dirs({}) == ("/data/bookie", [])
    assert _dirs({}, "2") == ("/data/bookie", [])


def test_a_journal_directory_of_its_own_leaves_the_ledgers_where_they_were():
    assert _dirs({"journalDirectory": "/j"}) == ("/j", ["/data/bookie"])
    # A standalone's bookie 1 takes subdirectory 1.
    assert _dirs({"journalDirectory": "/j"}, "1") == ("/j/1", ["/data/bookie"])


def test_ledger_directories_each_give_every_bookie_its_own_subdirectory():
    flags = {"journalDirectory": "/j", "ledgerDirectories": "/l1,/l2"}
    assert _dirs(flags) == ("/j", ["/l1", "/l2"])
    assert _dirs(flags, "0") == ("/j/0", ["/l1/0", "/l2/0"])
    assert _dirs({"ledgerDirectories": "/l1"}) == ("/data/bookie", ["/l1"])


def test_index_directories_must_be_the_ledger_directories():
    same = {"ledgerDirectories": "/l1,/l2", "indexDirectories": "/l1,/l2"}
    assert _dirs(same) == ("/data/bookie", ["/l1", "/l2"])
    with pytest.raises(ConfigError, match="indexDirectories must be empty or the same as "
                                          "ledgerDirectories"):
        _dirs({"ledgerDirectories": "/l1", "indexDirectories": "/idx"})
