"""The ``magnetar`` command line.

Each sub-command is one :class:`Command`: a name, a help line, a function that adds its
arguments, and a function that runs it. Commands are listed in :data:`COMMANDS`; a new
one is added with :func:`register_command` (see the built-in ones at the end of this
module). The code that does a command's work is imported inside its ``run`` function, so
``magnetar --help`` and ``magnetar <command> --help`` load nothing heavy.

Exit codes: 0 success, 2 usage or configuration error, 1 a metadata store that cannot
be used (both printed as ``magnetar: error: ...`` on stderr), otherwise whatever the
command returns.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._config import Config, ConfigError, check_frame_holds_message, load_config

__all__ = ["COMMANDS", "COMMAND_MODULES", "Command", "build_parser", "load_commands", "main",
           "register_command", "version_string", "load_command_config"]

PROG = "magnetar"

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True, slots=True)
class Command:
    """One sub-command of ``magnetar``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""


#: Registered sub-commands by name, in registration order (the order ``--help`` lists them).
COMMANDS: dict[str, Command] = {}


def register_command(command: Command) -> Command:
    """Add a sub-command; a later registration under the same name replaces the earlier one."""
    COMMANDS[command.name] = command
    return command


def version_string() -> str:
    """``magnetar <version>`` from the installed distribution, else the package's ``__version__``."""
    from importlib import metadata

    try:
        version = metadata.version("magnetar")
    except metadata.PackageNotFoundError:
        import gateway

        version = getattr(gateway, "__version__", "0+unknown")
    return f"{PROG} {version}"


class _VersionAction(argparse.Action):
    """``--version``: prints :func:`version_string` and exits. The version is looked up only
    when asked for: reading the installed distributions' metadata takes tens of
    milliseconds, which every other command would pay at start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str = "show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_string())
        parser.exit()


def _default_conf(name: str) -> str | None:
    for base in (os.getcwd(), _REPO_ROOT):
        candidate = os.path.join(base, "conf", name)
        if os.path.isfile(candidate):
            return candidate
    return None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer port") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port 0-65535")
    return value


def add_config_arguments(parser: argparse.ArgumentParser, default_file: str) -> None:
    """``--config FILE`` and repeated ``-c/--conf key=value``, shared by server commands."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"configuration file (default: conf/{default_file} if present, else built-in defaults)",
    )
    parser.add_argument(
        "-c",
        "--conf",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="override one configuration key; repeatable",
    )
    parser.set_defaults(default_config_file=default_file)


def load_command_config(args: argparse.Namespace, flag_overrides: dict[str, str] | None = None) -> Config:
    """Resolve the configuration for a command: its file, the environment, ``-c`` pairs,
    then the command's own flags (``flag_overrides``, already mapped to key names)."""
    path = args.config
    if path is None:
        path = _default_conf(args.default_config_file)
    overrides = dict(args.conf)
    overrides.update(flag_overrides or {})
    return load_config(path, overrides)


def _setup_logging(cfg: Config) -> None:
    from ._logging import setup_logging

    setup_logging(cfg.logLevel, cfg.logFormat)


def _setup_server(cfg: Config) -> None:
    """What every long-running server command does first: its log, the native core's
    records included, and its memory settings."""
    from core import _native

    from ._process import disable_transparent_huge_pages

    _setup_logging(cfg)
    _native.log_to_stderr(cfg.logLevel, cfg.logFormat)
    disable_transparent_huge_pages()


# --------------------------------------------------------------------------------------
# Built-in commands


def _standalone_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p, "standalone.conf")
    p.add_argument("--bookies", type=_positive_int, metavar="N",
                   help="number of in-process bookies (standaloneBookies)")
    p.add_argument("--data-dir", metavar="DIR", help="data directory (dataDirectory)")
    p.add_argument("--wipe-data", action="store_true",
                   help="delete the data directory's contents before starting")


def _run_standalone(args: argparse.Namespace) -> int:
    flags: dict[str, str] = {}
    if args.bookies is not None:
        flags["standaloneBookies"] = str(args.bookies)
    if args.data_dir is not None:
        flags["dataDirectory"] = args.data_dir
    cfg = load_command_config(args, flags)
    check_frame_holds_message(cfg)
    _check_authentication(cfg)
    _setup_server(cfg)
    # Startup builds tens of thousands of objects that live as long as the process; a
    # collection walking them before they are frozen (settle_garbage_collector, which
    # turns the collector back on) only delays "ready": by about 50 ms.
    gc.disable()
    try:
        from . import _standalone

        return int(_standalone.run(cfg, args))
    finally:
        gc.enable()


def _check_authentication(cfg: Config) -> None:
    """Refuse, before anything starts, an authentication configuration the broker cannot
    serve (another provider than tokens, no key, a key that does not load)."""
    from core.auth import AuthConfigError, AuthService

    try:
        AuthService(cfg, None)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None


def _bookie_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p, "bookie.conf")
    p.add_argument("--port", type=_port, metavar="PORT", help="bookie port (bookiePort)")
    p.add_argument("--data-dir", metavar="DIR", help="data directory (dataDirectory)")
    p.add_argument("--metadata-store-url", metavar="URL",
                   help="metadata store, e.g. zk:127.0.0.1:2181/magnetar (metadataStoreUrl)")


def _run_bookie(args: argparse.Namespace) -> int:
    flags: dict[str, str] = {}
    if args.port is not None:
        flags["bookiePort"] = str(args.port)
    if args.data_dir is not None:
        flags["dataDirectory"] = args.data_dir
    if args.metadata_store_url is not None:
        flags["metadataStoreUrl"] = args.metadata_store_url
    cfg = load_command_config(args, flags)
    _setup_server(cfg)
    from . import _bookie

    return int(_bookie.run(cfg, args))


def _version_arguments(p: argparse.ArgumentParser) -> None:
    del p


def _run_version(args: argparse.Namespace) -> int:
    del args
    print(version_string())
    return 0


register_command(Command(
    "standalone",
    "run a broker with in-process bookies and a local metadata store",
    _standalone_arguments,
    _run_standalone,
    "Run every listener, the metadata store and the bookies in one process.",
))
register_command(Command(
    "bookie",
    "run one bookie (storage server) of a cluster",
    _bookie_arguments,
    _run_bookie,
    "Run a bookie that registers itself in the metadata store.",
))
register_command(Command("version", "print the version", _version_arguments, _run_version))
_BUILT_IN = list(COMMANDS)

#: The commands defined in their own modules, by name, in the order ``--help`` lists them:
#: the module that registers each when imported. A command line naming one imports that
#: module only, so ``magnetar standalone`` loads none of the admin, client, perf, token or
#: Spark code, nor builds their parsers; ``--help``, an unknown command and shell
#: completion load them all.
COMMAND_MODULES: dict[str, str] = {
    "spark": "spark._cli",
    "tokens": "gateway._tokens_cli",
    "admin": "gateway._admin_cli",
    "client": "gateway._admin_cli",
    "completion": "gateway._admin_cli",
    "perf": "gateway._perf",
}


def load_commands(name: str | None = None) -> None:
    """Register the command ``name`` (importing its module), or with None every command."""
    if name is not None:
        if name in COMMAND_MODULES:
            importlib.import_module(COMMAND_MODULES[name])
        return
    for module in dict.fromkeys(COMMAND_MODULES.values()):
        importlib.import_module(module)


# --------------------------------------------------------------------------------------


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command; with ``only``, the sub-parser
    of that command alone (what parsing a command line that names it needs)."""
    load_commands(only)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="One broker for Pulsar and Kafka clients.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    # Listed in one order whatever imported the command modules first: the built-in
    # commands, those of COMMAND_MODULES, then any other in registration order.
    order = {name: i for i, name in enumerate([*_BUILT_IN, *COMMAND_MODULES])}
    for command in sorted(COMMANDS.values(), key=lambda c: order.get(c.name, len(order))):
        if only is not None and command.name != only:
            continue
        p = sub.add_parser(command.name, help=command.help,
                           description=command.description or command.help)
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``magnetar`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command is the first word that is no option (the top level takes no values).
    named = next((a for a in argv if not a.startswith("-")), None)
    known = named is not None and (named in COMMANDS or named in COMMAND_MODULES)
    parser = build_parser(only=named if known else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return _exit_code(e.code)
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return command.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        cause = _sole_cause(e)
        code = _operator_error_code(cause)
        if code is None:
            raise
        print(f"{PROG}: error: {cause}", file=sys.stderr)
        return code


def _operator_error_code(cause: BaseException) -> int | None:
    """The exit code of an operator's error, which is said in one line rather than a
    traceback; None for anything else. A bad configuration exits 2. A metadata store that
    cannot be opened or reached, a bookie that refuses its directories (locked, or not its
    own) and a listener that cannot be opened (the address in use) exit 1. (Their modules
    are only loaded by the commands that use them.)"""
    if isinstance(cause, ConfigError):
        return 2
    metadata = sys.modules.get("core.metadata")
    native = sys.modules.get("core._native")
    serve = sys.modules.get("handlers._serve")
    if (metadata is not None and isinstance(cause, metadata.MetadataError)
            or native is not None and isinstance(cause, native.BookieError)
            or serve is not None and isinstance(cause, serve.ListenError)):
        return 1
    return None


def _sole_cause(exc: BaseException) -> BaseException:
    """The one exception inside ``exc``'s nested exception groups (an error raised in a
    server's nursery comes wrapped in one), or ``exc`` itself when it is not a group of
    exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    # Run as ``python -m gateway._cli``: the command modules register with the imported
    # ``gateway._cli``, not with this ``__main__`` copy, so its ``main`` is the one to run.
    from gateway._cli import main as _main

    sys.exit(_main())
