"""``magnetar tokens``: ``pulsar tokens``' commands (keys and JWTs for token
authentication), and the ``--auth-plugin``/``--auth-params`` flags that ``magnetar admin``
and ``magnetar client`` take as pulsar-admin and pulsar-client do.

A secret key is written as raw bytes (``--output FILE``) or printed in base64
(``--base64``), a key pair as DER files, as Pulsar writes them; the broker reads them back
with ``tokenSecretKey=file:///...`` or ``tokenPublicKey=file:///...``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time

from ._cli import Command, register_command

__all__ = ["TOKEN_PLUGINS", "add_auth_arguments", "token_of"]

#: The client authentication plugins that mean token authentication: Pulsar's class
#: name, and its short name.
TOKEN_PLUGINS = ("org.apache.pulsar.client.impl.auth.AuthenticationToken", "token")


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    """pulsar-admin's and pulsar-client's authentication flags."""
    p.add_argument("--auth-plugin", default=os.environ.get("MAGNETAR_AUTH_PLUGIN"),
                   help="authentication plugin: org.apache.pulsar.client.impl.auth."
                        "AuthenticationToken (or $MAGNETAR_AUTH_PLUGIN)")
    p.add_argument("--auth-params", default=os.environ.get("MAGNETAR_AUTH_PARAMS"),
                   help="the plugin's parameters: token:<jwt>, file:///path/to/token or "
                        "{\"token\":\"<jwt>\"} (or $MAGNETAR_AUTH_PARAMS)")


def token_of(args: argparse.Namespace) -> str | None:
    """The token that ``--auth-plugin``/``--auth-params`` give, as Pulsar's
    ``AuthenticationToken`` reads its parameters; None without them. Raises
    argparse.ArgumentTypeError for another plugin or unreadable parameters."""
    plugin, params = args.auth_plugin, args.auth_params
    if not plugin and not params:
        return None
    if plugin and plugin not in TOKEN_PLUGINS:
        raise argparse.ArgumentTypeError(
            f"--auth-plugin {plugin}: only token authentication ({TOKEN_PLUGINS[0]}) is available")
    params = (params or "").strip()
    if params.startswith("{"):
        try:
            value = json.loads(params).get("token")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, str):
            raise argparse.ArgumentTypeError('--auth-params: expected {"token": "<jwt>"}')
        return value
    if params.startswith("token:"):
        return params[len("token:"):]
    if params.startswith("file:"):
        from urllib.parse import unquote, urlparse

        path = unquote(urlparse(params).path)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"--auth-params: cannot read {path}: "
                                             f"{exc.strerror or exc}") from None
    if not params:
        raise argparse.ArgumentTypeError("--auth-params: give token:<jwt> or file:///path")
    return params


# --------------------------------------------------------------------------------------
# magnetar tokens


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _create_secret_key(args: argparse.Namespace) -> int:
    from core.auth import create_secret_key

    key = create_secret_key(args.signature_algorithm)
    data = base64.b64encode(key) if args.base64 else key
    if args.output:
        _write(args.output, data)
    else:
        sys.stdout.buffer.write(data + b"\n" if args.base64 else data)
        sys.stdout.flush()
    return 0


def _create_key_pair(args: argparse.Namespace) -> int:
    from core.auth import create_key_pair

    private, public = create_key_pair(args.signature_algorithm)
    _write(args.output_private_key, private)
    _write(args.output_public_key, public)
    return 0


def _key(arg: str, what: str) -> bytes:
    from core.auth import read_key

    try:
        return read_key(arg)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{what} {arg}: {exc}") from None


def _create(args: argparse.Namespace) -> int:
    from core.auth import create_token, parse_relative_time

    if bool(args.secret_key) == bool(args.private_key):
        raise argparse.ArgumentTypeError("give one of --secret-key and --private-key")
    expires_in = None
    if args.expiry_time:
        try:
            expires_in = parse_relative_time(args.expiry_time)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--expiry-time: {exc}") from None
    claims: dict[str, object] = {}
    for item in args.headers or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--claim: expected name=value, got {item!r}")
        claims[name] = value
    flag, value = ("--secret-key", args.secret_key) if args.secret_key else ("--private-key", args.private_key)
    key = _key(value, flag)
    try:
        token = create_token(key, args.subject, private_key=bool(args.private_key),
                             algorithm=args.signature_algorithm, expires_in=expires_in,
                             claims=claims)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{flag} {value}: {exc}") from None
    print(token)
    return 0


def _token_arg(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            return f.read().strip()
    if args.stdin:
        return sys.stdin.readline().strip()
    if os.environ.get("TOKEN"):
        return os.environ["TOKEN"]
    raise argparse.ArgumentTypeError("give the token, --token-file, --stdin or $TOKEN")


def _show(args: argparse.Namespace) -> int:
    from core.auth import show_token

    try:
        header, claims = show_token(_token_arg(args))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    print(json.dumps(header, separators=(",", ":")))
    print("---")
    print(json.dumps(claims, separators=(",", ":")))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from core.auth import AuthenticationError, TokenVerifier

    if bool(args.secret_key) == bool(args.public_key):
        raise argparse.ArgumentTypeError("give one of --secret-key and --public-key")
    try:
        verifier = TokenVerifier(
            secret_key=_key(args.secret_key, "--secret-key") if args.secret_key else None,
            public_key=_key(args.public_key, "--public-key") if args.public_key else None,
            public_alg=args.signature_algorithm)
    except ValueError as exc:
        which = f"--secret-key {args.secret_key}" if args.secret_key else f"--public-key {args.public_key}"
        raise argparse.ArgumentTypeError(f"{which}: {exc}") from None
    token = _token_arg(args)
    try:
        identity = verifier.verify(token)
    except AuthenticationError as exc:
        print(f"Token validation failed: {exc}", file=sys.stderr)
        return 1
    from core.auth import show_token

    print(json.dumps(show_token(token)[1], separators=(",", ":")))
    if identity.expires_at is not None:
        left = identity.expires_at - time.time()
        print(f"Expires in {left:.0f} seconds", file=sys.stderr)
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tokens_command", metavar="COMMAND", title="commands")

    c = sub.add_parser("create-secret-key", help="create a secret key (HS256 by default)")
    c.add_argument("-a", "--signature-algorithm", default="HS256", choices=("HS256", "HS384", "HS512"))
    c.add_argument("-o", "--output", help="write the key's bytes to this file (default: stdout)")
    c.add_argument("-b", "--base64", action="store_true", help="write the key in base64")
    c.set_defaults(_tokens_run=_create_secret_key)

    c = sub.add_parser("create-key-pair", help="create a private/public key pair (RS256 by default)")
    c.add_argument("-a", "--signature-algorithm", default="RS256",
                   choices=("RS256", "RS384", "RS512", "ES256", "ES384", "ES512"))
    c.add_argument("--output-private-key", required=True, help="file for the private key (PKCS#8 DER)")
    c.add_argument("--output-public-key", required=True, help="file for the public key (X.509 DER)")
    c.set_defaults(_tokens_run=_create_key_pair)

    c = sub.add_parser("create", help="create a token")
    c.add_argument("-s", "--subject", required=True, help="the role the token stands for")
    c.add_argument("-e", "--expiry-time", help="relative expiry, e.g. 1h, 3d, 1y (default: never)")
    c.add_argument("-sk", "--secret-key", help="the secret key: file:///path, data:;base64,... or base64")
    c.add_argument("-pk", "--private-key", help="the private key: file:///path, data:;base64,... or base64")
    c.add_argument("-a", "--signature-algorithm", help="algorithm (default HS256, or the key's: RS256, ES256)")
    c.add_argument("-hs", "--headers", "--claim", dest="headers", action="append",
                   help="an extra claim, name=value; repeatable")
    c.set_defaults(_tokens_run=_create)

    for name, doc, run in (("show", "print a token's header and claims", _show),
                           ("validate", "check a token's signature and expiry", _validate)):
        c = sub.add_parser(name, help=doc)
        c.add_argument("token", nargs="?")
        c.add_argument("-i", "--stdin", action="store_true", help="read the token from standard input")
        c.add_argument("-f", "--token-file", help="read the token from a file")
        if name == "validate":
            c.add_argument("-sk", "--secret-key", help="the secret key: file:///path, data:... or base64")
            c.add_argument("-pk", "--public-key", help="the public key: file:///path, data:... or base64")
            c.add_argument("-a", "--signature-algorithm", help="the public key's algorithm (default: the key's family)")
        c.set_defaults(_tokens_run=run)
    p.set_defaults(_tokens_parser=p)


def _run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_tokens_run", None)
    if fn is None:
        args._tokens_parser.print_help(sys.stderr)
        return 2
    try:
        return int(fn(args))
    except argparse.ArgumentTypeError as exc:
        print(f"magnetar tokens: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"magnetar tokens: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 1


register_command(Command(
    "tokens",
    "create keys and tokens for token authentication (like pulsar tokens)",
    _arguments,
    _run,
    "Create secret keys, key pairs and tokens (JWT), show and validate tokens.",
))
