"""``engram recall``, ``engram prepare`` and ``engram trace`` through the real CLI."""

from __future__ import annotations

import re
import time
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.auth.devkey import mint_token
from orchestrator.cli.main import app
from tests.support.api import api_settings, serve
from tests.support.derive import cli_env
from tests.support.recall import doc, embedder, write_documents

__all__ = ["cli_env", "embedder"]


def test_recall_prepare_and_trace_as_a_user(cli_env, tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team", "exec")
    write_documents(app_engine, t.identity(write=("team", "exec")), embedder, [
        doc("roof.md", "Roof repair", "Three quotes for the roof; the cheapest is Dakwerk at 4,200 euros."),
        doc("board.md", "Board memo", "The roof budget is capped at 5,000 euros.", scopes=("exec",)),
    ], settings)
    runner = CliRunner()
    who = ["--org", t.org_id, "--as", "alice", "--read", "team"]
    recalled = runner.invoke(app, ["recall", "how much will the roof cost?", *who], env=cli_env)
    assert recalled.exit_code == 0, recalled.output
    assert "Dakwerk" in recalled.output and "capped" not in recalled.output
    prepared = runner.invoke(app, ["prepare", "how much will the roof cost?", *who], env=cli_env)
    assert prepared.exit_code == 0 and "## Relevant evidence" in prepared.output
    assert "## Top documents" in prepared.output and "capped" not in prepared.output
    traced = runner.invoke(app, ["trace", "how much will the roof cost?", *who, "--mode", "timeline"],
                           env=cli_env)
    assert traced.exit_code == 0, traced.output
    for stage in ("1. candidate pools", "dense:", "lexical:", "graph:", "timeline:",
                  "3. reranker:", "5. budget:", "6. side effects:", "7. rendered", "timings:"):
        assert stage in traced.output, stage
    assert "capped" not in traced.output and "board.md" not in traced.output
    # The exec reader sees the memo; bad input is refused with a clear message.
    boss = runner.invoke(app, ["recall", "roof budget cap", "--org", t.org_id, "--as", "carol",
                               "--read", "team,exec"], env=cli_env)
    assert "capped" in boss.output
    bad = runner.invoke(app, ["recall", "   ", *who], env=cli_env)
    assert bad.exit_code == 2 and "the question is empty" in bad.output
    bad = runner.invoke(app, ["trace", "roof", *who, "--mode", "psychic"], env=cli_env)
    assert bad.exit_code == 2 and "unknown mode" in bad.output


def test_the_cli_asks_a_running_api_server_and_says_so(cli_env, tenant_factory, app_engine, embedder,
                                                        settings, tmp_path):
    t = tenant_factory("team", "exec")
    write_documents(app_engine, t.identity(write=("team", "exec")), embedder, [
        doc("roof.md", "Roof repair", "Three quotes for the roof; the cheapest is Dakwerk at 4,200 euros."),
        doc("board.md", "Board memo", "The roof budget is capped at 5,000 euros.", scopes=("exec",)),
    ], settings)
    runner = CliRunner()
    who = ["--org", t.org_id, "--as", "alice", "--read", "team"]
    question = "how much will the roof cost?"
    local = runner.invoke(app, ["recall", question, *who], env=cli_env)
    assert local.exit_code == 0 and "answered in this process (no API server answers" in local.output
    s = api_settings(settings, tmp_path, auth_dev_key_path=Path(cli_env["ENGRAM_AUTH_DEV_KEY_PATH"]))
    with serve(s, app_engine) as server:
        env = {**cli_env, "ENGRAM_API_URL": server.url}
        remote = runner.invoke(app, ["recall", question, *who], env=env)
        assert remote.exit_code == 0, remote.output
        assert f"answered by the API at {server.url}" in remote.output
        # The same evidence either way (the rendered string on stdout, after the line saying
        # the path; log lines of the process's background threads go to stderr).
        start = "Relevant memory for:"
        assert remote.stdout[remote.stdout.index(start):] == local.stdout[local.stdout.index(start):]
        assert "capped" not in remote.output
        # Either path names the answer's receipt; the answer saved to a file (as `> FILE`
        # saves it, line break and all) is proven by it, and a changed copy is not. The
        # server chains its receipts in the background: chain them now (twice is a no-op).
        from orchestrator.audit.receipts import chain_receipts

        with app_engine.begin() as conn:
            chain_receipts(conn)
        for answer in (local, remote):
            receipt = re.search(r"receipt ([0-9a-f-]{36}) \(`engram audit receipt \1 --rendered "
                                r"FILE` proves a saved copy of this answer\)", answer.stderr)
            assert receipt is not None, answer.stderr
            saved = tmp_path / "answer.txt"
            saved.write_text(answer.stdout[answer.stdout.index(start):])
            proof = runner.invoke(app, ["audit", "receipt", receipt[1], "--rendered", str(saved)],
                                  env=cli_env)
            assert proof.exit_code == 0 and "MATCHES" in proof.output, proof.output
            saved.write_text(answer.stdout[answer.stdout.index(start):].replace("4,200", "4,100"))
            forged = runner.invoke(app, ["audit", "receipt", receipt[1], "--rendered", str(saved)],
                                   env=cli_env)
            assert forged.exit_code == 1 and "rendered text given does not match" in forged.output
        traced = runner.invoke(app, ["trace", question, *who], env=env)
        assert traced.exit_code == 0 and "1. candidate pools" in traced.output, traced.output
        assert "7. rendered" in traced.output and "board.md" not in traced.output
        prepared = runner.invoke(app, ["prepare", question, *who], env=env)
        assert prepared.exit_code == 0 and "## Relevant evidence" in prepared.output
        # Too small a budget says what budget would serve something, either path.
        for extra in ([], ["--local"]):
            for what in ("recall", "prepare"):
                tight = runner.invoke(app, [what, question, *who, "--budget", "10", *extra],
                                      env=env)
                assert tight.exit_code == 0, tight.output
                assert re.search(r"\(no evidence fits within 10 tokens: evidence matched, and "
                                 r"the first item needs a budget of at least \d+ tokens\)",
                                 tight.output), tight.output
        # The server's refusals reach the user as errors; --local skips the server.
        bad = runner.invoke(app, ["recall", "   ", *who], env=env)
        assert bad.exit_code == 2 and "the question is empty" in bad.output
        forced = runner.invoke(app, ["recall", question, *who, "--local"], env=env)
        assert forced.exit_code == 0 and "answered in this process (--local" in forced.output
        # A token that expired an hour ago (ENGRAM_TOKEN, an hour after the quickstart): the
        # server's refusal and the process's say when, and where a new one comes from.
        now = int(time.time())
        stale = mint_token(s, tenant=t.org_id, user="alice", scopes=["read:team"],
                           extra={"iat": now - 7200, "nbf": now - 7200, "exp": now - 3600})
        for extra in ([], ["--local"]):
            refused = runner.invoke(app, ["recall", question, *extra],
                                    env={**env, "ENGRAM_TOKEN": stale})
            assert refused.exit_code != 0 and "the token has expired (at " in refused.output
            assert "60 min ago" in refused.output or "59 min ago" in refused.output, refused.output
            assert "engram auth token --tenant ORG" in refused.output, refused.output
        # An error message stored as the token (`export ENGRAM_TOKEN=$(engram auth token
        # --bad-option)` keeps the error box): refused with what is wrong, no traceback.
        boxed = "\u256d\u2500 Error \u2500\u256e No such option: --org"
        for extra in ([], ["--local"]):
            garbled = runner.invoke(app, ["recall", question, *extra],
                                    env={**env, "ENGRAM_TOKEN": boxed})
            assert garbled.exit_code == 1, garbled.output
            assert "the bearer token is not a well-formed JWT" in garbled.output, garbled.output
            assert garbled.exception is None or isinstance(garbled.exception, SystemExit)


def test_the_cli_prints_the_rendered_string_exactly(cli_env, tenant_factory, app_engine, embedder,
                                                     settings):
    """Square brackets are text, not Rich markup: code, links and ``[bold]`` in an excerpt and
    in the question reach the terminal as the recall rendered them (``[p.gql(...)]`` used to
    vanish from ``engram recall``'s output); ``:x:`` is no emoji code (``root:x:0:0`` printed
    as ``root❌0:0``)."""
    from orchestrator.recall.service import Recaller

    t = tenant_factory("team")
    body = ('Register the surface: register("graphql recallTrace", lambda p: [p.gql(q)]).\n'
            "Then [bold]shout[/bold] and see [the docs](https://example.org) [red] or [/x].\n"
            "The passwd line root:x:0:0:root:/root:/bin/bash, and :smile: stays text.")
    write_documents(app_engine, t.identity(write=("team",)), embedder,
                    [doc("surfaces.md", "Surfaces", body)], settings)
    question = "how do I register [p.gql] surfaces?"
    runner = CliRunner()
    who = ["--org", t.org_id, "--as", "alice", "--read", "team"]
    printed = runner.invoke(app, ["recall", question, *who], env=cli_env)
    assert printed.exit_code == 0, printed.output
    assert "lambda p: [p.gql(q)])" in printed.stdout
    assert "[bold]shout[/bold]" in printed.stdout and "[red] or [/x]" in printed.stdout
    # Not Rich's emoji codes either (":x:" printed as a red cross).
    assert "root:x:0:0:root" in printed.stdout and ":smile: stays" in printed.stdout
    assert f"Relevant memory for: {question}" in printed.stdout
    # Exactly the string recall renders for the same identity, nothing dropped or added.
    rendered = Recaller(app_engine, settings, embedder=embedder).recall(
        t.identity(read=("team",)), question).rendered
    assert rendered.strip() in printed.stdout
    traced = runner.invoke(app, ["trace", question, *who], env=cli_env)
    assert traced.exit_code == 0 and "lambda p: [p.gql(q)])" in traced.stdout
    # An error message quoting the input keeps its brackets too.
    bad = runner.invoke(app, ["trace", question, *who, "--mode", "[bold]psychic"], env=cli_env)
    assert bad.exit_code == 2 and "[bold]psychic" in bad.output, bad.output


def test_text_printed_to_a_terminal_cannot_drive_it_and_a_pipe_gets_every_byte():
    """An excerpt holding ESC [2J (clear the screen) or ESC ]0;...BEL (retitle the window):
    on a terminal the CLI shows each control character as its picture, same length, and
    styled labels keep their style; into a pipe the bytes are written as recall rendered
    them (a program reading the output gets the prompt-ready string exactly)."""
    import io

    from rich.text import Text

    from orchestrator.cli.output import VerbatimConsole, printable, styled

    hostile = "Cargo\x1b[2J notes\x1b]0;pwned\x07 \x9b1m done\r\n ok\roverwritten\ttab"
    assert printable(hostile) == ("Cargo\u241b[2J notes\u241b]0;pwned\u2407 \ufffd1m done\r\n"
                                  " ok\u240doverwritten\ttab")
    assert printable("\u202eevil.md\u2066x\u2069") == "\ufffdevil.md\ufffdx\ufffd"  # bidi
    for terminal in (True, False):
        out = io.StringIO()
        con = VerbatimConsole(file=out, force_terminal=terminal, color_system=None,
                              markup=False, highlight=False, soft_wrap=True)
        con.print(hostile)
        label = styled("error: ", "bold red", hostile)
        con.print(label)
        printed = out.getvalue()
        if terminal:
            assert not any(c in printed for c in "\x1b\x07\x9b\r"), repr(printed)
            assert printed.count("Cargo\u241b[2J notes\u241b]0;pwned") == 2
        else:
            assert printed.count("Cargo\x1b[2J notes\x1b]0;pwned") == 2, repr(printed)
        assert isinstance(label, Text) and "\x1b" in label.plain, "the caller's Text is untouched"


def test_whoami_binds_the_token_in_the_database(cli_env, tenant_factory):
    """A token's signature says nothing of whether its organization and scopes exist: whoami
    binds it as every request does and says which the database refuses (exit 1)."""
    t = tenant_factory("team")
    runner = CliRunner()

    def whoami(tenant: str, scopes: str) -> tuple[int, str]:
        minted = runner.invoke(app, ["auth", "token", "--tenant", tenant, "--user", "ann",
                                     "--scopes", scopes], env=cli_env)
        assert minted.exit_code == 0, minted.output
        result = runner.invoke(app, ["auth", "whoami", "--token", minted.output.strip()], env=cli_env)
        return result.exit_code, result.output

    code, output = whoami(t.org_id, "read:team,write:team")
    assert code == 0 and "database: accepts it" in output, output
    code, output = whoami(t.org_id, "read:team,read:board")
    assert code == 1 and "read: board, team" in output, output
    assert "the database refuses this identity: unknown scope(s)" in output and "board" in output
    code, output = whoami(f"{t.org_id}-gone", "read:team")
    assert code == 1 and "unknown tenant (organization)" in output, output


def test_the_cli_imports_a_command_only_when_it_runs():
    """`engram recall` with a server running asks it over HTTP: importing every command's
    module (ingest, derive, audit, the recall package, SQLAlchemy) took more than a second of
    its two (issue 17, item 5; 2.4-2.7 s wall on a slow core, 1.0-1.3 s after). A command of
    ``_LAZY`` is imported when it runs; the help still lists and describes every command, and
    each one's own help works."""
    import subprocess
    import sys

    from orchestrator.cli.main import _LAZY

    probe = ("import sys\n"
             "from typer.main import get_command\n"
             "from orchestrator.cli.main import app\n"
             "group = get_command(app)\n"
             "cmd = group.get_command(None, 'recall')\n"
             "assert cmd is not None and cmd.name == 'recall', cmd\n"
             "print(sorted(m for m in ('sqlalchemy', 'psycopg', 'orchestrator.recall', "
             "'orchestrator.cli.ingest', 'orchestrator.cli.derive', 'numpy') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    runner = CliRunner()
    listed = runner.invoke(app, ["--help"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    for name in _LAZY:
        assert f" {name} " in listed.output, name
        own = runner.invoke(app, [name, "--help"], terminal_width=200)
        assert own.exit_code == 0 and "Usage:" in own.output, (name, own.output)
    assert "Recall evidence for QUESTION" in listed.output
    assert "Tokens: the local development key" in listed.output
