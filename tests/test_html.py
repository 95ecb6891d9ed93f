"""HTML pages stored as Markdown (``orchestrator/ingest/html.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from orchestrator.cli.ingest import SourceFile, discover, to_document
from orchestrator.errors import BadInput
from orchestrator.ingest.html import html_document
from orchestrator.markdown import section_starts
from tests.test_ingest_cli import cli_env, folder, run, titles

__all__ = ["cli_env"]  # the CLI's environment fixture, shared with the ingest CLI's tests

# A built documentation page's shape: Sphinx's sidebar and permalinks, a Texinfo-style
# Next/Previous header, a script, a table, nested lists and two examples in one pre.
PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Installing | Widget 2.1 documentation</title>
<style>body { color: red }</style><script>var tracking = "do not read me";</script></head>
<body>
<div class="header"><p>Next: <a href="b.html">Usage</a>, Up: <a href="index.html">Top</a></p></div>
<div class="sphinxsidebar" role="navigation"><h3>Navigation</h3><ul><li>Home</li></ul></div>
<div class="body" role="main">
<h1>Installing<a class="headerlink" href="#installing" title="Link">¶</a></h1>
<p>Widget needs  <b>Python&nbsp;3.11</b> &amp; a <a href="https://example.org">C compiler</a>.
Run <code>pip install widget</code> once.</p>
<h2 id="options">Options <a href="#options">#</a></h2>
<ul><li>Fast mode<ul><li>needs <kbd>--fast</kbd></li></ul></li><li>Safe mode<br>the default</li></ul>
<ol><li>Download</li><li>Install</li></ol>
<pre><code class="language-python">import widget
if widget.ok():
    print("&lt;ok&gt;")</code><code class="language-python">widget.run()</code></pre>
<table><tr><th>Flag</th><th>Meaning</th></tr><tr><td>-v</td><td>verbose <i>output</i></td></tr></table>
<img src="x.png" alt="A diagram of the pipeline">
<p hidden>secret hidden text</p>
</div>
<footer>Copyright 2026 Widget authors</footer>
<script>document.write("late script")</script>
</body></html>
"""


def test_a_page_is_its_content_as_markdown_without_its_furniture() -> None:
    fields, body = html_document(PAGE)
    assert fields == {"title": "Installing"}  # the <title> is the h1 and the site's name
    assert body.startswith("# Installing\n\nWidget needs Python 3.11 & a C compiler. Run "
                           "`pip install widget` once.\n\n## Options\n\n")
    assert "- Fast mode\n\n  - needs `--fast`\n\n- Safe mode\n  the default" in body
    assert "1. Download\n\n2. Install" in body
    assert ('```python\nimport widget\nif widget.ok():\n    print("<ok>")\nwidget.run()\n```'
            in body)
    assert "| Flag | Meaning |\n| --- | --- |\n| -v | verbose output |" in body
    assert "A diagram of the pipeline" in body
    for furniture in ("Next:", "Navigation", "Home", "tracking", "late script", "Copyright",
                      "secret", "¶", "color: red"):
        assert furniture not in body, furniture
    assert section_starts(body) == [0, body.index("## Options")]


def test_without_a_marked_main_the_body_is_read_and_broken_markup_reads_as_text() -> None:
    fields, body = html_document("<title>Notes</title><p>One <b>two<p>Three</i> four</div>"
                                 "<ul><li>a<li>b</ul><h3>Late</h3>tail")
    assert fields == {"title": "Notes"}
    assert body == "One two\n\nThree four\n\n- a\n\n- b\n\n### Late\n\ntail\n"
    assert html_document("<html><body><script>x()</script></body></html>") == ({}, "")
    # No <title>: the first h1 titles it, never an inline SVG icon's <title>.
    assert html_document("<h1>Only a heading</h1><p>text</p>")[0] == {"title": "Only a heading"}
    assert html_document('<body><svg><title>Copy</title></svg><h1>Guide</h1><p>x</p>')[0] == {
        "title": "Guide"}
    # A title that is the first heading and the site's name (Node.js's API pages open with an
    # h2); one that only shares words with it stays whole.
    assert html_document("<title>File system | Node.js v20.20.2 Documentation</title>"
                         "<h2>File system</h2><p>fs</p>")[0] == {"title": "File system"}
    assert html_document("<title>Simple Example (libffi manual)</title>"
                         "<h3>2.2 Simple Example</h3><p>x</p>")[0] == {
        "title": "Simple Example (libffi manual)"}
    assert html_document("<title>File systems everywhere</title><h2>File system</h2>")[0] == {
        "title": "File systems everywhere"}


def test_a_content_element_named_only_in_a_script_or_comment_leaves_the_body_read() -> None:
    """The look for ``<main>``/``<article>`` reads the raw text, where a template string in a
    script or a comment can hold one: the page then read as nothing (ingest refused it as a
    page its scripts fill in). Where the parse opened no content element, the body is read."""
    assert html_document("<title>Guide</title><script>var t = '<article class=x>';</script>"
                         "<p>Install it with the tool.</p>") == (
        {"title": "Guide"}, "Install it with the tool.\n")
    assert html_document("<body><!-- <main> was here --><p>Body text.</p></body>")[1] == \
        "Body text.\n"
    # A real one still keeps the furniture around it out.
    assert html_document("<p>Skip me.</p><main><p>Kept.</p></main>")[1] == "Kept.\n"


def test_ingest_reads_html_and_leaves_out_a_rendering_beside_its_source(
        tmp_path: Path, tenant_factory, cli_env: dict[str, str], admin_engine: Engine) -> None:
    t = tenant_factory("team")
    root = folder(tmp_path / "api", {
        "install.html": PAGE, "fs.md": "# File system\n\nThe fs module.\n",
        "fs.html": "<title>File system</title><p>The fs module.</p>",
        "frames.htm": "<html><head><title>x</title></head><frameset></frameset></html>"})
    found = discover([root], None)
    assert sorted(f.path for f in found.files) == ["frames.htm", "fs.md", "install.html"]
    assert found.renderings == 1
    doc = to_document(next(f for f in found.files if f.path == "install.html"), ["team"])
    assert doc.title == "Installing" and doc.body.startswith("# Installing")
    with pytest.raises(BadInput, match="no text outside its navigation"):
        to_document(SourceFile(root / "frames.htm", "api", "frames.htm"), ["team"])

    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    flat = " ".join(output.split())
    assert code == 1 and "2 created" in flat and "1 failed" in flat, output
    assert "1 HTML page left out, the source beside each read instead" in flat, output
    assert titles(admin_engine, t) == {"install.html": "Installing", "fs.md": "File system"}


def test_unclosed_and_stray_tags_do_not_hang_the_conversion() -> None:
    # Every stray end tag once scanned the open elements: 50,000 unclosed divs and 50,000 stray
    # </p> were 2.5 billion comparisons. Now each is a count.
    fields, body = html_document("<div>" * 50_000 + "text" + "</p>" * 50_000)
    assert (fields, body) == ({}, "text\n")
    assert html_document("<ul>" + "<li>x" * 1000)[1].count("- x") == 1000
    # Nested lists: indented at most MAX_LIST_DEPTH deep (each item's indent grew with its
    # depth: 16,000 levels made 256 MB of Markdown from 144 kB).
    deep = html_document("<ul><li>x" * 16_000)[1]
    assert deep.count("- x") == 16_000 and len(deep) < 16_000 * 30, len(deep)


def test_an_older_page_is_read_in_the_character_set_its_meta_declares(tmp_path: Path) -> None:
    page = tmp_path / "old.html"
    page.write_bytes('<html><head><meta http-equiv="Content-Type" content="text/html; '
                     'charset=iso-8859-1"><title>Café</title></head><body><p>Crème brûlée</p>'
                     '</body></html>'.encode("latin-1"))
    doc = to_document(SourceFile(page, "notes", "old.html"), ["team"])
    assert doc.title == "Café" and doc.body == "Crème brûlée\n"
    # No declaration, or one Python does not know: refused as before, by name.
    for head in ("", '<meta charset="klingon-8">'):
        page.write_bytes(f"<html><head>{head}</head><p>Crème</p>".encode("latin-1"))
        with pytest.raises(BadInput, match="not UTF-8 text"):
            to_document(SourceFile(page, "notes", "old.html"), ["team"])


# mdBook's page shape (the Rust book): a state class on <html> whose words say "sidebar", the
# table of contents in a sidebar, the content in <main> inside a wrapper, and each heading's
# text inside an <a class="header">.
MDBOOK = """<!DOCTYPE html>
<html lang="en" class="light sidebar-visible" dir="ltr"><head>
<title>What is Ownership? - The Rust Programming Language</title></head><body>
<div id="mdbook-help-container"><h2>Keyboard shortcuts</h2></div>
<nav id="mdbook-sidebar" class="sidebar"><ol class="chapter"><li>Getting Started</li></ol></nav>
<div id="mdbook-page-wrapper" class="page-wrapper"><div class="page">
<div id="mdbook-menu-bar" class="menu-bar"><h1 class="menu-title">The Rust Programming Language</h1></div>
<div id="mdbook-content" class="content"><main>
<h2 id="what-is-ownership"><a class="header" href="#what-is-ownership">What Is Ownership?</a></h2>
<p>Ownership is a set of rules that govern how a Rust program manages memory.</p>
<h3 id="rules"><a class="header" href="#rules">Ownership Rules</a></h3><p>Each value has an owner.</p>
</main><nav class="nav-wrapper" aria-label="Page navigation"><a href="ch04-00.html">Previous</a></nav>
</div></div></div></body></html>
"""


def test_a_page_whose_html_class_or_heading_links_name_navigation_is_still_read() -> None:
    """The Rust book's 112 chapters were all refused as "no text outside its navigation": the
    ``<html>`` element's ``sidebar-visible`` class dropped the whole page; once read, every
    heading was empty (its text is an ``<a class="header">``)."""
    fields, body = html_document(MDBOOK)
    assert fields == {"title": "What is Ownership?"}  # the title's heading, letter case aside
    assert body == ("## What Is Ownership?\n\nOwnership is a set of rules that govern how a Rust "
                    "program manages memory.\n\n### Ownership Rules\n\nEach value has an owner.\n")
    # A <main> inside an element dropped for its class is read; the rest of that element is not.
    assert html_document('<div class="sidebar-layout"><p>Menu</p><main><p>Kept.</p></main>'
                         "<p>Menu again</p></div>")[1] == "Kept.\n"
    # Inside a <nav> (an element, not a class) or hidden, it stays dropped; a heading's own
    # permalink sign is still cut.
    assert html_document("<nav><main><p>No.</p></main></nav><article><p>Yes.</p></article>")[1] \
        == "Yes.\n"
    assert html_document('<h2>Setup<a class="headerlink" href="#setup">¶</a></h2>')[1] == \
        "## Setup\n"
    # rustdoc's sign goes before the text; a heading's own leading "#" stays.
    assert html_document('<h2 id="examples"><a class="doc-anchor" href="#examples">§</a>Examples'
                         "</h2><h3>#include</h3>")[1] == "## Examples\n\n### #include\n"


def test_a_redirect_and_a_noindex_page_are_marked() -> None:
    stub = ('<html><head><meta http-equiv="refresh" content="0; URL=ch19-02-refutability.html">'
            "<title>Redirecting...</title></head><body><p>Redirecting to... "
            '<a href="ch19-02-refutability.html">ch19-02-refutability.html</a>.</p></body></html>')
    assert html_document(stub)[0] == {"title": "Redirecting...",
                                      "redirect": "ch19-02-refutability.html"}
    # A page that reloads itself every five minutes, or jumps within itself, is no redirect.
    for content in ("300", "300; url=index.html", "0; url=#top", "soon"):
        assert "redirect" not in html_document(
            f'<meta http-equiv="Refresh" content="{content}"><p>News.</p>')[0], content
    for content, marked in (("noindex,follow", True), ("NOINDEX", True), ("index, follow", False),
                            ("nofollow", False)):
        fields = html_document(f'<meta name="robots" content="{content}"><p>Page.</p>')[0]
        assert fields.get("noindex", False) is marked, content


def test_ingest_leaves_out_redirect_and_noindex_pages_and_names_them(
        tmp_path: Path, tenant_factory, cli_env: dict[str, str], admin_engine: Engine) -> None:
    t = tenant_factory("team")
    root = folder(tmp_path / "book", {
        "ch04-01.html": MDBOOK,
        "old-ch04.html": '<meta http-equiv="refresh" content="0; URL=ch04-01.html">'
                         "<p>Redirecting to ch04-01.html.</p>",
        "print.html": '<meta name="robots" content="noindex"><title>Book</title>'
                      "<main><p>Ownership is a set of rules, the whole book again.</p></main>"})
    with pytest.raises(BadInput, match="a redirect to ch04-01.html"):
        to_document(SourceFile(root / "old-ch04.html", "book", "old-ch04.html"), ["team"])

    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    flat = " ".join(output.split())
    assert code == 0 and "1 created" in flat and "0 failed" in flat, output
    assert "1 HTML page marked noindex left out (print.html; --include-noindex reads them)" \
        in flat, output
    assert "1 HTML redirect page left out (old-ch04.html)" in flat, output
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team",
                       "--include-noindex")
    flat = " ".join(output.split())
    assert code == 0 and "1 created, 0 updated, 1 unchanged" in flat, output
    assert "noindex" not in flat and "1 HTML redirect page left out" in flat, output
    assert titles(admin_engine, t) == {"ch04-01.html": "What is Ownership?", "print.html": "Book"}
    # --sync without --include-noindex: the page is no document any more, and goes.
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team",
                       "--sync")
    assert code == 0 and "1 deleted" in " ".join(output.split()), output
    # Inline code in the heading, none in the title.
    assert html_document("<title>Errors with Result - The Book</title><main><h2><a class=header>"
                         "Errors with <code>Result</code></a></h2><p>x</p></main>")[0] == {
        "title": "Errors with Result"}


def test_a_data_table_is_a_markdown_table_and_a_layout_table_is_read_as_blocks() -> None:
    """A table's rows were lines of "cell | cell" that extraction read as sentences (the Rust
    book's operator table made "AddAssign" an organisation) with their inline code marks
    lost; a 2000s page laid out by tables read as one line ("HomeIntroductionDocumentation
    ...", libxslt's FAQ)."""
    body = html_document("<table><thead><tr><th>Operator</th><th>Trait</th></tr></thead><tbody>"
                         "<tr><td><code>+=</code></td><td><code>AddAssign</code></td></tr>"
                         "<tr><td><p>a | b</p></td></tr></tbody></table>")[1]
    assert body == ("| Operator | Trait |\n| --- | --- |\n| `+=` | `AddAssign` |\n"
                    "| a \\| b |  |\n")
    # One row or one column: cells as paragraphs.
    assert html_document("<table><tr><td>Logo</td><td>Welcome.</td></tr></table>")[1] == \
        "Logo\n\nWelcome.\n"
    assert html_document("<table><tr><td>One.</td></tr><tr><td>Two.</td></tr></table>")[1] == \
        "One.\n\nTwo.\n"
    # A heading, a list or a table in a cell: the table lays the page out.
    page = ("<table><tr><td><ul><li>Home</li><li>FAQ</li></ul></td><td><h2>FAQ</h2>"
            "<ol><li><p>Compiling fails?</p><p>Use the flags.</p></li><li>Bindings?</li></ol>"
            "<table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr></table>"
            "</td></tr></table>")
    assert html_document(page)[1] == (
        "- Home\n\n- FAQ\n\n## FAQ\n\n1. Compiling fails?\n\n   Use the flags.\n\n"
        "2. Bindings?\n\n| k | v |\n| --- | --- |\n| 1 | 2 |\n")


def test_a_code_listings_line_numbers_stay_out_of_its_code() -> None:
    """rustdoc's source pages read "1use crate::Span;": each line's number is an anchor inside
    the ``pre`` (marked ``data-nosnippet``); Pygments puts them in a cell of their own."""
    rustdoc = ('<pre class="rust"><code><a href=#1 id=1 data-nosnippet>1</a>use crate::Span;\n'
               '<a href=#2 id=2 data-nosnippet>2</a>fn main() {}</code></pre>')
    assert html_document(rustdoc)[1] == "```\nuse crate::Span;\nfn main() {}\n```\n"
    pygments = ('<table class="highlighttable"><tr><td class="linenos"><div class="linenodiv">'
                '<pre>1\n2</pre></div></td><td class="code"><pre>a = 1\nb = 2</pre></td></tr>'
                "</table>")
    assert html_document(pygments)[1] == "```\na = 1\nb = 2\n```\n"
    assert html_document('<pre><span class="lineno">1 </span>x = 1</pre>')[1] == "```\nx = 1\n```\n"


# A saved MediaWiki page (Wikipedia's Vector 2022 skin, trimmed): the title's h1 in the
# content's own <header>, "[edit]" links beside headings, citation marks, the print footer,
# categories and navigation boxes.
WIKI = """<html class="client-js"><head><title>Ada Lovelace - Wikipedia</title></head>
<body class="skin-vector-2022 mediawiki"><a class="mw-jump-link" href="#b">Jump to content</a>
<header class="vector-header mw-header">Wikipedia Search</header>
<main id="content" class="mw-body"><header class="mw-body-header vector-page-titlebar">
<h1 id="firstHeading" class="firstHeading"><span class="mw-page-title-main">Ada Lovelace</span></h1>
</header><div id="bodyContent"><div id="siteSub" class="noprint">From Wikipedia, the free
encyclopedia</div><div class="mw-parser-output">
<p>Ada Lovelace was an English mathematician.<sup id="cite_ref-1" class="reference"><a href="#c">
<span class="cite-bracket">[</span>1<span class="cite-bracket">]</span></a></sup></p>
<div class="mw-heading mw-heading2"><h2 id="Biography">Biography</h2><span class="mw-editsection">
<span class="mw-editsection-bracket">[</span><a href="#e">edit</a><span class="mw-editsection-bracket">]
</span></span></div><p>She was the only legitimate child of Lord Byron.</p>
<div class="navbox" role="navigation"><table><tr><td>Navbox links</td></tr></table></div></div>
<div class="printfooter" data-nosnippet="">Retrieved from "https://en.wikipedia.org/wiki/Ada"</div>
<div id="catlinks" class="catlinks">Categories: 1815 births</div></div></main>
<footer class="mw-footer">This page was last edited on 1 December 2026</footer></body></html>
"""


def test_a_saved_mediawiki_page_reads_as_its_article() -> None:
    """Read as its article: the title's heading (inside the content's own <header>, which a
    page's banner <header> is not), no "[edit]", no citation marks, no "Retrieved from",
    categories, "From Wikipedia" or navigation box."""
    assert html_document(WIKI) == ({"title": "Ada Lovelace"}, (
        "# Ada Lovelace\n\nAda Lovelace was an English mathematician.\n\n## Biography\n\n"
        "She was the only legitimate child of Lord Byron.\n"))
    # Bootstrap's print-hidden utility class too; a <sup> that is no citation stays.
    assert html_document('<main><p>E = mc<sup>2</sup>.</p><div class="d-print-none">Share'
                         "</div></main>")[1] == "E = mc2.\n"


def test_a_heading_or_section_whose_id_holds_a_navigation_word_is_read() -> None:
    """An id is often its heading's or section's slug: "using-structs-to-structure-related-data"
    dropped the Rust book's chapter heading, and a paper's "Related work" section went whole.
    An id says navigation only whole ("toc", "sidebar") or as a table of contents' entry
    ("toc-Introduction-1", Texinfo's)."""
    page = ('<main><h1 id="using-structs-to-structure-related-data">Using Structs to Structure '
            'Related Data</h1><section id="related-work"><h2 id="related-work-h">Related work</h2>'
            '<p>Earlier systems.</p></section><div id="toc"><p>Contents</p></div>'
            '<ul><li><a id="toc-Introduction-1" href="#Introduction">1 Introduction</a></li></ul>'
            "</main>")
    assert html_document(page)[1] == ("# Using Structs to Structure Related Data\n\n"
                                      "## Related work\n\nEarlier systems.\n")


def test_inline_code_holding_a_backtick_and_backticks_in_prose_read_as_written() -> None:
    """libxslt's "<code>CFLAGS=`xslt-config --cflags`</code>" read as broken code spans, and
    the empty-span clean-up ate what matched "` `" or "``" anywhere: the close and open of two
    spans side by side (merging them), TeX quotes in prose (fontconfig's "``$XDG_CACHE_HOME''")."""
    assert html_document("<p>Use <code>CFLAGS=`xslt-config --cflags`</code> and <code>x</code>."
                         "</p>")[1] == "Use `` CFLAGS=`xslt-config --cflags` `` and `x`.\n"
    assert html_document("<p><code>a</code> <code>b</code>, the ``default'' dir<code></code>."
                         "</p>")[1] == "`a` `b`, the ``default'' dir.\n"
    assert html_document("<table><tr><th>k</th><th>v</th></tr><tr><td><code>a`b</code></td>"
                         "<td><code></code>c</td></tr></table>")[1] == (
        "| k | v |\n| --- | --- |\n| `` a`b `` | c |\n")


def test_the_site_name_a_folders_pages_share_is_cut_from_their_titles(
        tmp_path: Path, tenant_factory, cli_env: dict[str, str], admin_engine: Engine) -> None:
    """16 of the Rust book's 112 chapters kept " - The Rust Programming Language": their
    heading and title differ in words ("Appendix A: Keywords" under "A - Keywords - ..."). The
    name most of a folder's pages end their titles with is cut; a page titled by it alone
    keeps it, and a folder whose pages share no such name is left as it is."""
    from orchestrator.ingest.html import site_name, without_site_name

    heads = [f"<html><head><title>{t}</title>".encode() for t in (
        "A - Keywords - The Book", "B - Operators - The Book", "Intro | The Book", "The Book",
        "Other page")]
    assert site_name(heads) == "The Book"
    assert site_name(heads[:2]) == ""  # too few pages to say
    others = [b"<title>x - Y</title>", b"<title>z - W</title>", b"<title>u - V</title>",
              b"<title>w</title>"]
    assert site_name([*heads[:3], *others]) == ""  # three of seven: not most
    assert without_site_name("A - Keywords - The Book", "The Book") == "A - Keywords"
    assert without_site_name("The Book", "The Book") == "The Book"
    assert without_site_name("Handbook", "book") == "Handbook"

    t = tenant_factory("team")
    root = folder(tmp_path / "site", {
        name: f"<title>{title}</title><main><h2>{heading}</h2><p>Text of {name}.</p></main>"
        for name, title, heading in (("a.html", "A - Keywords - The Book", "Appendix A: Keywords"),
                                     ("b.html", "Ownership - The Book", "Ownership"),
                                     ("c.html", "Traits - The Book", "Traits in depth"),
                                     ("index.html", "The Book", "Welcome"))})
    code, output = run(cli_env, "ingest", str(root), "--tenant", t.org_id, "--scopes", "write:team")
    assert code == 0, output
    assert titles(admin_engine, t) == {"a.html": "A - Keywords", "b.html": "Ownership",
                                       "c.html": "Traits", "index.html": "The Book"}

