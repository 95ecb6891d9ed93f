"""The Engram console: server-rendered pages (Jinja + htmx) at ``/console`` on the API server.

The console is a GraphQL client that happens to run in the server. Its data flow, in order:

1. **sign-in**: a bearer token (pasted in development, or from the OIDC issuer's
   authorization-code redirect when ``ENGRAM_CONSOLE_OIDC_CLIENT_ID`` is set) is verified
   by the API's own ``TokenVerifier`` and kept in an HttpOnly, SameSite=Strict cookie;
2. **each request**: the cookie's token is verified again (an expired token sends the
   browser back to sign-in) and becomes the request's ``Identity``;
3. **data**: every page runs GraphQL documents (``queries.py``) through the same executor
   as ``POST /graphql``: same transaction per operation, validation, cost limit and error
   codes. The console imports nothing that reads the database (a test holds it to that),
   so whatever it shows, any client can fetch with the same token;
4. **render**: Jinja templates (``templates/``), the trace and lineage laid out as SVG by
   ``layout.py``; htmx swaps fragments for actions (resolve, release, verify steps), and
   Chart.js draws the charts. Both come from npm (``make assets``) and are served from
   ``static/vendor/``; without them the pages say how to build them.
"""

from orchestrator.console.routes import console_routes

__all__ = ["console_routes"]
