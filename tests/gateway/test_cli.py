"""gateway._cli (the ``magnetar`` command) and gateway._logging (the logs it sets up)."""

from __future__ import annotations

import calendar
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
import types

import pytest

import gateway
from gateway import _cli
from gateway._cli import COMMANDS, Command, main, register_command, version_string
from gateway._logging import setup_logging

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def fake_runner(monkeypatch):
    """Replace gateway._standalone and gateway._bookie with recorders of (cfg, args)."""
    calls: list[tuple[str, object, object]] = []

    def make(name: str) -> types.ModuleType:
        module = types.ModuleType(f"gateway.{name}")

        def run(cfg, args):
            calls.append((name, cfg, args))
            return 0

        module.run = run  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, f"gateway.{name}", module)
        monkeypatch.setattr(gateway, name, module, raising=False)
        return module

    make("_standalone")
    make("_bookie")
    # The commands configure logging; leave the root logger as the test found it.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    return calls


@pytest.fixture
def no_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PULSAR_PREFIX_"):
            monkeypatch.delenv(name)


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("standalone", "bookie", "version"):
        assert name in out


@pytest.mark.parametrize("command", ["standalone", "bookie", "version"])
def test_each_command_has_help(command, capsys):
    assert main([command, "--help"]) == 0
    assert f"usage: magnetar {command}" in capsys.readouterr().out


def test_standalone_help_shows_its_flags(capsys):
    main(["standalone", "--help"])
    out = capsys.readouterr().out
    for flag in ("--config", "--bookies", "--data-dir", "--conf", "--wipe-data"):
        assert flag in out


def test_help_imports_no_command_implementation():
    code = (
        "import sys\n"
        "from gateway._cli import main\n"
        "assert main(['--help']) == 0\n"
        "assert main(['standalone', '--help']) == 0\n"
        "assert main(['bookie', '--help']) == 0\n"
        "loaded = [m for m in ('gateway._standalone', 'gateway._bookie', 'core', 'trio') "
        "if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()


def test_version_command(capsys):
    assert main(["version"]) == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"magnetar \S+", out)
    assert out == version_string()
    assert out.endswith(gateway.__version__)


def test_no_command_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: magnetar" in capsys.readouterr().err


def test_unknown_command_exits_2(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_standalone_passes_flags_as_configuration(fake_runner, tmp_path, no_env):
    rc = main([
        "standalone", "--bookies", "3", "--data-dir", str(tmp_path), "--wipe-data",
        "-c", "brokerServicePort=16650", "--conf", "kafkaTenant=t1",
    ])
    assert rc == 0
    [(name, cfg, args)] = fake_runner
    assert name == "_standalone"
    assert cfg.standaloneBookies == 3
    assert cfg.dataDirectory == str(tmp_path)
    assert cfg.metadataStoreUrl == "sqlite:" + os.path.join(str(tmp_path), "metadata.db")
    assert cfg.brokerServicePort == 16650
    assert cfg.kafkaTenant == "t1"
    assert args.wipe_data is True


def test_standalone_starts_with_the_collector_off_and_leaves_it_on(fake_runner, monkeypatch,
                                                                    tmp_path, no_env):
    import gc

    seen: list[bool] = []
    monkeypatch.setattr(gateway._standalone, "run", lambda cfg, args: seen.append(gc.isenabled()) or 0)
    assert gc.isenabled()
    assert main(["standalone", "--data-dir", str(tmp_path)]) == 0
    assert seen == [False], "startup runs without collections"
    assert gc.isenabled(), "on again once the command returns (settling turns it on earlier)"


def test_standalone_reads_the_given_config_file(fake_runner, tmp_path, no_env):
    conf = tmp_path / "my.conf"
    conf.write_text("clusterName=from-file\nwebServicePort=18080\n")
    assert main(["standalone", "--config", str(conf), "-c", "webServicePort=18081"]) == 0
    [(_, cfg, _)] = fake_runner
    assert cfg.clusterName == "from-file"
    assert cfg.webServicePort == 18081
    assert cfg.path == str(conf)


def test_standalone_defaults_to_conf_standalone_conf(fake_runner, tmp_path, monkeypatch, no_env):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "standalone.conf").write_text("clusterName=from-cwd\n")
    monkeypatch.chdir(tmp_path)
    assert main(["standalone"]) == 0
    [(_, cfg, _)] = fake_runner
    assert cfg.clusterName == "from-cwd"


def test_bookie_passes_flags_as_configuration(fake_runner, tmp_path, no_env):
    rc = main([
        "bookie", "--port", "13181", "--data-dir", str(tmp_path),
        "--metadata-store-url", "zk:127.0.0.1:2181/m",
    ])
    assert rc == 0
    [(name, cfg, _)] = fake_runner
    assert name == "_bookie"
    assert cfg.bookiePort == 13181
    assert cfg.metadataStoreUrl == "zk:127.0.0.1:2181/m"
    assert cfg.dataDirectory == str(tmp_path)


def test_config_error_prints_magnetar_error_and_exits_2(fake_runner, capsys, no_env):
    assert main(["standalone", "-c", "brokerServicePort=abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("magnetar: error: brokerServicePort: 'abc' is not an integer")
    assert fake_runner == []


def test_standalone_refuses_bookie_frames_too_small_for_its_largest_message(
        fake_runner, capsys, no_env):
    assert main(["standalone", "-c", "nettyMaxFrameSizeBytes=5242880"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("magnetar: error: nettyMaxFrameSizeBytes: 5242880 cannot hold a "
                          "message of maxMessageSize (5242880)")
    assert fake_runner == []
    # A bookie has no messages of its own to hold: it takes the limit it is given.
    assert main(["bookie", "-c", "nettyMaxFrameSizeBytes=5242880"]) == 0
    [(name, cfg, _)] = fake_runner
    assert (name, cfg.nettyMaxFrameSizeBytes) == ("_bookie", 5242880)


_NATIVE_LOG = ("import sys; from core import _native; _native.log_to_stderr(sys.argv[1], sys.argv[2]); "
               "_native.BookieServer(sys.argv[3], '127.0.0.1', 0).shutdown()")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_native_cores_log_records_reach_stderr_as_the_process_logs(tmp_path, fmt):
    """A server process's native records (here a bookie's "listening" line) are written
    as gateway._logging writes its own: the same fields, at the process's level."""
    out = subprocess.run([sys.executable, "-c", _NATIVE_LOG, "info", fmt, str(tmp_path / "b")],
                         capture_output=True, text=True, check=True, timeout=60)
    [line] = [x for x in out.stderr.splitlines() if "bookie listening on" in x]
    if fmt == "json":
        record = json.loads(line)
        assert (record["level"], record["logger"]) == ("info", "magnetar_bookie::server")
        ts = record["ts"]
    else:
        ts, level, rest = line.split(" ", 2)
        assert level == "INFO"
        assert rest.lstrip().startswith("magnetar_bookie::server: bookie listening on 127.0.0.1:")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ts)
    stamped = calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))
    assert abs(stamped - time.time()) < 300, f"{ts} is not now, in UTC"
    quiet = subprocess.run([sys.executable, "-c", _NATIVE_LOG, "warning", fmt, str(tmp_path / "q")],
                           capture_output=True, text=True, check=True, timeout=60)
    assert "bookie listening on" not in quiet.stderr


def test_missing_config_file_exits_2(fake_runner, tmp_path, capsys):
    assert main(["bookie", "--config", str(tmp_path / "nope.conf")]) == 2
    assert "magnetar: error: cannot read configuration file" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["standalone", "--bookies", "0"],
    ["standalone", "-c", "novalue"],
    ["bookie", "--port", "99999"],
])
def test_bad_flags_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_command_exit_code_is_returned(monkeypatch, fake_runner):
    sys.modules["gateway._standalone"].run = lambda cfg, args: 3  # type: ignore[attr-defined]
    assert main(["standalone"]) == 3


def test_registered_command_runs(monkeypatch, capsys):
    monkeypatch.setattr(_cli, "COMMANDS", dict(COMMANDS))
    seen = []

    def add(p):
        p.add_argument("--name", required=True)

    def run(args):
        seen.append(args.name)
        return 0

    register_command(Command("hello", "say hello", add, run))
    assert main(["hello", "--name", "x"]) == 0
    assert seen == ["x"]
    assert main(["--help"]) == 0
    assert "say hello" in capsys.readouterr().out


def test_console_entry_point_runs_as_a_module():
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "gateway._cli", "version"], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 0
    assert proc.stdout.decode().startswith("magnetar ")


def test_a_command_module_run_directly_still_finds_every_command():
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "gateway._cli", "admin", "--help"], env=env,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().startswith("usage: magnetar admin")


def test_the_standalone_loads_no_code_it_does_not_run():
    """What ``magnetar standalone`` imports before it is ready: none of the other commands'
    modules, no token cryptography while authentication is off, no distribution metadata,
    and no web framework (built at the first HTTP request). Each cost tens of ms of start."""
    probe = (
        "import sys\n"
        "from gateway import _cli\n"
        "_cli.build_parser('standalone').parse_args(['standalone'])\n"
        "import gateway._standalone, handlers.pulsar, handlers.kafka\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.decode().split())
    assert "gateway._standalone" in loaded and "trio" in loaded
    unwanted = {"gateway._admin_cli", "gateway._client_cli", "gateway._perf", "gateway._tokens_cli",
                "spark._cli", "jwt", "cryptography", "importlib.metadata", "starlette",
                "gateway.admin", "crc32c"}
    assert not unwanted & loaded


def test_help_lists_every_command_in_registration_order(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    names = ["standalone", "bookie", "version", "spark", "tokens", "admin", "client", "completion", "perf"]
    at = [out.index(f"\n    {name}") for name in names]
    assert at == sorted(at)


# --- logging -----------------------------------------------------------------------------


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def test_json_logs_carry_fields(restore_root_logger):
    buf = io.StringIO()
    setup_logging("debug", "json", stream=buf)
    log = logging.getLogger("magnetar.test")
    log.debug("opened %s", "ledger", extra={"ledger_id": 7, "topic": "persistent://a/b/c"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    first, second = (json.loads(line) for line in buf.getvalue().splitlines() if line.startswith("{"))
    assert first["level"] == "debug"
    assert first["logger"] == "magnetar.test"
    assert first["msg"] == "opened ledger"
    assert first["ledger_id"] == 7 and first["topic"] == "persistent://a/b/c"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert second["level"] == "error" and "RuntimeError: boom" in second["exc"]


def test_text_logs_and_level_filtering(restore_root_logger):
    buf = io.StringIO()
    setup_logging("warning", "text", stream=buf)
    log = logging.getLogger("magnetar.test")
    log.info("hidden")
    log.warning("shown", extra={"port": 6650})
    text = buf.getvalue()
    assert "hidden" not in text
    assert re.search(r"Z WARNING magnetar\.test: shown port=6650$", text.strip())


def test_setup_logging_twice_replaces_its_handler(restore_root_logger):
    first, second = io.StringIO(), io.StringIO()
    setup_logging("info", "text", stream=first)
    setup_logging("info", "json", stream=second)
    logging.getLogger("magnetar.test").info("once")
    assert first.getvalue() == ""
    assert json.loads(second.getvalue())["msg"] == "once"


def test_setup_logging_rejects_unknown_level_and_format(restore_root_logger):
    with pytest.raises(ValueError, match="log level"):
        setup_logging("loud", "text")
    with pytest.raises(ValueError, match="log format"):
        setup_logging("info", "yaml")


def test_metadata_store_failure_is_reported_not_raised(fake_runner, capsys, no_env):
    from core.metadata import MetadataError

    def fail(cfg, args):
        raise MetadataError("cannot connect to ZooKeeper at 127.0.0.1:1")

    sys.modules["gateway._bookie"].run = fail  # type: ignore[attr-defined]
    assert main(["bookie"]) == 1
    assert capsys.readouterr().err == "magnetar: error: cannot connect to ZooKeeper at 127.0.0.1:1\n"


def test_other_exceptions_propagate(fake_runner, no_env):
    def fail(cfg, args):
        raise RuntimeError("bug")

    sys.modules["gateway._bookie"].run = fail  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="bug"):
        main(["bookie"])


def _thp_enabled(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("THP_enabled:"))


def test_the_standalone_process_runs_without_transparent_huge_pages(tmp_path):
    import ctypes
    import ctypes.util

    from gateway._process import PR_SET_THP_DISABLE
    from tests._standalone import Standalone

    # The standalone inherits this process's setting (which an in-process command run by
    # another test may have changed): allow huge pages here, so only its own call counts.
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    assert libc.prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0) == 0
    assert _thp_enabled(os.getpid()) == "1"
    with Standalone(tmp_path / "data") as s:
        assert s.proc is not None
        assert _thp_enabled(s.proc.pid) == "0"


def test_disabling_transparent_huge_pages_reports_the_outcome():
    code = ("from gateway._process import disable_transparent_huge_pages as d; "
            "print(d(), open('/proc/self/status').read().split('THP_enabled:')[1].split()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "0"]


def test_settling_the_garbage_collector_freezes_startup_objects():
    """After startup nothing built so far is walked by a collection again, and young
    collections are spaced out."""
    code = ("import gc, json; from gateway._process import settle_garbage_collector as s, "
            "GC_YOUNG_THRESHOLD as t; before = gc.get_freeze_count(); gc.disable(); s(); "
            "print(json.dumps([before, gc.get_freeze_count(), len(gc.get_objects()), "
            "gc.get_threshold()[0] == t, gc.isenabled()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, frozen, visible, spaced, enabled = json.loads(out.stdout)
    assert before == 0 and frozen > 1000 and frozen > 10 * visible
    assert spaced
    assert enabled, "the collector the standalone turned off for startup runs again"


def _context_switches(pid: int) -> int:
    """Times any thread of ``pid`` has been put on a CPU so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[2])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def test_an_idle_standalone_sleeps(tmp_path):
    """With no clients, no thread of the broker wakes on a timer: an idle broker costs no
    CPU. (A bookie's checkpoint looks every 30 s, hence the allowance of a couple.)"""
    from tests._standalone import Standalone

    with Standalone(tmp_path / "data") as s:
        assert s.proc is not None
        pid = s.proc.pid
        deadline = time.monotonic() + 15
        while True:  # startup work (journal preallocation, first checkpoint) ends first
            before = _context_switches(pid)
            time.sleep(0.5)
            if _context_switches(pid) == before:
                break
            assert time.monotonic() < deadline, "the standalone never went quiet"
        before = _context_switches(pid)
        time.sleep(2)
        woke = _context_switches(pid) - before
        assert woke <= 2, f"an idle standalone woke {woke} times in 2 s"


def test_a_standalone_whose_bookie_refuses_its_directories_says_why(tmp_path):
    """A bookie that refuses its directories (here: a ledger directory that belongs to
    another bookie, by its cookie) stops the standalone with one line saying why, not a
    traceback out of the server's nursery."""
    from tests._standalone import Standalone

    ledgers = tmp_path / "ledgers"
    with Standalone(tmp_path / "first", conf={"ledgerDirectories": str(ledgers)}):
        pass
    second = Standalone(tmp_path / "second", conf={"ledgerDirectories": str(ledgers)})
    args = [sys.executable, "-m", "gateway", "standalone", "--data-dir", str(second.data_dir)]
    for k, v in second.conf.items():
        args += ["-c", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    [line] = [x for x in out.stderr.splitlines() if x.startswith("magnetar: error:")]
    assert "cookie mismatch" in line


@pytest.mark.parametrize("setting", ["brokerServicePort", "webServicePort", "kafkaListeners",
                                     "bookiePort"])
def test_a_standalone_that_cannot_listen_says_where_and_why(tmp_path, setting):
    """A port taken by another process stops the standalone with one line naming the
    address and the setting that gave it, as any operator's error does."""
    import socket as socketlib

    from tests._standalone import Standalone

    taken = socketlib.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        conf = Standalone(tmp_path / "data").conf
        conf[setting] = f"PLAINTEXT://127.0.0.1:{port}" if setting == "kafkaListeners" else port
        args = [sys.executable, "-m", "gateway", "standalone", "--data-dir", str(tmp_path / "data")]
        for k, v in conf.items():
            args += ["-c", f"{k}={v}"]
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    [line] = [x for x in out.stderr.splitlines() if x.startswith("magnetar: error:")]
    assert line.startswith(f"magnetar: error: cannot listen on 127.0.0.1:{port} ({setting}): "
                           "Address already in use")
