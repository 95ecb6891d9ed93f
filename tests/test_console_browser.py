"""The console in a real browser: Debian's headless Chromium driven by Selenium, one server and
one browser for the module.

What a user does: sign in with a dev token, run a recall and read its trace, open a document
and its lineage, resolve a conflict, release a quarantined claim, verify the chain as an
auditor, read a receipt and a lineage graph, download PROV-O. What must never happen: a reader
of scope alpha meeting anything of scope beta, on a page or in any network response, and an
app token opening the audit views. Every page is checked with axe-core (WCAG 2 A/AA rules,
injected from node_modules) and by keyboard; screenshots go to .cache/console-screenshots/.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orchestrator.auth.devkey import create_dev_key
from orchestrator.config import Settings
from orchestrator.console.routes import vendor_missing
from orchestrator.recall import Recaller
from tests.conftest import REPO, TenantFixture, TestDatabase
from tests.support.api import ApiServer, api_settings, serve
from tests.support.console import Corpus, build_corpus
from tests.support.recall import embedder  # noqa: F401

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
SHOTS = REPO / ".cache" / "console-screenshots"

if not CHROMIUM or not DRIVER:
    pytest.skip("the console's browser tests need Debian's chromium and chromium-driver "
                "(apt-get install chromium chromium-driver; .ci/run installs them)",
                allow_module_level=True)
if vendor_missing() or not AXE.is_file():
    pytest.skip("the console's assets and axe-core are not built: run `make assets` (npm ci)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(settings: Settings, app_engine: Engine, embedder: Any,  # noqa: F811
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    s = api_settings(settings, tmp_path_factory.mktemp("console-home"), api_max_depth=10)
    create_dev_key(s)
    with serve(s, app_engine, recaller=Recaller(app_engine, s, embedder=embedder)) as running:
        yield running


@pytest.fixture(scope="module")
def corpus(tenant_factory: Callable[..., TenantFixture], app_engine: Engine, admin_engine: Engine,
           test_db: TestDatabase, embedder: Any, server: ApiServer) -> Corpus:  # noqa: F811
    return build_corpus(tenant_factory, app_engine, admin_engine, test_db, embedder,
                        server.settings)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="engram-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER)))
    driver.set_page_load_timeout(180)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(browser: WebDriver, seconds: float = 30) -> WebDriverWait[WebDriver]:
    return WebDriverWait(browser, seconds)


def shot(browser: WebDriver, name: str) -> None:
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, max(1000, min(int(height), 6000)))
    browser.save_screenshot(str(SHOTS / f"{name}.png"))
    browser.set_window_size(1400, 1000)


def axe(browser: WebDriver, page: str) -> None:
    """No WCAG 2 A/AA violation (labels, contrast, landmarks, names) on the page."""
    browser.execute_script(AXE.read_text())
    result = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'best-practice']}})
           .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact,
                  nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))));""")
    assert result == [], f"accessibility violations on {page}: {json.dumps(result, indent=1)}"


def sign_in(browser: WebDriver, server: ApiServer, token: str) -> None:
    browser.delete_all_cookies()
    browser.get(f"{server.url}/console/signin")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form.card button[type=submit]").click()
    wait(browser).until(ec.url_contains("/console/recall"))


def token(server: ApiServer, c: Corpus, user: str, *scopes: str) -> str:
    return server.token(c.tenant.org_id, user, scopes)


def test_sign_in_refuses_bad_tokens_and_takes_a_dev_token(browser: WebDriver, server: ApiServer,
                                                          corpus: Corpus) -> None:
    browser.delete_all_cookies()
    browser.get(f"{server.url}/console/recall")
    wait(browser).until(ec.url_contains("/console/signin"))
    axe(browser, "sign-in")
    shot(browser, "01-sign-in")
    browser.find_element(By.ID, "token").send_keys("not-a-token")
    browser.find_element(By.CSS_SELECTOR, "form.card button[type=submit]").click()
    error = wait(browser).until(ec.visibility_of_element_located((By.ID, "signin-error")))
    assert "refused" in error.text
    sign_in(browser, server, token(server, corpus, "alice", "write:alpha"))
    assert browser.find_element(By.CSS_SELECTOR, ".who span").text.startswith("alice @")


def test_recall_workbench_shows_the_trace_lanes(browser: WebDriver, server: ApiServer,
                                                corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "alice", "write:alpha"))
    # Keyboard only: the skip link first, then the question, submitted with Enter.
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("class") == "skip"
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    assert browser.switch_to.active_element.get_attribute("id") == "main"
    browser.find_element(By.ID, "question").click()
    browser.switch_to.active_element.send_keys("Where is the Kestrel launch and who leads it?")
    browser.find_element(By.CSS_SELECTOR, "input[name=shape][value=bm25-only]").click()
    browser.find_element(By.ID, "question").send_keys(Keys.ENTER)
    wait(browser, 180).until(ec.presence_of_element_located((By.ID, "rendered")))
    lanes = {e.get_attribute("data-lane") for e in browser.find_elements(By.CSS_SELECTOR, "g.column")}
    assert {"dense", "lexical", "fused (RRF)", "final order"} <= lanes, lanes
    assert "Kestrel" in browser.find_element(By.ID, "rendered").text
    assert browser.find_elements(By.CSS_SELECTOR, "g.lines line"), "no lines from lanes to fusion"
    assert browser.find_elements(By.CSS_SELECTOR, ".bar span"), "no timing bar"
    assert "bm25-only" in browser.find_element(By.ID, "study-h").find_element(By.XPATH, "..").text
    # The steps without a typed field say what they did in words (the JSON behind a
    # disclosure); those with nothing to do are one line, not empty cards of "" and [].
    cards = {e.get_attribute("data-step"): e for e in
             browser.find_elements(By.CSS_SELECTOR, ".card.step")}
    # No card is an empty value's JSON (the cards of steps that did nothing read '""', "[]").
    assert "ranker" in cards and not [name for name, card in cards.items() if card.find_element(
        By.CSS_SELECTOR, "p.said, pre").get_attribute("textContent").strip()
        in ('""', "[]", "0", "false", "null")], sorted(cards)
    assert cards["ranker"].find_element(By.TAG_NAME, "h3").text == "Learned ranker"
    assert "candidate" in cards["ranker"].find_element(By.CSS_SELECTOR, "p.said").text
    assert cards["ranker"].find_elements(By.CSS_SELECTOR, "details pre")
    idle = browser.find_element(By.ID, "idle-steps").text
    assert idle.startswith("Nothing to do this time:") and "Deprecated pages" in idle
    assert not {"deprecated", "navigation"} & set(cards)
    trace_text = browser.find_element(By.ID, "trace-text")
    trace_text.find_element(By.TAG_NAME, "summary").click()
    assert "1. candidate pools" in trace_text.text and "5. budget:" in trace_text.text
    # Boxes name a chunk by its title (and section), its id left to the tooltip.
    boxes = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".picture g.box text")]
    assert boxes and not any(re.search(r"#[0-9a-f]{8}-", b) for b in boxes), boxes
    axe(browser, "recall")
    shot(browser, "02-recall-workbench")


def test_document_and_its_lineage(browser: WebDriver, server: ApiServer, corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "alice", "write:alpha"))
    browser.find_element(By.LINK_TEXT, "Memory").click()
    wait(browser).until(ec.presence_of_element_located((By.LINK_TEXT, "Kestrel launch plan")))
    axe(browser, "documents")
    shot(browser, "03-documents")
    browser.find_element(By.LINK_TEXT, "Kestrel launch plan").click()
    wait(browser).until(ec.presence_of_element_located((By.ID, "lineage-h")))
    tables = {e.get_attribute("data-table") for e in
              browser.find_elements(By.CSS_SELECTOR, ".lineage-list li")}
    assert {"sources.documents", "sources.chunks", "knowledge.fact_claim"} <= tables, tables
    assert len(browser.find_elements(By.CSS_SELECTOR, ".picture g.box")) >= 3
    assert "embedded" in browser.find_element(By.ID, "embed-state").text
    axe(browser, "document")
    shot(browser, "04-document-lineage")
    for name, link in (("05-entities", "Entities"), ("06-keyed-facts", "Keyed facts"),
                       ("07-derived", "Derived")):
        browser.find_element(By.LINK_TEXT, link).click()
        wait(browser).until(ec.presence_of_element_located((By.TAG_NAME, "table")))
        axe(browser, link)
        shot(browser, name)
    browser.find_element(By.LINK_TEXT, "Entities").click()
    browser.find_element(By.LINK_TEXT, "Ann Walker").click()
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "table.facts-table")))
    text = browser.find_element(By.CSS_SELECTOR, "table.facts-table").text
    assert "lives_in" in text and "world_fact" in text
    axe(browser, "entity")
    shot(browser, "08-entity")


def test_resolve_a_conflict(browser: WebDriver, server: ApiServer, corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "alice", "write:alpha"))
    browser.get(f"{server.url}/console/memory/conflicts")
    cid = corpus.conflicts["alpha"]
    card = wait(browser).until(ec.presence_of_element_located((By.ID, f"conflict-{cid}")))
    assert "Porto" in card.text and "Braga" in card.text
    axe(browser, "conflicts")
    shot(browser, "09-conflicts")
    Select(card.find_element(By.NAME, "strategy")).select_by_visible_text("newest_wins")
    card.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    outcome = wait(browser).until(ec.presence_of_element_located(
        (By.CSS_SELECTOR, f"#outcome-{cid} .ok")))
    assert "Resolved" in outcome.text
    browser.get(f"{server.url}/console/memory/conflicts?status=resolved")
    assert "resolved · newest_wins" in browser.find_element(By.ID, f"conflict-{cid}").text


def test_release_a_quarantined_claim(browser: WebDriver, server: ApiServer, corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "alice", "write:alpha"))
    browser.get(f"{server.url}/console/memory/quarantine")
    qid = corpus.quarantine["alpha"]
    card = wait(browser).until(ec.presence_of_element_located((By.ID, f"quarantine-{qid}")))
    assert "wizard" in card.text
    axe(browser, "quarantine")
    shot(browser, "10-quarantine")
    card.find_element(By.NAME, "value").send_keys("senior")
    card.find_element(By.CSS_SELECTOR, "button[value=release]").click()
    outcome = wait(browser).until(ec.presence_of_element_located(
        (By.CSS_SELECTOR, f"#qoutcome-{qid} .ok")))
    assert "Released as claim" in outcome.text
    browser.get(f"{server.url}/console/memory/quarantine?status=released")
    assert "released" in browser.find_element(By.ID, f"quarantine-{qid}").text


def test_operations_and_charts(browser: WebDriver, server: ApiServer, corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "dora", "read:alpha", "engram:dba"))
    browser.find_element(By.LINK_TEXT, "Operations").click()
    queue = wait(browser).until(ec.presence_of_element_located((By.ID, "queue")))
    assert "sources.chunks" in queue.text
    assert browser.find_element(By.ID, "runs")
    # The device the models run on, as chosen ("auto" said nothing about it).
    assert re.match(r"(cpu|cuda\S*) \(", browser.find_element(By.ID, "device").text)
    axe(browser, "operations")
    shot(browser, "11-operations")
    browser.find_element(By.LINK_TEXT, "Charts").click()
    wait(browser).until(lambda b: b.execute_script("return window.engramCharts === true"))
    drawn = browser.execute_script(
        "return ['latency-chart', 'queue-chart', 'value-chart'].map(id => !!Chart.getChart(id))")
    assert drawn == [True, True, True]
    axe(browser, "charts")
    shot(browser, "12-charts")


def test_auditor_verifies_the_chain_and_reads_a_receipt(browser: WebDriver, server: ApiServer,
                                                        corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "audrey", "read:alpha", "engram:auditor"))
    browser.find_element(By.ID, "question").send_keys("Kestrel launch" + Keys.ENTER)
    receipt = wait(browser, 180).until(ec.presence_of_element_located((By.ID, "receipt-id"))).text
    browser.find_element(By.LINK_TEXT, "Audit").click()
    wait(browser).until(ec.element_to_be_clickable((By.ID, "verify-button"))).click()
    result = wait(browser, 120).until(ec.presence_of_element_located((By.ID, "verify-result")))
    assert "Chain verified" in result.text
    assert browser.find_element(By.ID, "verify-progress").get_attribute("value") == \
        browser.find_element(By.ID, "head-seq").text
    # Take an anchor: the file to keep, remembered as this browser's last anchor and checked
    # against the chain on every visit.
    assert "No anchor taken" in browser.find_element(By.ID, "last-anchor").text
    anchor = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/console/audit/anchor').then(async r => done([r.status,
              r.headers.get('content-disposition'), await r.text()]));""")
    assert anchor[0] == 200 and "attachment" in anchor[1]
    assert json.loads(anchor[2])["seq"] == int(browser.find_element(By.ID, "head-seq").text)
    browser.refresh()
    assert "still matches the chain" in wait(browser).until(
        ec.presence_of_element_located((By.ID, "last-anchor"))).text
    browser.find_element(By.ID, "verify-button").click()
    wait(browser, 120).until(ec.presence_of_element_located((By.ID, "verify-result")))
    axe(browser, "audit")
    shot(browser, "13-audit")
    browser.find_element(By.LINK_TEXT, receipt).click()
    verdict = wait(browser).until(ec.presence_of_element_located((By.ID, "receipt-verdict")))
    assert "Matches" in verdict.text or "Proven" in verdict.text
    axe(browser, "receipt")
    shot(browser, "14-receipt")
    browser.find_element(By.LINK_TEXT, "lineage").click()
    proof = wait(browser).until(ec.presence_of_element_located((By.ID, "lineage-proof")))
    assert "Proven" in proof.text
    axe(browser, "audit lineage")
    shot(browser, "15-audit-lineage")
    export = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/console/audit/export.jsonld').then(async r => done([r.status,
              r.headers.get('content-type'), r.headers.get('content-disposition'),
              (await r.text()).includes('prov')]));""")
    assert export[0] == 200 and export[1].startswith("application/ld+json") and \
        "attachment" in export[2] and export[3]


def test_an_app_token_cannot_open_the_audit_views(browser: WebDriver, server: ApiServer,
                                                  corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "alice", "write:alpha"))
    assert not browser.find_elements(By.LINK_TEXT, "Audit")
    browser.get(f"{server.url}/console/audit")
    assert "FORBIDDEN" in browser.find_element(By.CSS_SELECTOR, ".errors").text
    assert not browser.find_elements(By.ID, "verify-button")
    statuses = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        Promise.all(['/console/audit', '/console/audit/export.jsonld',
                     '/console/audit/verify?from=1', '/console/audit/anchor',
                     '/console/audit/receipt?id=00000000-0000-4000-8000-000000000000',
                     '/console/audit/lineage?table=sources.chunks&row=x'].map(u => fetch(u).then(
                         async r => [r.status, (await r.text()).includes('for auditors')])))
               .then(done);""")
    assert statuses[0] == [403, True] and all(s[1] for s in statuses), statuses
    shot(browser, "16-audit-denied")


def _bodies(browser: WebDriver, base: str) -> list[tuple[str, str]]:
    """The bodies of the responses the browser received from the server since the last call."""
    out = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] != "Network.responseReceived":
            continue
        url = message["params"]["response"]["url"]
        if not url.startswith(base):
            continue
        try:
            body = browser.execute_cdp_cmd("Network.getResponseBody",
                                           {"requestId": message["params"]["requestId"]})
        except WebDriverException:
            continue  # a redirect or a page already replaced: no body kept
        out.append((url, body.get("body", "")))
    return out


def test_a_reader_of_alpha_sees_nothing_of_beta(browser: WebDriver, server: ApiServer,
                                                corpus: Corpus) -> None:
    sign_in(browser, server, token(server, corpus, "rita", "read:alpha"))
    beta_doc = corpus.docs["osprey.md"]
    pages = [
        "/console/recall?question=Who+runs+the+covert+plan+with+the+Kestrel+cover%3F"
        "&shape=bm25-only&shape=dense-only",
        "/console/memory/documents?hidden=on", f"/console/memory/documents/{corpus.docs['kestrel.md']}",
        f"/console/memory/documents/{corpus.docs['kestrel.md']}?direction=back",
        "/console/memory/entities", "/console/memory/entities?q=a", "/console/memory/keyed",
        "/console/memory/conflicts?status=all", "/console/memory/quarantine?status=all",
        "/console/memory/derived", "/console/operations", "/console/charts",
        f"/console/memory/documents/{beta_doc}",
        f"/console/memory/lineage?table=sources.documents&id={beta_doc}&direction=forward",
    ]
    hidden = set(corpus.hidden())
    browser.get_log("performance")
    checked = 0
    for page in pages:
        browser.get(server.url + page)
        wait(browser, 180).until(ec.presence_of_element_located((By.ID, "main")))
        asked = {beta_doc} if beta_doc in page else set()
        html = browser.page_source
        assert [m for m in hidden - asked if m in html] == [], page
        for url, body in _bodies(browser, server.url):
            assert [m for m in hidden - asked if m in body] == [], url
            checked += 1
    assert checked >= len(pages), f"only {checked} responses were read back"
    # The beta document itself: the same answer as a document that exists nowhere.
    browser.get(f"{server.url}/console/memory/documents/{beta_doc}")
    assert "NOT_FOUND" in browser.find_element(By.CSS_SELECTOR, ".errors").text
    shot(browser, "17-reader-denied-beta")
