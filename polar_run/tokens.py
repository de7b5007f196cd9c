"""``polar token key | issue | show``: the operator's per-gateway tokens (``docs/security.md``, "Gateway tokens").

* ``polar token key --out FILE`` writes a new signing key (64 random hex digits, mode 0600). Give the file to the
  rollout server (``gateway_token_key_file``) and keep it from the gateways.
* ``polar token issue --gateway-id gw-3 --ttl 7d`` prints a token for gateway ``gw-3`` (or writes it, 0600, with
  ``--out``). The key comes from ``--key-file``, else from the rollout server's settings
  (``POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE``, or ``gateway_token_key_file`` in ``--config``'s ``[rollout]``).
* ``polar token show FILE`` prints what a token says (``-`` reads standard input); with a key it also verifies it.

Tokens are read from files or standard input, never from arguments (``/proc/<pid>/cmdline`` is world-readable).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument, PolarError
from polar_core.gateway_tokens import (
    GatewayTokenVerifier,
    issue_gateway_token,
    load_signing_key,
    new_signing_key,
    parse_ttl,
    read_claims,
)

__all__ = ["add_parser"]

_DEFAULT_TTL = "7d"


def add_parser(sub: Any) -> None:
    """Add the ``token`` subcommand to ``polar``'s subparsers."""
    token = sub.add_parser(
        "token",
        help="per-gateway tokens: make a signing key, issue a gateway's token, show one (docs/security.md)",
        description="Per-gateway tokens bind a gateway to its id without mTLS. The rollout server verifies them with "
        "the signing key (its gateway_token_key_file); only the operator and the rollout server hold the key.",
    )
    actions = token.add_subparsers(dest="token_command", required=True)
    key = actions.add_parser("key", help="write a new signing key (mode 0600)")
    key.add_argument("--out", required=True, metavar="FILE", help="where to write it (refused if it exists)")
    key.add_argument("--force", action="store_true", help="replace an existing file (every token issued dies)")
    key.set_defaults(func=_key)
    issue = actions.add_parser("issue", help="issue a gateway's token, signed with the key")
    issue.add_argument("--gateway-id", required=True, help="the one gateway id the token may act as")
    issue.add_argument(
        "--ttl", default=_DEFAULT_TTL, help=f"lifetime: seconds, or 30m, 12h, 7d, 2w (default {_DEFAULT_TTL})"
    )
    _key_source(issue)
    issue.add_argument("--out", metavar="FILE", help="write the token here (mode 0600) instead of standard output")
    issue.set_defaults(func=_issue)
    show = actions.add_parser("show", help="print a token's gateway id and times; verify it when a key is given")
    show.add_argument("file", metavar="FILE", help="file holding the token ('-': standard input)")
    _key_source(show)
    show.set_defaults(func=_show)


def _key_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-file",
        metavar="FILE",
        help="the signing key (default: the rollout server's gateway_token_key_file setting)",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML settings file whose [rollout] table names the key file")


def _key_file(args: argparse.Namespace, *, required: bool) -> Path | None:
    if args.key_file:
        return Path(args.key_file)
    from rollout_server.settings import RolloutSettings  # the setting's one reader; loaded only when needed

    path = RolloutSettings.load(Path(args.config) if args.config else None).gateway_token_key_file
    if path is None and required:
        raise InvalidArgument(
            "no signing key: pass --key-file, or set POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE (or gateway_token_key_file "
            "in --config's [rollout] table)"
        )
    return path


def _write_private(path: Path, text: str, *, replace: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise InvalidArgument(f"{path} exists; pass --force to replace it") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text + "\n")


def _key(args: argparse.Namespace) -> int:
    _write_private(Path(args.out), new_signing_key(), replace=args.force)
    print(f"wrote a new gateway token signing key to {args.out}", file=sys.stderr)
    return 0


def _issue(args: argparse.Namespace) -> int:
    key_file = _key_file(args, required=True)
    assert key_file is not None
    token = issue_gateway_token(load_signing_key(key_file), args.gateway_id, ttl_s=parse_ttl(args.ttl))
    claims = read_claims(token)
    if args.out:
        _write_private(Path(args.out), token, replace=True)
        print(f"wrote the token of {claims.describe()} to {args.out}", file=sys.stderr)
    else:
        print(token)
        print(f"issued: {claims.describe()}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument(f"cannot read {args.file}: {exc.strerror}") from None
    token = text.strip()
    claims = read_claims(token)
    print(claims.describe())
    key_file = _key_file(args, required=False)
    if key_file is None:
        print("signature: not checked (no key given)")
        return 0
    try:
        GatewayTokenVerifier.from_file(key_file).verify(token)
    except PolarError as exc:
        print(f"refused: {exc.message}")
        return 1
    print("valid: signed with this key and within its lifetime")
    return 0
