"""The console's routes (see the package docstring for the data flow)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse

import httpx
from anyio import to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from orchestrator.auth import Identity
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.config import Settings
from orchestrator.console import layout
from orchestrator.console import queries as q
from orchestrator.errors import STATUS_BY_CODE, BadInput, EngramError, Unauthenticated
from orchestrator.messages import nothing_served

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
VENDOR = STATIC / "vendor"
# What `make assets` copies from node_modules (package.json at the repository root).
VENDOR_FILES = ("htmx.min.js", "chart.umd.min.js")
COOKIE = "engram_console"
OIDC_COOKIE = "engram_console_oidc"
ANCHOR_COOKIE = "engram_console_anchor"
MAX_TOKEN_CHARS = 16_384
STRATEGIES = ("newest_wins", "highest_authority_wins", "keep_both", "manual")
DERIVED_KINDS = ("community", "summary", "profile", "episode", "observation", "decision")
MODES = ("causal", "timeline")

Run = Callable[[Identity, dict[str, Any]], Awaitable[dict[str, Any]]]


class SignInNeeded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _last_anchor(request: Request) -> str | None:
    raw = request.cookies.get(ANCHOR_COOKIE)
    if not raw:
        return None
    try:
        line = base64.urlsafe_b64decode(raw.encode()).decode()
        json.loads(line)
    except ValueError:
        return None
    return line


def vendor_missing() -> list[str]:
    return [f for f in VENDOR_FILES if not (VENDOR / f).is_file()]


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
    return verifier, challenge.decode()


def page_status(errors: list[dict[str, Any]]) -> int:
    """A page's HTTP status when it shows ``errors``: the API's status for their codes
    (``STATUS_BY_CODE``; 500 for a code it does not know), forbidden first, and not found
    only when nothing else went wrong."""
    statuses = {STATUS_BY_CODE.get(str(e.get("extensions", {}).get("code")), 500) for e in errors}
    if 403 in statuses:
        return 403
    return max(statuses - {404} or statuses)


class Console:
    def __init__(self, settings: Settings, verifier: TokenVerifier, run: Run) -> None:
        self.settings = settings
        self.verifier = verifier
        self.run = run
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"),
                               autoescape=select_autoescape(["j2", "html"]), trim_blocks=True,
                               lstrip_blocks=True)
        self.env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True,
                                                                 default=str)
        self.env.filters["short"] = layout.short
        self.env.filters["step_title"] = layout.step_title
        self.env.filters["duplicate_line"] = layout.duplicate_line
        self.env.globals["nothing_served"] = nothing_served
        self.env.globals["box_w"] = layout.BOX_W
        self._discovery: dict[str, Any] | None = None

    # --- identity ------------------------------------------------------------------

    @property
    def oidc(self) -> bool:
        return bool(self.settings.console_oidc_client_id)

    @property
    def paste_allowed(self) -> bool:
        return self.settings.env != "production" or not self.oidc

    async def identity(self, request: Request) -> tuple[Identity, str]:
        token = request.cookies.get(COOKIE)
        if not token:
            raise SignInNeeded("")
        try:
            ident = await to_thread.run_sync(self.verifier.verify, token)
        except EngramError as exc:
            raise SignInNeeded(f"your token no longer verifies: {exc.message}") from exc
        return ident, token

    async def gql(self, identity: Identity, query: str, variables: dict[str, Any] | None = None
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``data`` (empty when none) and the errors of one operation."""
        try:
            result = await self.run(identity, {"query": query, "variables": variables or {}})
        except Unauthenticated as exc:
            raise SignInNeeded(exc.message) from exc
        except EngramError as exc:
            return {}, [{"message": exc.message, "extensions": {"code": exc.code}}]
        return result.get("data") or {}, result.get("errors") or []

    # --- rendering -----------------------------------------------------------------

    def render(self, name: str, request: Request, status: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("me", None)
        ctx.setdefault("errors", [])
        html = self.env.get_template(name).render(
            request=request, missing=vendor_missing(), path=request.url.path, **ctx)
        if ctx["errors"] and status == 200 and not request.headers.get("hx-request"):
            # A fragment htmx asked for keeps 200: htmx swaps no 4xx/5xx answer into the
            # page, and the refusal in it is what the person must read.
            status = page_status(ctx["errors"])
        return HTMLResponse(html, status_code=status)

    async def page(self, request: Request, template: str, query: str,
                   variables: dict[str, Any] | None = None, **ctx: Any) -> Response:
        """A page whose data is one GraphQL operation (plus ``me`` for the navigation)."""
        try:
            identity, _ = await self.identity(request)
            me, _ = await self.gql(identity, q.ME)
            data, errors = await self.gql(identity, query, variables) if query else ({}, [])
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        return self.render(template, request, me=me.get("me"), data=data, errors=errors, **ctx)

    def to_signin(self, request: Request, reason: str) -> Response:
        target = "/console/signin" + (f"?{urlencode({'reason': reason})}" if reason else "")
        if request.headers.get("hx-request"):
            return Response(status_code=204, headers={"HX-Redirect": target})
        return RedirectResponse(target, status_code=303)

    def same_origin(self, request: Request) -> bool:
        """POSTs must come from the console's own pages (with SameSite=Lax on the cookie)."""
        origin = request.headers.get("origin") or request.headers.get("referer")
        if not origin:
            return False
        o = urlparse(origin)
        return f"{o.scheme}://{o.netloc}" == f"{request.url.scheme}://{request.url.netloc}"

    def set_cookie(self, request: Request, response: Response, token: str) -> None:
        response.set_cookie(COOKIE, token, httponly=True, samesite="lax", path="/console",
                            secure=request.url.scheme == "https")

    # --- sign-in -------------------------------------------------------------------

    async def signin(self, request: Request) -> Response:
        error = ""
        if request.method == "POST":
            if not self.same_origin(request):
                return self.render("signin.j2", request, status=403, oidc=self.oidc,
                                   paste=self.paste_allowed, error="refused: not from this console")
            form = await request.form()
            token = str(form.get("token") or "").strip()
            if token.lower().startswith("bearer "):
                token = token[7:].strip()
            if not self.paste_allowed:
                error = "pasting a token is off here: sign in with the identity provider"
            elif not token:
                error = "paste a bearer token"
            elif len(token) > MAX_TOKEN_CHARS:
                error = f"that is {len(token)} characters, longer than any token Engram accepts"
            else:
                try:
                    identity = await to_thread.run_sync(self.verifier.verify, token)
                    _, errors = await self.gql(identity, q.ME)
                    if errors:
                        raise BadInput(errors[0]["message"])
                except (EngramError, SignInNeeded) as exc:
                    error = f"that token was refused: {exc}"
                else:
                    response = RedirectResponse("/console/recall", status_code=303)
                    self.set_cookie(request, response, token)
                    return response
        status = 400 if error else 200
        return self.render("signin.j2", request, status=status, oidc=self.oidc,
                           paste=self.paste_allowed, error=error,
                           reason=request.query_params.get("reason", ""))

    async def signout(self, request: Request) -> Response:
        response = RedirectResponse("/console/signin", status_code=303)
        if self.same_origin(request):
            response.delete_cookie(COOKIE, path="/console")
        return response

    async def discovery(self) -> dict[str, Any]:
        if self._discovery is None:
            s = self.settings
            url = s.console_oidc_discovery_url or (
                (s.auth_issuer or "").rstrip("/") + "/.well-known/openid-configuration")
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(url)
                response.raise_for_status()
                self._discovery = response.json()
        return self._discovery

    def redirect_uri(self, request: Request) -> str:
        return str(request.url_for("console_callback"))

    async def oidc_start(self, request: Request) -> Response:
        if not self.oidc:
            return self.render("signin.j2", request, status=404, oidc=False,
                               paste=self.paste_allowed,
                               error="no identity provider is configured for the console "
                                     "(ENGRAM_CONSOLE_OIDC_CLIENT_ID)")
        try:
            meta = await self.discovery()
        except (httpx.HTTPError, ValueError) as exc:
            return self.render("signin.j2", request, status=502, oidc=True, paste=self.paste_allowed,
                               error=f"the identity provider's discovery document is unreachable: {exc}")
        state, (verifier, challenge) = secrets.token_urlsafe(24), _pkce()
        params = {"response_type": "code", "client_id": self.settings.console_oidc_client_id,
                  "redirect_uri": self.redirect_uri(request), "scope": self.settings.console_oidc_scopes,
                  "state": state, "code_challenge": challenge, "code_challenge_method": "S256",
                  "resource": self.settings.auth_audience}
        response = RedirectResponse(f"{meta['authorization_endpoint']}?{urlencode(params)}",
                                    status_code=303)
        response.set_cookie(OIDC_COOKIE, f"{state}.{verifier}", max_age=600, httponly=True,
                            samesite="lax", path="/console", secure=request.url.scheme == "https")
        return response

    async def oidc_callback(self, request: Request) -> Response:
        def fail(message: str) -> Response:
            return self.render("signin.j2", request, status=400, oidc=self.oidc,
                               paste=self.paste_allowed, error=message)

        params = request.query_params
        if params.get("error"):
            said = params.get("error_description") or params["error"]
            return fail(f"the identity provider refused: {said}")
        state, _, verifier = (request.cookies.get(OIDC_COOKIE) or "").partition(".")
        if not self.oidc or not state or not secrets.compare_digest(state, params.get("state", "")):
            return fail("this sign-in was not started here (or took longer than 10 minutes); try again")
        try:
            meta = await self.discovery()
            form = {"grant_type": "authorization_code", "code": params.get("code", ""),
                    "redirect_uri": self.redirect_uri(request), "code_verifier": verifier,
                    "client_id": self.settings.console_oidc_client_id or "",
                    "resource": self.settings.auth_audience}
            auth: tuple[str | bytes, str | bytes] | None = None
            if self.settings.console_oidc_client_secret:
                auth = (self.settings.console_oidc_client_id or "",
                        self.settings.console_oidc_client_secret)
            async with httpx.AsyncClient(timeout=15) as client:
                if auth is None:
                    response = await client.post(meta["token_endpoint"], data=form)
                else:
                    response = await client.post(meta["token_endpoint"], data=form, auth=auth)
            body = response.json()
            if response.status_code != 200 or "access_token" not in body:
                said = str(body.get("error_description") or body.get("error") or response.status_code)
                return fail(f"the token exchange failed: {said}")
            token = str(body["access_token"])
            await to_thread.run_sync(self.verifier.verify, token)
        except (httpx.HTTPError, ValueError) as exc:
            return fail(f"the identity provider did not answer: {exc}")
        except EngramError as exc:
            return fail(f"the identity provider's token was refused: {exc.message}")
        done = RedirectResponse("/console/recall", status_code=303)
        done.delete_cookie(OIDC_COOKIE, path="/console")
        self.set_cookie(request, done, token)
        return done

    # --- recall workbench ----------------------------------------------------------

    async def recall(self, request: Request) -> Response:
        p = request.query_params
        form: dict[str, Any] = {"question": p.get("question", ""), "asker": p.get("asker", ""),
                                "budget": p.get("budget", ""), "mode": p.get("mode", ""),
                                "session": p.get("session", ""), "shapes": p.getlist("shape")}
        try:
            identity, _ = await self.identity(request)
            me, _ = await self.gql(identity, q.ME)
            shapes, errors = await self.gql(identity, q.RECALL_FORM)
            data: dict[str, Any] = {}
            if form["question"].strip():
                study = [s for s in form["shapes"] if s != "full"][:4]
                budget: int | None = None
                if form["budget"].strip():
                    try:
                        budget = int(form["budget"])
                    except ValueError:
                        errors = [{"message": f"budget {form['budget']!r} is not a whole number",
                                   "extensions": {"code": "BAD_USER_INPUT"}}]
                if not errors:
                    data, errors = await self.gql(identity, q.recall_trace(study), {
                        "q": form["question"], "asker": form["asker"] or None, "budget": budget,
                        "mode": form["mode"] or None, "session": form["session"] or None})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        trace = data.get("full")
        studies = [data[k] for k in sorted(data) if k.startswith("s")]
        return self.render("recall.j2", request, me=me.get("me"), form=form, errors=errors,
                           shapes=shapes.get("planShapes", []), trace=trace, studies=studies,
                           picture=layout.trace_picture(trace) if trace else None,
                           bar=layout.timing_bar(trace["timings"]) if trace else [],
                           modes=MODES)

    # --- memory --------------------------------------------------------------------

    async def documents(self, request: Request) -> Response:
        p = request.query_params
        return await self.page(request, "documents.j2", q.DOCUMENTS, {
            "after": p.get("after") or None, "collection": p.get("collection") or None,
            "hidden": p.get("hidden") == "on"}, params=p)

    def _lineage_href(self, table: str, row_id: str) -> str:
        if table == "sources.documents":
            return f"/console/memory/documents/{row_id}"
        return f"/console/memory/lineage?{urlencode({'table': table, 'id': row_id})}"

    def _lineage(self, lineage: dict[str, Any] | None, table: str, row_id: str,
                 direction: str) -> layout.Picture | None:
        if not lineage:
            return None
        edges = [{"derived": (e["derivedTable"], e["derivedId"]),
                  "source": (e["sourceTable"], e["sourceId"]), "relation": e["relation"]}
                 for e in lineage["edges"]]
        return layout.lineage_picture((table, row_id), lineage["nodes"], edges, direction,
                                      self._lineage_href)

    async def document(self, request: Request) -> Response:
        doc_id = request.path_params["id"]
        direction = "back" if request.query_params.get("direction") == "back" else "forward"
        if request.method == "POST":
            response = await self.document_action(request, doc_id)
            if response is not None:
                return response
        try:
            identity, _ = await self.identity(request)
            me, _ = await self.gql(identity, q.ME)
            data, errors = await self.gql(identity, q.DOCUMENT, {"id": doc_id,
                                                                 "direction": direction})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        picture = self._lineage(data.get("readableLineage"), "sources.documents", doc_id, direction)
        return self.render("document.j2", request, me=me.get("me"), data=data, errors=errors,
                           picture=picture, direction=direction)

    async def document_action(self, request: Request, doc_id: str) -> Response | None:
        if not self.same_origin(request):
            return HTMLResponse("refused: not from this console", status_code=403)
        form = await request.form()
        action = str(form.get("action") or "")
        try:
            identity, _ = await self.identity(request)
            if action in ("pin", "unpin"):
                _, errors = await self.gql(identity, q.PIN, {"id": doc_id, "on": action == "pin"})
            elif action in ("archive", "unarchive"):
                _, errors = await self.gql(identity, q.ARCHIVE, {"id": doc_id,
                                                                 "on": action == "archive"})
            elif action in ("snooze", "wake"):
                until = str(form.get("until") or "") or None
                _, errors = await self.gql(identity, q.SNOOZE, {
                    "id": doc_id, "until": (until + ":00+00:00" if until and len(until) == 16
                                            else until) if action == "snooze" else None})
            else:
                errors = [{"message": f"unknown action {action!r}"}]
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        if errors:
            return self.render("message.j2", request, status=400, errors=errors)
        return RedirectResponse(f"/console/memory/documents/{doc_id}", status_code=303)

    async def lineage(self, request: Request) -> Response:
        p = request.query_params
        table, row_id = p.get("table", ""), p.get("id", "")
        direction = "forward" if p.get("direction") == "forward" else "back"
        try:
            identity, _ = await self.identity(request)
            me, _ = await self.gql(identity, q.ME)
            data, errors = await self.gql(identity, q.LINEAGE, {"table": table, "id": row_id,
                                                                "direction": direction})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        return self.render("lineage.j2", request, me=me.get("me"), errors=errors, table=table,
                           row_id=row_id, direction=direction,
                           picture=self._lineage(data.get("readableLineage"), table, row_id,
                                                 direction))

    async def entities(self, request: Request) -> Response:
        p = request.query_params
        return await self.page(request, "entities.j2", q.ENTITIES, {
            "q": p.get("q") or None, "after": p.get("after") or None}, params=p)

    async def entity(self, request: Request) -> Response:
        return await self.page(request, "entity.j2", q.ENTITY, {"id": request.path_params["id"]})

    async def keyed(self, request: Request) -> Response:
        return await self.page(request, "keyed.j2", q.KEYED)

    async def conflicts(self, request: Request) -> Response:
        status = request.query_params.get("status", "open")
        return await self.page(request, "conflicts.j2", q.CONFLICTS,
                               {"status": None if status == "all" else status}, shown=status,
                               strategies=STRATEGIES)

    async def resolve(self, request: Request) -> Response:
        if not self.same_origin(request):
            return HTMLResponse("refused: not from this console", status_code=403)
        form = await request.form()
        variables = {"id": request.path_params["id"], "strategy": str(form.get("strategy") or ""),
                     "winner": str(form.get("winner") or "") or None}
        return await self.action(request, q.RESOLVE, variables, "/console/memory/conflicts")

    async def quarantine(self, request: Request) -> Response:
        status = request.query_params.get("status", "held")
        return await self.page(request, "quarantine.j2", q.QUARANTINE,
                               {"status": None if status == "all" else status}, shown=status)

    async def release(self, request: Request) -> Response:
        if not self.same_origin(request):
            return HTMLResponse("refused: not from this console", status_code=403)
        form = await request.form()
        corrections: dict[str, Any] = {}
        value = str(form.get("value") or "").strip()
        if value:
            corrections["object_value"] = value
        predicate = str(form.get("predicate") or "").strip()
        if predicate:
            corrections["predicate"] = predicate
        qid = request.path_params["id"]
        if form.get("action") == "discard":
            return await self.action(request, q.DISCARD, {"id": qid}, "/console/memory/quarantine")
        return await self.action(request, q.RELEASE, {"id": qid, "corrections": corrections or None},
                                 "/console/memory/quarantine")

    async def action(self, request: Request, query: str, variables: dict[str, Any],
                     back: str) -> Response:
        """Run a mutation; htmx gets the outcome as a fragment, a plain form a redirect."""
        try:
            identity, _ = await self.identity(request)
            data, errors = await self.gql(identity, query, variables)
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        if request.headers.get("hx-request"):
            return self.render("outcome.j2", request, data=data, errors=errors)
        if errors:
            return self.render("message.j2", request, status=400, errors=errors, back=back)
        return RedirectResponse(back, status_code=303)

    async def derived(self, request: Request) -> Response:
        kind = request.query_params.get("kind") or None
        return await self.page(request, "derived.j2", q.DERIVED, {"kind": kind}, kind=kind,
                               kinds=DERIVED_KINDS)

    # --- audit ---------------------------------------------------------------------

    async def audit(self, request: Request) -> Response:
        """Chain status, and the last anchor taken in this browser checked against the chain
        (anchors live outside the database: here, in a cookie of the auditor's browser)."""
        last = _last_anchor(request)
        try:
            identity, _ = await self.identity(request)
            me, _ = await self.gql(identity, q.ME)
            data, errors = await self.gql(identity, q.AUDIT)
            checked: dict[str, Any] = {}
            if last and not errors:
                found, problems = await self.gql(identity, q.ANCHORS, {"a": last})
                checked = {"anchor": json.loads(last),
                           "result": (found.get("checkAnchors") or [None])[0],
                           "problem": problems[0]["message"] if problems else None}
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        return self.render("audit.j2", request, me=me.get("me"), data=data, errors=errors,
                           last=checked)

    async def anchor(self, request: Request) -> Response:
        """The chain head as an anchor file to keep, remembered as this browser's last anchor."""
        try:
            identity, _ = await self.identity(request)
            data, errors = await self.gql(identity, q.AUDIT)
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        head = data.get("chainHead")
        if errors or not head:
            return self.render("message.j2", request, errors=errors or [
                {"message": "the chain has no events yet: nothing to anchor"}], back="/console/audit")
        response = Response(head["anchor"] + "\n", media_type="application/x-ndjson", headers={
            "content-disposition": f'attachment; filename="engram-anchor-{head["seq"]}.jsonl"'})
        response.set_cookie(ANCHOR_COOKIE, base64.urlsafe_b64encode(head["anchor"].encode()).decode(),
                            max_age=10 * 365 * 86400, httponly=True, samesite="lax", path="/console",
                            secure=request.url.scheme == "https")
        return response

    async def verify_step(self, request: Request) -> Response:
        raw = request.query_params.get("from", "1")
        try:
            start = int(raw)
        except ValueError:
            return self.render("verify_step.j2", request, step=None, errors=[{
                "message": f"from {raw[:40]!r} is not an event number",
                "extensions": {"code": "BAD_USER_INPUT"}}])
        try:
            identity, _ = await self.identity(request)
            data, errors = await self.gql(identity, q.VERIFY_STEP, {"from": start, "limit": 200})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        return self.render("verify_step.j2", request, step=data.get("verifyChainStep"),
                           errors=errors)

    async def anchors(self, request: Request) -> Response:
        if not self.same_origin(request):
            return HTMLResponse("refused: not from this console", status_code=403)
        form = await request.form()
        try:
            identity, _ = await self.identity(request)
            data, errors = await self.gql(identity, q.ANCHORS, {"a": str(form.get("anchors") or "")})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        return self.render("anchors.j2", request, checks=data.get("checkAnchors") or [],
                           errors=errors)

    async def receipt(self, request: Request) -> Response:
        rid = request.query_params.get("id", "").strip()
        if not rid:
            return RedirectResponse("/console/audit", status_code=303)
        return await self.page(request, "receipt.j2", q.RECEIPT, {"id": rid})

    async def audit_lineage(self, request: Request) -> Response:
        p = request.query_params
        table = p.get("table", "")
        direction = "forward" if p.get("direction") == "forward" else "back"
        raw = p.get("row", "")
        try:
            row_id = json.loads(raw) if raw.startswith("{") else {"id": raw}
        except ValueError:
            row_id = {"id": raw}
        try:
            identity, _ = await self.identity(request)
            me, _ = await self.gql(identity, q.ME)
            data: dict[str, Any] = {}
            errors: list[dict[str, Any]] = []
            if table:
                data, errors = await self.gql(identity, q.PROVENANCE, {
                    "table": table, "rowId": row_id, "direction": direction})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        picture = None
        found = data.get("provenance")
        if found:
            def key(t: str, r: Any) -> tuple[str, str]:
                return (t, json.dumps(r, sort_keys=True))
            nodes = [{"table": n["table"], "id": json.dumps(n["rowId"], sort_keys=True),
                      "label": f"{n['table']} {str(n['rowId'].get('id', n['rowId']))[-8:]} · events "
                               + ",".join(map(str, n["eventSeqs"][-3:]))} for n in found["nodes"]]
            edges = [{"derived": key(e["derivedTable"], e["derivedRowId"]),
                      "source": key(e["sourceTable"], e["sourceRowId"])}
                     for e in found["edges"] if e["sourceTable"]]
            picture = layout.lineage_picture(key(table, row_id), nodes, edges, direction)
        return self.render("audit_lineage.j2", request, me=me.get("me"), errors=errors,
                           table=table, row=raw, direction=direction, found=found, picture=picture)

    async def export(self, request: Request) -> Response:
        fmt = request.path_params["fmt"]
        try:
            identity, _ = await self.identity(request)
            data, errors = await self.gql(identity, q.EXPORT, {"format": fmt})
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        if errors:
            return self.render("message.j2", request, errors=errors, back="/console/audit")
        media = "application/ld+json" if fmt == "jsonld" else "text/turtle"
        return Response(data["provenanceExport"], media_type=media, headers={
            "content-disposition": f'attachment; filename="engram-provenance.{fmt}"'})

    # --- operations and charts -----------------------------------------------------

    async def operations(self, request: Request) -> Response:
        try:
            identity, _ = await self.identity(request)
            data, errors = await self.gql(identity, q.OPERATIONS)
            runs: dict[str, Any] = {}
            run_errors: list[dict[str, Any]] = []
            if "dba" in identity.roles:
                runs, run_errors = await self.gql(identity, q.DERIVE_RUNS)
        except SignInNeeded as need:
            return self.to_signin(request, need.reason)
        return self.render("operations.j2", request, me=data.get("me"), data=data,
                           errors=errors + run_errors, runs=runs.get("deriveRuns"))

    async def charts(self, request: Request) -> Response:
        return await self.page(request, "charts.j2", q.CHARTS)

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/console/recall", status_code=303)


class _Static(StaticFiles):
    """Static files; a missing vendor file answers with how to build it."""

    async def get_response(self, path: str, scope: Any) -> Response:
        if path.startswith("vendor/") and not (STATIC / path).is_file():
            return Response(f"/console/static/{path} is missing: build the console's assets with "
                            "`make assets` (npm ci, then copied from node_modules)\n",
                            status_code=404, media_type="text/plain")
        return await super().get_response(path, scope)


def console_routes(settings: Settings, verifier: TokenVerifier, run: Run) -> list[BaseRoute]:
    c = Console(settings, verifier, run)
    get, post = ["GET"], ["POST"]
    return [
        Route("/console", c.home, methods=get),
        Route("/console/", c.home, methods=get),
        Route("/console/signin", c.signin, methods=["GET", "POST"]),
        Route("/console/signout", c.signout, methods=post),
        Route("/console/signin/oidc", c.oidc_start, methods=get),
        Route("/console/callback", c.oidc_callback, methods=get, name="console_callback"),
        Route("/console/recall", c.recall, methods=get),
        Route("/console/memory", c.documents, methods=get),
        Route("/console/memory/documents", c.documents, methods=get),
        Route("/console/memory/documents/{id}", c.document, methods=["GET", "POST"]),
        Route("/console/memory/lineage", c.lineage, methods=get),
        Route("/console/memory/entities", c.entities, methods=get),
        Route("/console/memory/entities/{id}", c.entity, methods=get),
        Route("/console/memory/keyed", c.keyed, methods=get),
        Route("/console/memory/conflicts", c.conflicts, methods=get),
        Route("/console/memory/conflicts/{id}/resolve", c.resolve, methods=post),
        Route("/console/memory/quarantine", c.quarantine, methods=get),
        Route("/console/memory/quarantine/{id}", c.release, methods=post),
        Route("/console/memory/derived", c.derived, methods=get),
        Route("/console/audit", c.audit, methods=get),
        Route("/console/audit/verify", c.verify_step, methods=get),
        Route("/console/audit/anchor", c.anchor, methods=get),
        Route("/console/audit/anchors", c.anchors, methods=post),
        Route("/console/audit/receipt", c.receipt, methods=get),
        Route("/console/audit/lineage", c.audit_lineage, methods=get),
        Route("/console/audit/export.{fmt:str}", c.export, methods=get),
        Route("/console/operations", c.operations, methods=get),
        Route("/console/charts", c.charts, methods=get),
        Mount("/console/static", app=_Static(directory=STATIC, check_dir=False), name="console_static"),
    ]
