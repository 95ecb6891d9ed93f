"""``engram ingest`` end to end: the real CLI against the session database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from orchestrator.audit import chain
from orchestrator.auth.devkey import create_dev_key
from orchestrator.cli.ingest import SourceFile, discover, parse_front_matter, to_document, with_summary
from orchestrator.cli.main import app
from orchestrator.config import Settings
from orchestrator.errors import BadInput
from tests.conftest import TenantFixture
from tests.support.provenance import auditor_engine  # noqa: F401

Tenants = Callable[..., TenantFixture]


@pytest.fixture(scope="module")
def cli_env(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    key = tmp_path_factory.mktemp("ingest-auth") / "dev-signing-key.pem"
    env = {"ENGRAM_HOME": str(settings.home), "ENGRAM_DB_PORT": str(settings.db_port),
           "ENGRAM_DB_NAME": settings.db_name, "ENGRAM_AUTH_DEV_KEY_PATH": str(key),
           "ENGRAM_AUTH_TRUST_DEV_KEY": "true"}
    for name in ("database_url", "app_password"):
        value = getattr(settings, name)
        if value:
            env[f"ENGRAM_{name.upper()}"] = value
    create_dev_key(Settings(home=settings.home, auth_dev_key_path=key))
    return env


def run(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def counts(admin_engine: Engine, t: TenantFixture) -> tuple[int, int, int]:
    with admin_engine.connect() as conn:
        return tuple(int(conn.execute(text(f"select count(*) from {table} where tenant_id = :t"),  # type: ignore[return-value]
                                      {"t": t.id}).scalar_one())
                     for table in ("sources.documents", "sources.chunks", "provenance.events"))


def titles(admin_engine: Engine, t: TenantFixture) -> dict[str, str]:
    """The tenant's documents' titles by path."""
    with admin_engine.connect() as conn:
        return dict(conn.execute(text("select path, title from sources.documents "  # type: ignore[arg-type]
                                      "where tenant_id = :t"), {"t": t.id}).all())


def folder(root: Path, files: dict[str, str]) -> Path:
    """``root`` made, with ``files`` (name: text) written in it."""
    root.mkdir()
    for name, body in files.items():
        (root / name).write_text(body)
    return root


def chunk_ids(admin_engine: Engine, t: TenantFixture) -> dict[str, set[str]]:
    with admin_engine.connect() as conn:
        rows = conn.execute(text(
            "select d.path, c.id::text from sources.chunks c join sources.documents d "
            "on d.tenant_id = c.tenant_id and d.id = c.document_id where c.tenant_id = :t"),
            {"t": t.id}).all()
    found: dict[str, set[str]] = {}
    for path, cid in rows:
        found.setdefault(path, set()).add(cid)
    return found


def make_tree(root: Path, n: int = 200) -> None:
    for i in range(n):
        folder = root / f"part{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        if i % 3 == 0:
            text_ = (f"---\nkind: project\nstate: Active\narea: Area {i % 5}\nscopes: [team]\n"
                     f"owner: person{i}\n---\n# Project {i}\n\nProject {i} is about topic {i}. " * 1)
            (folder / f"project{i}.md").write_text(text_ + "Details. " * 40)
        elif i % 3 == 1:
            (folder / f"note{i}.md").write_text(f"Preamble.\n\n## Note heading {i}\n\n" + "Words. " * 60)
        else:
            (folder / f"plain{i}.txt").write_text(f"Plain text file {i}. " * 30)
    (root / ".hidden").mkdir(exist_ok=True)
    (root / ".hidden" / "skip.md").write_text("# hidden\n")
    (root / "image.png").write_bytes(b"\x89PNG not text")


def test_folder_ingest_reingest_edit_and_sync(cli_env: dict[str, str], tmp_path: Path,
                                              tenant_factory: Tenants, admin_engine: Engine,
                                              auditor_engine: Engine) -> None:  # noqa: F811
    t = tenant_factory("team")
    root = tmp_path / "notes"
    make_tree(root)
    args = ("ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team", "--user", "ingester")
    code, output = run(cli_env, *args)
    assert code == 0, output
    assert "200 files" in output and "200 created, 0 updated, 0 unchanged, 0 deleted, 0 failed" in output
    # Not a terminal: no progress bar in the output; the summary says the rate instead.
    assert "ingesting" not in output and re.search(r"chunks written \(\d+ chunks/s\)", output), output
    docs, chunks, events = counts(admin_engine, t)
    assert docs == 200 and chunks >= 200
    with admin_engine.connect() as conn:
        rows = {r.path: r for r in conn.execute(text(
            "select path, collection, title, kind, state, area, metadata, author, body "
            "from sources.documents where tenant_id = :t"), {"t": t.id})}
    project = rows["part0/project0.md"]
    assert (project.collection, project.title, project.kind, project.state, project.area) == \
        ("notes", "Project 0", "project", "Active", "Area 0")
    assert project.metadata == {"owner": "person0"} and not project.body.startswith("---")
    assert project.author == "ingester"
    assert rows["part1/note1.md"].title == "Note heading 1"
    assert rows["part2/plain2.txt"].title == "plain2" and rows["part2/plain2.txt"].kind == "note"
    assert not any("hidden" in p or p.endswith(".png") for p in rows)

    code, output = run(cli_env, *args)
    assert code == 0 and "0 created, 0 updated, 200 unchanged" in output and "0 chunks written" in output
    assert counts(admin_engine, t) == (docs, chunks, events)  # not one row, not one chain event

    before = chunk_ids(admin_engine, t)
    (root / "part1" / "note1.md").write_text("# Edited note\n\n" + "New words. " * 300)
    code, output = run(cli_env, *args)
    assert code == 0 and "0 created, 1 updated, 199 unchanged" in output
    after = chunk_ids(admin_engine, t)
    assert after["part1/note1.md"].isdisjoint(before["part1/note1.md"])
    assert {p: ids for p, ids in after.items() if p != "part1/note1.md"} == \
        {p: ids for p, ids in before.items() if p != "part1/note1.md"}

    (root / "part2" / "plain2.txt").unlink()
    code, output = run(cli_env, *args)
    assert code == 0 and "199 unchanged, 0 deleted" in output  # no --sync: kept
    code, output = run(cli_env, *args, "--sync")
    assert code == 0 and "199 unchanged, 1 deleted" in output
    assert counts(admin_engine, t)[0] == 199

    with auditor_engine.connect() as conn:
        reports = chain.verify(conn, t.id)
    assert len(reports) == 1 and reports[0].ok and reports[0].checked > events


def test_bad_files_are_reported_and_lose_nothing_else(cli_env: dict[str, str], tmp_path: Path,
                                                      tenant_factory: Tenants,
                                                      admin_engine: Engine) -> None:
    t = tenant_factory("team")
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nFine.")
    (root / "latin1.txt").write_bytes("Le caf\xe9 ouvre \xe0 huit heures.".encode("latin-1"))
    (root / "open.md").write_text("---\nkind: note\nno end of front matter\n")
    (root / "scope.md").write_text("---\nscopes: [nosuch]\n---\nBody.")
    (root / "photo.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8")
    # No text: a vault's "Untitled.md", a page of front matter alone. Left out, not failed.
    (root / "Untitled.md").write_text("")
    (root / "blank.txt").write_text("  \n\n")
    (root / "meta.md").write_text("---\ntitle: Only keys\ntags: [a]\n---\n")
    args = ("ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    code, output = run(cli_env, *args)
    assert code == 1
    assert "1 created" in output and "4 failed" in output and "; 1 chunk written" in output
    assert "latin1.txt: not UTF-8 text (invalid continuation byte at byte 6: b'Le caf\\xe9 ouvre " \
        "'); if it is written in another encoding, --encoding names it" in output, output
    assert "unknown scope(s) in this tenant: nosuch" in output
    assert "photo.md: not text (a NUL byte at byte 8: a binary file under a text file's name?)" \
        in output, output
    assert "open.md" in output
    assert "3 empty files left out (Untitled.md, blank.txt, meta.md)" in output, output
    assert "Untitled.md:" not in output  # not listed as a failure
    assert counts(admin_engine, t)[0] == 1
    # Named, the encoding reads the file that is not UTF-8; UTF-8 files are read as before.
    code, output = run(cli_env, *args, "--encoding", "cp1252")
    assert "1 created, 0 updated, 1 unchanged" in output and "3 failed" in output, output
    assert "photo.md: not text (a NUL byte" in output, output  # binary in cp1252 too
    with admin_engine.connect() as conn:
        body = conn.execute(text("select body from sources.documents where tenant_id = :t and "
                                 "path = 'latin1.txt'"), {"t": t.id}).scalar_one()
    assert body == "Le caf\u00e9 ouvre \u00e0 huit heures."
    for name, why in (("nope", "no text encoding Python knows"),
                      ("base64", "no text encoding (it converts bytes to bytes)")):
        code, output = run(cli_env, *args, "--encoding", name)
        assert code == 2 and f"--encoding '{name}' is {why}" in output, output
    # A folder of empty files only is no failure.
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    (quiet / "Untitled.md").write_text("")
    code, output = run(cli_env, "ingest", str(quiet), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 0 and "0 failed" in output and "1 empty file left out (Untitled.md)" in output


@pytest.mark.parametrize(("data", "body"), [
    ("# Caf\u00e9\r\n\r\nLine one.\r\nLine two.\r\n".encode("utf-16"),
     "# Caf\u00e9\n\nLine one.\nLine two.\n"),
    (b"\xfe\xff" + "# Menu\n\nTea.".encode("utf-16-be"), "# Menu\n\nTea."),
    ("# Menu\n\nTea.".encode("utf-32"), "# Menu\n\nTea."),
    (b"\xef\xbb\xbf# Menu\r\n\r\nTea.\r\n", "# Menu\n\nTea.\n"),
    (b"# Old Mac\r\rText.\r", "# Old Mac\n\nText.\n"),
])
def test_a_byte_order_mark_names_the_encoding_and_line_breaks_are_newlines(
        tmp_path: Path, data: bytes, body: str) -> None:
    """Windows' Notepad saves "Unicode" as UTF-16 with its byte order mark (refused as "not
    UTF-8" before); a CRLF file kept its \\r in every chunk and rendered excerpt."""
    f = tmp_path / "page.md"
    f.write_bytes(data)
    doc = to_document(SourceFile(f, "notes", "page.md"), ["team"])
    assert doc.body == body
    # Without its mark, UTF-16 is named by --encoding (its NUL bytes are no sign of binary).
    bare = tmp_path / "bare.md"
    bare.write_bytes("# Caf\u00e9\r\n\r\nTh\u00e9.".encode("utf-16-le"))
    with pytest.raises(BadInput, match="not text \\(a NUL byte at byte 1"):
        to_document(SourceFile(bare, "notes", "bare.md"), ["team"])
    assert to_document(SourceFile(bare, "notes", "bare.md"), ["team"],
                       encoding="utf-16-le").body == "# Caf\u00e9\n\nTh\u00e9."
    broken = tmp_path / "broken.md"
    broken.write_bytes(b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8")  # a lone surrogate
    with pytest.raises(BadInput, match="not UTF-16-LE text though it opens with that byte order mark"):
        to_document(SourceFile(broken, "notes", "broken.md"), ["team"])


def test_symbolic_links_are_left_out_unless_followed(cli_env: dict[str, str], tmp_path: Path,
                                                     tenant_factory: Tenants,
                                                     admin_engine: Engine) -> None:
    """A link in a notes folder to /etc/passwd put that file into the tenant's memory (and a
    link to a folder was silently not entered). Links are now counted and left out;
    ``--follow-links`` reads them, and a link back into a folder walked is not entered
    again."""
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.md").write_text("# Secret\n\nNot for the notes.")
    (outside / "deep" / "page.md").write_text("# Page\n\nElsewhere.")
    root = tmp_path / "notes"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# A\n\nMine.")
    (root / "secret.md").symlink_to(outside / "secret.md")
    (root / "elsewhere").symlink_to(outside)
    (root / "same.md").symlink_to(root / "a.md")
    (root / "loop").symlink_to(root)
    (root / "sub" / "up").symlink_to(Path(".."))
    found = discover([root], None)
    assert [f.path for f in found.files] == ["a.md"]
    assert found.links == {"notes": ["elsewhere", "loop", "same.md", "secret.md", "sub/up"]}
    followed = discover([root], None, follow_links=True)
    assert [f.path for f in followed.files] == ["a.md", "elsewhere/deep/page.md",
                                                "elsewhere/secret.md", "same.md", "secret.md"]
    assert followed.links == {}
    # A path given is read either way: the user named it.
    assert [f.path for f in discover([root / "secret.md"], None).files] == ["secret.md"]
    # Written with --follow-links, then synced without: a link left out is not a file gone.
    t = tenant_factory("team")
    args = ("ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    code, output = run(cli_env, *args, "--follow-links")
    assert code == 0 and "5 created" in output and "symbolic link" not in output, output
    code, output = run(cli_env, *args, "--sync")
    assert code == 0 and "1 unchanged, 0 deleted" in output, output
    assert "5 symbolic links left out (--follow-links reads what they point to)" in output
    assert counts(admin_engine, t)[0] == 5
    # A file gone is gone, and so is a link whose file is gone (same.md pointed at a.md).
    (root / "a.md").unlink()
    code, output = run(cli_env, *args, "--sync")
    assert code == 0 and "2 deleted" in output and counts(admin_engine, t)[0] == 3, output


def test_files_that_are_not_markdown_or_text_are_counted_as_left_out(
        cli_env: dict[str, str], tmp_path: Path, tenant_factory: Tenants,
        admin_engine: Engine) -> None:
    """A folder of docs with its images: the summary says what it did not read, and why."""
    t = tenant_factory("team")
    root = tmp_path / "docs"
    (root / "img").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "guide.md").write_text("# Guide\n\nRead me.")
    for name in ("img/a.png", "img/b.PNG", "img/c.svg", "Makefile", ".git/config", ".hidden.png"):
        (root / name).write_bytes(b"\x89PNG not text")
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 0, output
    assert "1 file in" in output and "1 created" in output, output
    assert ("4 files left out, not Markdown, reStructuredText, HTML or text (.md, .markdown, "
            ".txt, .rst, .rest, .html, .htm, or a README, NEWS, ... without a suffix; each also "
            "gzip-compressed as .gz): 2 .png, 1 .svg, 1 (no suffix)") in " ".join(
                output.split()), output
    assert counts(admin_engine, t)[0] == 1
    # Nothing left out: nothing said.
    (root / "img" / "a.png").unlink()
    for name in ("img/b.PNG", "img/c.svg", "Makefile"):
        (root / name).unlink()
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 0 and "left out" not in output and "1 unchanged" in output, output


def test_gitignore_leaves_out_build_output_as_git_does(cli_env: dict[str, str], tmp_path: Path,
                                                       tenant_factory: Tenants) -> None:
    """A Sphinx project after a build holds a copy of every page in _build (``.rst.txt``
    sources beside the HTML): ingesting its docs folder read each page twice. The
    .gitignore files of the folder, of the folders inside it and of those above it up to the
    git checkout's top leave files and folders out as git does (a deeper file's ``!`` wins);
    ``--no-ignore`` reads them."""
    repo = tmp_path / "repo"
    docs = repo / "docs"
    (repo / ".git").mkdir(parents=True)
    (repo / ".gitignore").write_text("docs/_generated/\n")
    for name in ("index.rst", "_build/html/_sources/index.rst.txt", "_generated/api.md",
                 "notes/draft.md", "notes/keep.md", "notes/old/a.md", "node_modules/x/README.md"):
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text("Page\n====\n\nText.\n")
    (docs / ".gitignore").write_text("_build/\nnode_modules/\n# drafts\nnotes/*.md\n")
    (docs / "notes" / ".gitignore").write_text("!keep.md\nold/\n")
    found = discover([docs], None)
    assert [f.path for f in found.files] == ["index.rst", "notes/keep.md"]
    # _build, node_modules, _generated (the checkout's file), old; draft.md (docs' notes/*.md)
    assert found.ignored == 5
    assert len(discover([docs], None, gitignore=False).files) == 7
    # Outside a git checkout the folder's own files still count; above it, nothing is read.
    (repo / ".git").rmdir()
    assert [f.path for f in discover([docs], None).files] == [
        "_generated/api.md", "index.rst", "notes/keep.md"]
    t = tenant_factory("team")
    code, output = run(cli_env, "ingest", str(docs), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 0 and "3 created" in output, output
    assert "4 files or folders ignored by .gitignore (--no-ignore reads them)" in " ".join(
        output.split()), output
    code, output = run(cli_env, "ingest", str(docs), "--no-ignore", "--tenant", t.org_id,
                       "--scopes", "write:team")
    assert code == 0 and "4 created, 0 updated, 3 unchanged" in output and "ignored" not in output


def test_restructured_text_is_stored_as_markdown(cli_env: dict[str, str], tmp_path: Path,
                                                tenant_factory: Tenants, admin_engine: Engine) -> None:
    """A Sphinx folder: each page's first section title is its title, its leading fields are
    its front matter, its literal blocks are fenced code; a page that only includes others is
    refused with the reason, and the rest are written."""
    t = tenant_factory("team")
    root = tmp_path / "sphinx"
    (root / "cli").mkdir(parents=True)
    (root / "cli" / "pip_install.rst").write_text(
        ":date: 2026-11-02\n:kind: reference\n\n.. _`pip install`:\n\n===========\npip install\n"
        "===========\n\nUsage\n=====\n\nInstall from a requirements file::\n\n"
        "   python -m pip install -r requirements.txt\n\n.. note:: See :doc:`../topics/vcs`.\n")
    (root / "vendoring.rst").write_text(".. include:: ../../src/pip/_vendor/README.rst\n")
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 1, output
    assert "1 created" in output and "1 failed" in output, output
    assert ("vendoring.rst: no text of its own: its directives generate the page (toctree, ...) "
            "or include files not followed: ../../src/pip/_vendor/README.rst (outside the folder "
            "ingested)") in " ".join(output.split()), output
    with admin_engine.connect() as conn:
        doc = conn.execute(text("select path, title, kind, occurred_at, body from sources.documents "
                                "where tenant_id = :t"), {"t": t.id}).one()
    assert (doc.path, doc.title, doc.kind) == ("cli/pip_install.rst", "pip install", "reference")
    assert doc.occurred_at == datetime(2026, 11, 2, tzinfo=UTC)
    assert doc.body == ("# pip install\n\n## Usage\n\nInstall from a requirements file:\n\n```\n"
                        "python -m pip install -r requirements.txt\n```\n\n"
                        "**Note:** See ../topics/vcs.\n")


def test_gzip_compressed_pages_are_read_and_bad_or_oversized_ones_refused_unread(
        cli_env: dict[str, str], tmp_path: Path, tenant_factory: Tenants, admin_engine: Engine,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian ships its packages' docs gzip-compressed (/usr/share/doc/*/README.md.gz: 143 on
    this machine were "left out, not Markdown"). They are read as what is under the .gz; a
    file that is no gzip, or one whose text cannot fit a document, is refused by name and
    the rest are ingested."""
    import gzip

    t = tenant_factory("team")
    root = tmp_path / "doc"
    root.mkdir()
    (root / "README.md.gz").write_bytes(gzip.compress(b"# zstd\n\nFast compression, by Meta.\n"))
    (root / "2026-12-01.txt.gz").write_bytes(gzip.compress(b"Standup: shipped the fix.\n"))
    (root / "guide.rst.gz").write_bytes(gzip.compress(b"Guide\n=====\n\nUse ``zstd -19``.\n"))
    (root / "broken.md.gz").write_bytes(b"# not gzip at all")
    (root / "data.tar.gz").write_bytes(gzip.compress(b"binary"))
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    flat = " ".join(output.split())
    assert code == 1 and "3 created" in flat and "1 failed" in flat, output
    assert "broken.md.gz: not a readable gzip file" in flat, output
    assert "1 file left out" in flat and "1 .gz" in flat, output  # the tarball
    with admin_engine.connect() as conn:
        docs = dict(conn.execute(text(
            "select path, title || ' | ' || body from sources.documents where tenant_id = :t"),
            {"t": t.id}).all())
        day = conn.execute(text("select occurred_at from sources.documents where path = '2026-12-01.txt.gz' "
                                "and tenant_id = :t"), {"t": t.id}).scalar_one()
    assert docs["README.md.gz"].startswith("zstd | # zstd")
    assert docs["guide.rst.gz"].startswith("Guide | # Guide") and "`zstd -19`" in docs["guide.rst.gz"]
    assert docs["2026-12-01.txt.gz"].startswith("2026-12-01 | Standup")  # named by its day
    assert day == datetime(2026, 12, 1, tzinfo=UTC)

    # Past what a document may hold: refused from its size (plain) or as it decompresses,
    # never read whole (a 5 GB log in a notes folder was read into memory before).
    limit = 1000
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:
        fh.truncate(4 * limit + 1)  # sparse: its size says enough
    read_whole: list[Path] = []
    real_read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read_whole.append(self) or real_read_bytes(self))
    with pytest.raises(BadInput, match=r"4,001 bytes: longer than a document may be \(1,000 characters"):
        to_document(SourceFile(big, "notes", "big.txt"), ["team"], max_document_chars=limit)
    assert read_whole == []
    bomb = tmp_path / "bomb.md.gz"
    bomb.write_bytes(gzip.compress(b"a" * 100_000))
    with pytest.raises(BadInput, match="decompresses to more than 4,000 bytes"):
        to_document(SourceFile(bomb, "notes", "bomb.md.gz"), ["team"], max_document_chars=limit)
    # Unreadable (gone since the walk, no permission): that file fails by name, not the run.
    monkeypatch.setattr(Path, "read_bytes", real_read_bytes)
    gone = SourceFile(tmp_path / "gone.md", "notes", "gone.md")
    with pytest.raises(BadInput, match="cannot be read \\(No such file or directory\\)"):
        to_document(gone, ["team"])
    fits = tmp_path / "fits.md.gz"
    fits.write_bytes(gzip.compress(("é" * 999).encode()))  # 1,998 bytes, 999 characters
    assert to_document(SourceFile(fits, "notes", "fits.md.gz"), ["team"],
                       max_document_chars=limit).body == "é" * 999


def test_a_hidden_folder_is_never_entered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout's .git (or .venv) can hold far more files than its documents: discovery
    lists neither its files nor its folders, and still finds what lies beside it."""
    root = tmp_path / "repo"
    (root / ".git" / "objects" / "ab").mkdir(parents=True)
    (root / ".git" / "objects" / "ab" / "notes.md").write_text("# not a document")
    (root / "docs" / ".cache").mkdir(parents=True)
    (root / "docs" / ".cache" / "page.md").write_text("# cached")
    (root / "docs" / "guide.md").write_text("# Guide")
    (root / "README.md").write_text("# Readme")
    (root / ".notes.md").write_text("# hidden file")
    listed: list[str] = []
    scandir = os.scandir

    def recording(path: Any = ".") -> Any:
        listed.append(Path(path).relative_to(root).as_posix())
        return scandir(path)

    monkeypatch.setattr(os, "scandir", recording)
    found = discover([root], None)
    assert [f.path for f in found.files] == ["README.md", "docs/guide.md"]
    assert found.folders == {"repo": {"README.md", "docs/guide.md"}} and not found.left_out
    assert sorted(listed) == [".", "docs"], listed


def test_identity_comes_from_a_verified_token(cli_env: dict[str, str], tmp_path: Path,
                                              tenant_factory: Tenants, admin_engine: Engine) -> None:
    t = tenant_factory("team")
    (tmp_path / "a.md").write_text("# A\n\nBody.")
    code, output = run(cli_env, "auth", "token", "--tenant", t.org_id, "--scopes", "read:team")
    assert code == 0
    reader = output.strip()
    code, output = run({**cli_env, "ENGRAM_TOKEN": reader}, "ingest", str(tmp_path / "a.md"),
                       "--scope", "team")
    assert code == 1 and "0 created" in output and "1 failed" in output
    tampered = reader[:-10] + ("A" if reader[-10] != "A" else "B") + reader[-9:]
    code, output = run({**cli_env, "ENGRAM_TOKEN": tampered}, "ingest", str(tmp_path / "a.md"))
    assert code == 2 and "signature does not verify" in output
    code, output = run(cli_env, "ingest", str(tmp_path / "a.md"))
    assert code == 2 and "no identity" in output
    assert counts(admin_engine, t)[0] == 0


def test_front_matter_parsing() -> None:
    assert parse_front_matter("no block\n") == ({}, "no block\n")
    meta, body = parse_front_matter("---\nKind: project\ntitle: 'Quoted'\n# comment\n---\nBody\n")
    assert meta == {"kind": "project", "title": "Quoted"} and body == "Body\n"
    with pytest.raises(BadInput, match="line 2 is not 'key: value': 'just words'"):
        parse_front_matter("---\njust words\n---\n")
    # YAML as Jekyll, Hugo, Obsidian and model cards write it: block lists, nested keys, dates.
    meta, body = parse_front_matter(
        "---\nlanguage: en\ntags:\n- sentence-transformers\n- feature-extraction\n"
        "model:\n  dim: 384\n  ratio: .nan\ndate: 2024-01-05\nscopes: [team, board]\n---\n# Card\n")
    assert meta == {"language": "en", "tags": ["sentence-transformers", "feature-extraction"],
                    "model": {"dim": 384, "ratio": "nan"}, "date": "2024-01-05",
                    "scopes": ["team", "board"]}
    assert body == "# Card\n"
    assert parse_front_matter("---\n---\nB") == ({}, "B")
    # Plain key: value lines that YAML refuses (an unquoted colon) are read as before.
    assert parse_front_matter("---\ntitle: Budget: Q3\nowner: ann\n---\n")[0] == {
        "title": "Budget: Q3", "owner": "ann"}
    # A template's block is neither: refused with the line and YAML's reason.
    with pytest.raises(BadInput, match=r"not YAML at line 3 \('\{\{ card_data \}\}'\): could not find"):
        parse_front_matter("---\nlicense: mit\n{{ card_data }}\n---\n")
    with pytest.raises(BadInput, match=r"not YAML at line 2 \('\{\{ card_data \}\}'\): found unhashable"):
        parse_front_matter("---\n{{ card_data }}\n---\n")
    with pytest.raises(BadInput, match="line 2 is not 'key: value': '- a'.*YAML list"):
        parse_front_matter("---\n- a\n- b\n---\n")


def test_a_yaml_front_matter_becomes_the_documents_fields(tmp_path: Path) -> None:
    f = tmp_path / "card.md"
    f.write_text("---\ntitle: 2024\nscopes:\n- team\n- board\ndate: 2024-01-05 10:30:00+02:00\n"
                 "extract: no\ntags: [a, b]\nkind: project\n---\nBody text.\n")
    doc = to_document(SourceFile(f, "notes", "card.md"), ["fallback"])
    assert doc.title == "2024" and doc.scopes == ("team", "board") and doc.kind == "project"
    assert doc.occurred_at == datetime(2024, 1, 5, 8, 30, tzinfo=UTC)
    assert doc.metadata == {"tags": ["a", "b"], "extract": False} and doc.body == "Body text.\n"


def test_a_front_matter_wikilink_is_the_page_it_names(tmp_path: Path) -> None:
    """Obsidian writes a link property quoted: `area: "[[Payments]]"`; the Area catalog listed
    "[[Payments]]" beside the area note "Payments". One wikilink is the page it names (its
    folder, anchor, alias and ".md" left out); a daily note's link is its date."""
    f = tmp_path / "billing.md"
    f.write_text('---\nkind: project\nstate: Active\narea: "[[Areas/Payments.md|Pay]]"\n'
                 'date: "[[2026-03-03]]"\nscopes: [team]\n---\nBody.\n')
    doc = to_document(SourceFile(f, "vault", "billing.md"), [])
    assert (doc.kind, doc.state, doc.area) == ("project", "Active", "Payments")
    assert doc.occurred_at == datetime(2026, 3, 3, tzinfo=UTC)
    f.write_text('---\narea: "see [[Payments]] and [[Ops]]"\nscopes: [team]\n---\nBody.\n')
    assert to_document(SourceFile(f, "vault", "billing.md"), []).area == "see [[Payments]] and [[Ops]]"


def test_a_front_matter_description_opens_the_body() -> None:
    # npm's, Docusaurus's and Hugo's pages summarise themselves in the front matter.
    assert with_summary("### Synopsis\n\nnpm uninstall\n", {"description": "Remove a package"}) == \
        "Remove a package\n\n### Synopsis\n\nnpm uninstall\n"
    # After the level-1 heading that opens the body, whitespace made one paragraph.
    assert with_summary("\n# npm-run\r\n\r\nBody\n", {"description": "Run  arbitrary\n package scripts"}) \
        == "# npm-run\n\nRun arbitrary package scripts\n\nBody\n"
    assert with_summary("npm-run\n=======\nBody\n", {"description": "Run scripts"}) \
        == "npm-run\n=======\n\nRun scripts\n\nBody\n"  # a setext title
    assert with_summary("## Usage\n", {"summary": "Hugo's key"}) == "Hugo's key\n\n## Usage\n"
    assert with_summary("# Only a title", {"description": "D"}) == "# Only a title\n\nD\n"
    assert with_summary("", {"description": "D"}) == "D\n"
    assert with_summary("B\n", {"description": "D", "summary": "S"}) == "D\n\nB\n"
    # Already the first paragraph (Jekyll's excerpt), or no text: the body as it is.
    for body, meta in [("# T\n\nRemove a  package. Then more.\n", {"description": "remove a package."}),
                       ("Body\n", {"description": ["a", "b"]}), ("Body\n", {"description": True}),
                       ("Body\n", {"description": " "}), ("Body\n", {"tags": ["x"]})]:
        assert with_summary(body, meta) == body, (body, meta)
    # Said further down is not said first: the summary still opens the page.
    assert with_summary("Intro.\n\nTo remove a package, run it.\n", {"description": "Remove a package"}) \
        .startswith("Remove a package\n\nIntro.")


def test_a_page_is_found_by_the_words_of_its_front_matter_description(
        cli_env: dict[str, str], tmp_path: Path, tenant_factory: Tenants, admin_engine: Engine) -> None:
    t = tenant_factory("team")
    root = tmp_path / "npm"
    root.mkdir()
    (root / "npm-uninstall.md").write_text(
        "---\ntitle: npm-uninstall\nsection: 1\ndescription: Remove a package\n---\n\n"
        "### Synopsis\n\n```bash\nnpm uninstall [<@scope>/]<pkg>...\n```\n\n"
        "### Description\n\nThis uninstalls a package, completely deleting what npm installed.\n")
    args = ("ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team", "--user", "ingester")
    code, output = run(cli_env, *args)
    assert code == 0 and "1 created" in output, output
    with admin_engine.connect() as conn:
        row = conn.execute(text(
            "select d.metadata, c.text, c.lexical @@ plainto_tsquery('english', 'removing packages') "
            "as found from sources.documents d join sources.chunks c on c.tenant_id = d.tenant_id "
            "and c.document_id = d.id where d.tenant_id = :t and c.ordinal = 0"), {"t": t.id}).one()
    # The lexical lane finds it by the summary's word (the body says "uninstalls", "deleting").
    assert row.text.startswith("Remove a package\n\n### Synopsis") and row.found
    assert row.metadata == {"section": 1, "description": "Remove a package"}
    code, output = run(cli_env, *args)
    assert code == 0 and "0 created, 0 updated, 1 unchanged" in output, output


def test_a_file_named_by_a_day_is_dated_that_day(tmp_path: Path) -> None:
    # Daily notes (Obsidian), posts (Jekyll) and journals (Logseq) carry their day in the name.
    midnight = datetime(2026, 12, 1, tzinfo=UTC)
    for name in ("2026-12-01.md", "2026-12-01-release-notes.md", "2026_12_01.md",
                 "2026.12.01 standup.md", "2026-12-01 Heron review.md"):
        f = tmp_path / name
        f.write_text("# A day\n\nText.\n")
        assert to_document(SourceFile(f, "notes", name), ["team"]).occurred_at == midnight, name
    for name in ("2026-13-45.md", "2026-12-011.md", "2026-12_01.md", "notes 2026-12-01.md",
                 "20261201.md", "v2026-12-01.md"):
        f = tmp_path / name
        f.write_text("Text.\n")
        assert to_document(SourceFile(f, "notes", name), ["team"]).occurred_at is None, name
    # The front matter's date wins over the name's.
    f = tmp_path / "2026-12-01.md"
    f.write_text("---\ndate: 2025-03-04\n---\nText.\n")
    assert to_document(SourceFile(f, "notes", f.name), ["team"]).occurred_at == \
        datetime(2025, 3, 4, tzinfo=UTC)


def test_a_title_from_a_heading_is_its_text_as_a_reader_sees_it(tmp_path: Path) -> None:
    # A README's first heading often carries badges: the title is the words, not 600
    # characters of image links (which the write refused, so the whole file failed).
    f = tmp_path / "rustfmt.md"
    badge = "[![linux](https://github.com/o/r/actions/workflows/linux.yml/badge.svg?event=push)]" \
            "(https://github.com/o/r/actions/workflows/linux.yml)"
    f.write_text(f"```sh\n# not a heading\n```\n# rustfmt {badge * 6}\n\nA tool.\n")
    assert to_document(SourceFile(f, "notes", "rustfmt.md"), ["team"]).title == "rustfmt"
    f.write_text("## The `git` *guide* for [contributors](CONTRIBUTING.md) <br/>\nText.\n")
    assert to_document(SourceFile(f, "notes", "g.md"), ["team"]).title == \
        "The git guide for contributors"
    # A heading longer than the limit is cut at a word, with an ellipsis.
    f.write_text("# " + "tides " * 30 + "\nText.\n")
    title = to_document(SourceFile(f, "notes", "t.md"), ["team"], max_title_chars=40).title
    assert title == "tides tides tides tides tides tides\u2026" and len(title) <= 40
    # Nothing but markup in the heading: the file's name.
    f.write_text("# [![ci](https://ci.example/b.svg)](https://ci.example)\nText.\n")
    assert to_document(SourceFile(f, "notes", "t.md"), ["team"]).title == "rustfmt"
    # A title the author wrote in the front matter is taken as written.
    f.write_text("---\ntitle: The *exact* title\n---\n# Heading\n")
    assert to_document(SourceFile(f, "notes", "t.md"), ["team"]).title == "The *exact* title"
    # A byte order mark (Notepad's UTF-8) is no part of the text: it hid the heading and the
    # front matter, and stayed at the start of the body.
    f.write_bytes(b"\xef\xbb\xbf# BOM note\n\nText.\n")
    found = to_document(SourceFile(f, "notes", "t.md"), ["team"])
    assert found.title == "BOM note" and found.body.startswith("# BOM note")
    f.write_bytes(b"\xef\xbb\xbf---\ndate: 2026-12-01\n---\n# Dated\n")
    found = to_document(SourceFile(f, "notes", "t.md"), ["team"])
    assert found.title == "Dated" and found.occurred_at is not None and found.body == "# Dated\n"


@pytest.mark.parametrize(("name", "body", "title"), [
    # A plain text file's first line over a blank line titles it (the project's design notes
    # were titled "read-path" and "how-retrieval-works.pt", stop 50).
    ("read-path.txt", "The read path\n\nrecall() is the retrieval entry point.\n", "The read path"),
    ("como.pt.txt", "\nComo a recuperação funciona\n\nO pipeline híbrido.\n",
     "Como a recuperação funciona"),
    ("alone.txt", "Release checklist\n", "Release checklist"),
    # A sentence, a paragraph's first line, a list item or a long line is no title.
    ("note.txt", "Call the bank before noon.\n\nThen the landlord.\n", "note"),
    ("wrapped.txt", "The test runner reports a failure when a subtest\nis created late.\n",
     "wrapped"),
    ("list.txt", "- milk\n\n- eggs\n", "list"),
    ("long.txt", " ".join(["word"] * 13) + "\n\nText.\n", "long"),
    # In Markdown a paragraph is no title; a heading is.
    ("para.md", "The read path\n\nText.\n", "para"),
    ("head.txt", "# The heading\n\nText.\n", "The heading"),
])
def test_a_plain_text_files_title_line_titles_it(tmp_path: Path, name: str, body: str,
                                                  title: str) -> None:
    f = tmp_path / name
    f.write_text(body, encoding="utf-8")
    assert to_document(SourceFile(f, "notes", name), ["team"]).title == title


def test_remember_cli(cli_env: dict[str, str], tenant_factory: Tenants, admin_engine: Engine) -> None:
    t = tenant_factory("team")
    code, output = run(cli_env, "remember", "User prefers tea.", "--session", "s9",
                       "--tenant", t.org_id, "--scopes", "write:team", "--user", "ann")
    assert code == 0 and "remembered" in output and "in session s9 (team)" in output
    code, output = run(cli_env, "remember", "nope", "--tenant", t.org_id, "--scopes", "read:team",
                       "--scope", "team")
    assert code == 1 and "FORBIDDEN" in output
    with admin_engine.connect() as conn:
        rows = conn.execute(text("select text, session_id, user_id from memory.working_memory "
                                 "where tenant_id = :t"), {"t": t.id}).all()
    assert [tuple(r) for r in rows] == [("User prefers tea.", "s9", "ann")]


def test_the_rate_column_shows_files_and_chunks_per_second() -> None:
    from rich.progress import Progress

    from orchestrator.cli.ingest import _Rate

    now = [100.0]
    rate = _Rate()
    progress = Progress(rate, get_time=lambda: now[0])
    task_id = progress.add_task("files", total=10, chunks=0)
    task = progress.tasks[0]
    assert rate.render(task).plain == "", "not started: no rate to show"
    progress.start_task(task_id)
    now[0] = 104.0
    progress.update(task_id, advance=6, chunks=30)
    assert rate.render(task).plain == "1.5 files/s  7.5 chunks/s"


def test_the_progress_bar_is_drawn_on_a_terminal(cli_env: dict[str, str], tmp_path: Path,
                                                 tenant_factory: Tenants,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from orchestrator.cli import ingest as ingest_cli

    t = tenant_factory("team")
    root = tmp_path / "bar"
    make_tree(root, 12)
    screen = io.StringIO()
    monkeypatch.setattr(ingest_cli, "err", Console(file=screen, force_terminal=True, width=160,
                                                   color_system=None))
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 0, output
    drawn = screen.getvalue()
    assert "ingesting" in drawn and "12/12" in drawn
    assert re.search(r"\d+\.\d files/s  \d+\.\d chunks/s", drawn), drawn[-500:]


@pytest.mark.parametrize(("body", "title"), [
    ("# Title", "Title"), ("# Title ##", "Title"), ("## Title #hash", "Title #hash"),
    ("   ### Deep  ", "Deep"), ("# ###\n# Next", "Next"), ("#\nnot a heading\n# Real", "Real"),
    ("#NoSpace\n# Yes", "Yes"), ("    # indented code\n# H", "H"), ("no heading at all", ""),
    # Setext headings (a paragraph over "===" or "---"), and a level-1 heading before the
    # first heading of another level: "PyYAML" over "======" titles its README, not the
    # "## Installation" below it (13 of 116 Markdown files had no title but their name).
    ("PyYAML\n======\n\nA framework\n\n## Installation", "PyYAML"),
    ("[![CI](https://ci.example/b.svg)](https://ci.example)\n\nGit - fast\n==========\n", "Git - fast"),
    ("## Overview\n\nText.\n\nProject\n=======\n", "Project"), ("Multi\nline\n===", "Multi line"),
    ("Intro\n---\n\n## Section", "Intro"), ("- item\n---\n\n## Section", "Section"),
    ("---\nLICENSE 1.1\n---\n", "LICENSE 1.1"), ("```\nFoo\n===\n```\n## After", "After"),
    ("> quoted\n===\n", ""), ("    code\n    ===\n# T", "T"),
])
def test_the_first_heading_is_read_as_commonmark_writes_it(body: str, title: str) -> None:
    from orchestrator.cli.ingest import heading_title

    assert heading_title(body, 500) == title


def test_a_heading_with_a_long_run_of_spaces_does_not_hang_ingest() -> None:
    """The old heading pattern tried every split of a run of spaces between three whitespace
    parts: "# a", 5,000 spaces, "b" took 118 s, 8,000 about eight minutes. In a process of its
    own, so a hang fails the test instead of holding the run."""
    script = ("from orchestrator.cli.ingest import heading_title\n"
              "print(heading_title('# a' + ' ' * 8000 + 'b\\n' + 'x' * 10, 500))\n"
              # A paragraph of 200,000 lines under a setext underline, underlines alone.
              "print(len(heading_title('a\\n' * 200_000 + '===\\n', 500)))\n"
              "print(repr(heading_title('-\\n' * 200_000 + 'a\\n=\\n' * 50_000, 500)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["a b", "79", "'a'"], done.stdout


def test_a_readme_or_changelog_without_a_suffix_is_read_as_text(
        cli_env: dict[str, str], tmp_path: Path, tenant_factory: Tenants,
        admin_engine: Engine) -> None:
    """A project's README and NEWS (Debian's NEWS.gz) have no suffix: they were left out as
    "(no suffix)" with the Makefile. Read as text by their names; a licence, the same text in
    every project, a ChangeLog, mostly a dump of the version history, and a Makefile stay
    out."""
    import gzip

    t = tenant_factory("team")
    root = tmp_path / "proj"
    root.mkdir()
    (root / "README").write_text("Widget\n\nWidget renders charts from CSV files.\n")
    (root / "NEWS.gz").write_bytes(gzip.compress(b"widget 2.1\n\n* Faster CSV.\n"))
    (root / "ChangeLog").write_text("2026-01-02  Ada  <ada@example.org>\n\n\t* csv.c: Faster.\n")
    (root / "LICENSE").write_text("Permission is hereby granted, free of charge.\n")
    (root / "Makefile").write_text("all:\n\tcc widget.c\n")
    found = discover([root], None)
    assert sorted(f.path for f in found.files) == ["NEWS.gz", "README"]
    assert found.left_out == {"(no suffix)": 3}
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    flat = " ".join(output.split())
    assert code == 0 and "2 created" in flat and "3 files left out" in flat, output
    assert titles(admin_engine, t) == {"README": "Widget", "NEWS.gz": "widget 2.1"}
