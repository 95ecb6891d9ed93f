"""reStructuredText as Markdown (``orchestrator.ingest.rst``): what a Sphinx page becomes."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

from orchestrator.ingest.rst import Includes, inline, rst_document
from orchestrator.markdown import code_fences, headings


def md(text: str) -> str:
    return rst_document(dedent(text))[1]


def test_section_titles_take_their_levels_from_the_order_their_styles_first_occur() -> None:
    body = md("""\
        ===========
        pip install
        ===========

        Usage
        =====

        Text.

        Overview
        --------

        More.

        Options
        =======
        """)
    assert body == ("# pip install\n\n## Usage\n\nText.\n\n### Overview\n\nMore.\n\n"
                    "## Options\n")
    assert [(level, text) for _, level, text in headings(body, code_fences(body))] == [
        (1, "pip install"), (2, "Usage"), (3, "Overview"), (2, "Options")]


def test_an_underline_too_short_is_text_and_a_transition_is_dropped() -> None:
    body = md("""\
        Long title here
        ==

        Paragraph.

        ----------

        After.
        """)
    assert body == "Long title here\n\\==\n\nParagraph.\n\nAfter.\n"
    assert list(headings(body, code_fences(body))) == []


def test_literal_blocks_and_code_directives_are_fenced_with_their_blank_lines() -> None:
    body = md("""\
        Run it like this::

            $ pip install sampleproject


            Successfully installed

        Or this ::

            python -m pip

        .. code-block:: console
           :caption: a shell

           $ pip --version

        ::

           ====
           Not a title
           ====
        """)
    assert body == dedent("""\
        Run it like this:

        ```
        $ pip install sampleproject


        Successfully installed
        ```

        Or this

        ```
        python -m pip
        ```

        ```console
        $ pip --version
        ```

        ```
        ====
        Not a title
        ====
        ```
        """)
    assert list(headings(body, code_fences(body))) == []


def test_admonitions_and_version_notes_label_their_first_paragraph() -> None:
    body = md("""\
        .. note::

           Not enforced automatically.

        .. warning:: Do not run as root.

        .. versionadded:: 21.2 The ``--report`` option.

        .. deprecated:: 20.0

           Use ``pip inspect`` instead.

        .. seealso::

           - one
           - two
        """)
    assert body == dedent("""\
        **Note:** Not enforced automatically.

        **Warning:** Do not run as root.

        *New in version 21.2:* The ``--report`` option.

        *Deprecated since version 20.0:* Use ``pip inspect`` instead.

        **See also:**

        - one
        - two
        """)


def test_generated_and_layout_directives_comments_and_targets_leave_no_text() -> None:
    body = md("""\
        .. _`pip uninstall`:

        .. meta::

          :http-equiv=refresh: 3; url=../installation/

        .. toctree::
           :maxdepth: 2

           getting-started
           installation

        .. this is a comment
           over two lines

        .. |version| replace:: 23.0

        .. tab:: Unix/macOS

           .. pip-command-usage:: uninstall "python -m pip"

        .. tab:: Windows

           .. code-block:: console

              C:> py -m pip uninstall simplejson

        .. only:: html

           Shown in HTML.

        .. [#f1] A footnote.

        Text.
        """)
    assert body == dedent("""\
        **Windows**

        ```console
        C:> py -m pip uninstall simplejson
        ```

        Shown in HTML.

        [#f1] A footnote.

        Text.
        """)


def test_description_directives_show_their_signature_as_code() -> None:
    body = md("""\
        .. option:: --user

           Install to the user site.

        .. py:function:: main(args=None)
        """)
    assert body == "`--user`\n\nInstall to the user site.\n\n`main(args=None)`\n"


def test_inline_roles_and_links_read_as_text_or_markdown() -> None:
    assert inline(":doc:`topics/vcs-support`") == "topics/vcs-support"
    assert inline("see :ref:`here <Pre Release Versions>` and :term:`wheel`") == "see here and wheel"
    assert inline(":func:`~pip._internal.main` or :py:class:`!Foo`") == "`main` or `Foo`"
    assert inline("as in :pep:`440` and :rfc:`3986`") == "as in PEP 440 and RFC 3986"
    assert inline("use :option:`--user`") == "use `--user`"
    assert inline("`the guide <https://pip.pypa.io/>`_ and `PyPI`_") == \
        "[the guide](https://pip.pypa.io/) and PyPI"
    assert inline("`named <target_>`_, `<https://x.org>`__") == "named, https://x.org"
    # A literal span is left as written, roles and all: Markdown reads it as code too.
    assert inline("``:doc:`x` stays``") == "``:doc:`x` stays``"


def test_a_leading_field_list_is_the_files_front_matter() -> None:
    fields, body = rst_document(":orphan:\n:date: 2026-12-01\n:scopes: team,\n   ops\n\n"
                                "Title\n=====\n\n#. first\n#. second\n\n   #. inner\n\n"
                                "#. third\n\nText.\n\n#. again\n")
    assert fields == {"orphan": "", "date": "2026-12-01", "scopes": "team, ops"}
    assert body == ("# Title\n\n1. first\n2. second\n\n   1. inner\n\n3. third\n\nText.\n\n"
                    "1. again\n")
    # Windows line ends and tabs read as the same text.
    assert rst_document("Title\r\n=====\r\n\r\n\tindented\r\n")[1] == "# Title\n\n        indented\n"


def test_text_that_is_not_restructured_markup_is_kept() -> None:
    text = "Plain words, a list:\n\n- one\n- two\n\n+-----+\n| a   |\n+-----+\n"
    assert rst_document(text)[1] == text
    assert rst_document("") == ({}, "")


def test_a_parsed_literal_block_is_code_whose_references_read_as_text() -> None:
    body = md("""\
        .. parsed-literal::

          `Reading`_
            file(`READ`_ <filename> <out-var> [...])
            file(`\\<HASH\\> <HASH_>`_ <filename> <out-var>)
        """)
    assert body == ("```\nReading\n  file(READ <filename> <out-var> [...])\n"
                    "  file(<HASH> <filename> <out-var>)\n```\n")


def test_includes_are_followed_inside_the_folder_only(tmp_path) -> None:
    """``.. include::`` reads files of the folder ingested: relative to the including file,
    ``/`` from the folder, ``:literal:`` as code, cut by ``:start-after:``; never a file
    outside the folder (by ``..`` or a symlink), a hidden one, a missing one, nor deeper than
    four files (a file that includes itself stops there)."""
    root = tmp_path / "docs"
    (root / "command").mkdir(parents=True)
    (root / "include").mkdir()
    (root / ".private").mkdir()
    (tmp_path / "secret.txt").write_text("outside words\n")
    (root / ".private" / "key.txt").write_text("hidden words\n")
    (root / "command" / "FIND_XXX.txt").write_text("Finds a |SEARCH_XXX| with |FIND_XXX|.\n")
    (root / "include" / "WARNING.txt").write_text("skip me\n.. start\n\n.. note:: Shared.\n")
    (root / "command" / "example.cmake").write_text("find_library(Z z)\n")
    (root / "command" / "loop.rst").write_text("Loop.\n\n.. include:: loop.rst\n")
    (root / "command" / "link").symlink_to(tmp_path / "secret.txt")
    page = root / "command" / "find_library.rst"
    page.write_text(dedent("""\
        find_library
        ------------

        .. |FIND_XXX| replace:: ``find_library``
        .. |SEARCH_XXX| replace::
           library

        .. include:: FIND_XXX.txt

        .. include:: /include/WARNING.txt
           :start-after: .. start

        .. include:: example.cmake
           :literal:

        .. include:: ../../secret.txt
        .. include:: link
        .. include:: ../.private/key.txt
        .. include:: missing.txt
        """))
    includes = Includes(root=root, source=page)
    _, body = rst_document(page.read_text(), includes)
    assert body == ("# find_library\n\nFinds a library with ``find_library``.\n\n"
                    "**Note:** Shared.\n\n```\nfind_library(Z z)\n```\n")
    assert includes.skipped == ["../../secret.txt (outside the folder ingested)",
                                "link (outside the folder ingested)",
                                "../.private/key.txt (a hidden file)",
                                "missing.txt (no such file)"]
    loop = Includes(root=root, source=root / "command" / "loop.rst")
    _, body = rst_document((root / "command" / "loop.rst").read_text(), loop)
    assert body == "Loop.\n\nLoop.\n\nLoop.\n\nLoop.\n\nLoop.\n"
    assert loop.skipped == ["loop.rst (more than 4 includes deep)"]
    # Without an Includes, an include leaves nothing (and reads nothing).
    assert rst_document(".. include:: FIND_XXX.txt\n")[1] == ""


def test_an_include_that_loops_or_is_too_large_is_refused_unread(tmp_path, monkeypatch) -> None:
    """A symlink loop is named as one; a file past what the page may still include is
    refused by its size, before it is read."""
    from orchestrator.ingest import rst

    root = tmp_path / "docs"
    root.mkdir()
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    (root / "big.txt").write_text("x" * 50)
    page = root / "page.rst"
    text = "Text.\n\n.. include:: a\n.. include:: big.txt\n"
    page.write_text(text)
    monkeypatch.setattr(rst, "MAX_INCLUDED_CHARS", 40)
    read = []
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self) or "")
    includes = Includes(root=root, source=page)
    assert rst_document(text, includes)[1] == "Text.\n"
    assert includes.skipped == ["a (a symlink loop)", "big.txt (past 40 included characters)"]
    assert read == []
