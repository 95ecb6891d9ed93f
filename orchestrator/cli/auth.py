"""``engram auth``: the local development key, tokens minted with it, and who a token is.

The CLI acts like any other client: it holds a token and the token is verified
the same way the server verifies it. ``cli_identity`` is what every command that
touches tenant data uses: ``--token`` or ``ENGRAM_TOKEN`` first; otherwise
``--tenant``/``--user``/``--scopes`` mint a short-lived token with the dev key,
which only works where the dev key is trusted.
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from orchestrator.auth import Identity
from orchestrator.auth.devkey import create_dev_key, jwks_path, mint_token
from orchestrator.auth.tokens import EXPIRED, ROLE_SCOPES, TokenVerifier, scope_grant
from orchestrator.cli.output import console, styled
from orchestrator.config import Settings
from orchestrator.errors import BadInput, EngramError, Unauthenticated

auth_app = typer.Typer(help="Tokens: the local development key, minting and checking tokens.",
                       no_args_is_help=True)
out = console()
err = console(stderr=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(code)


def parse_scopes(value: str) -> list[str]:
    return [s for s in (p.strip() for p in value.replace(",", " ").split()) if s]


def token_scopes(value: str) -> list[str]:
    """A minted token's ``scope`` entries; one that would grant nothing (``team`` for
    ``read:team``) is refused rather than minted into a token that cannot read."""
    entries = parse_scopes(value)
    idle = [e for e in entries if scope_grant(e) is None]
    if idle:
        raise BadInput(
            f"scope entr{'y' if len(idle) == 1 else 'ies'} {', '.join(map(repr, idle))} would "
            f"grant nothing: a scope is granted as read:NAME or write:NAME (e.g. "
            f"read:{idle[0].rpartition(':')[2] or 'team'}), a role as "
            f"{' or '.join(sorted(ROLE_SCOPES))}")
    return entries


def cli_identity(settings: Settings, *, token: str | None, tenant: str | None, user: str,
                 scopes: str | None, ttl_s: int = 900) -> Identity:
    """The identity of a CLI command: a verified token, given or minted."""
    if not token:
        if not tenant:
            raise EngramError(
                "no identity: pass --token (or set ENGRAM_TOKEN), or --tenant and --scopes to mint "
                "one with the development key")
        token = mint_token(settings, tenant=tenant, user=user,
                           scopes=token_scopes(scopes or ""), ttl_s=ttl_s)
    try:
        return TokenVerifier.from_settings(settings).verify(token)
    except Unauthenticated as exc:
        raise Unauthenticated(token_hint(str(exc))) from exc


def token_hint(message: str) -> str:
    """``message`` (a refusal of the caller's token), with where a new token comes from when it
    says the token has expired: a CLI user holds it in ENGRAM_TOKEN and meets this an hour
    after the quickstart."""
    if not message.startswith(EXPIRED):
        return message
    return (f"{message}: the token given by --token or ENGRAM_TOKEN; get a new one from your "
            "identity provider, or where the development key is trusted mint one: engram auth "
            "token --tenant ORG --user USER --scopes read:SCOPE,write:SCOPE [--ttl SECONDS]")


@auth_app.command("dev-key")
def dev_key(force: Annotated[bool, typer.Option("--force", help="replace an existing key")] = False
            ) -> None:
    """Create the local development signing key (ES256, mode 0600) and its JWKS."""
    settings = Settings()
    try:
        path = create_dev_key(settings, force=force)
    except EngramError as exc:
        _fail(str(exc))
    out.print(f"development key written to {path} (mode 0600)")
    out.print(f"its public key set: {jwks_path(settings)}")


@auth_app.command("token")
def token(
    tenant: Annotated[str, typer.Option("--tenant", "--org", help="organization id of the tenant")],
    scopes: Annotated[str, typer.Option(help="e.g. read:team,write:team")],
    user: Annotated[str, typer.Option("--user", "--as", help="the subject (user id)")] = "dev",
    ttl: Annotated[int, typer.Option(help="lifetime in seconds")] = 3600,
) -> None:
    """Mint a token signed by the development key; prints only the token."""
    try:
        value = mint_token(Settings(), tenant=tenant, user=user, scopes=token_scopes(scopes),
                           ttl_s=ttl)
    except EngramError as exc:
        _fail(str(exc))
    print(value)


@auth_app.command("whoami")
def whoami(
    token: Annotated[str, typer.Option(envvar="ENGRAM_TOKEN", help="the token to check")],
) -> None:
    """Verify a token as the server would, print the identity it grants, and bind it in the
    database as every request does (an unknown organization or scope is refused there, not by
    the token's signature): exit 1 when either refuses it."""
    settings = Settings()
    try:
        ident = TokenVerifier.from_settings(settings).verify(token)
    except EngramError as exc:
        _fail(f"{exc} ({exc.code})", 1)
    out.print(f"organization {ident.org_id}, user {ident.user_id}")
    out.print(f"read: {', '.join(sorted(ident.readable)) or '-'}")
    out.print(f"write: {', '.join(sorted(ident.write_scopes)) or '-'}")
    if ident.roles:
        out.print(f"roles: {', '.join(sorted(ident.roles))}")
    refused = database_check(settings, ident)
    if refused:
        _fail(f"the database refuses this identity: {refused}", 1)


def database_check(settings: Settings, ident: Identity) -> str | None:
    """Bind ``ident`` in one transaction that reads nothing; prints what was checked and
    returns the database's refusal (``None`` when it accepts the identity or cannot be
    reached: then it says the token was not checked there)."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.db.session import bound_session
    from orchestrator.errors import describe_unavailable, is_unavailable

    try:
        url = Database(settings).app_url()
    except (EngramError, OSError, KeyError) as exc:  # no embedded cluster here, no password
        out.print(f"database: not checked ({exc})")
        return None
    engine = None
    try:
        engine = make_app_engine(url, pool_size=1)
        with bound_session(engine, ident):
            pass
    except EngramError as exc:
        if is_unavailable(exc):
            out.print(f"database: not checked ({describe_unavailable(exc)})")
            return None
        return str(exc)
    except Exception as exc:  # any failure to reach the database is said, not raised
        if not is_unavailable(exc):
            raise
        out.print(f"database: not checked ({describe_unavailable(exc)})")
        return None
    finally:
        if engine is not None:
            engine.dispose()
    out.print("database: accepts it (the organization and every scope exist)")
    return None
