"""The viewer behind ``--api-key``: a browser cannot send an ``Authorization`` header
when it opens a page, so the access rules also read the key from the cookie ``tito_api_key`` —
on GET and HEAD requests to ``/ui`` only (``SameSite=Strict``; nothing there changes
state) — and answers a refused page request (``Accept: text/html``) with a small form
that sets the cookie and reloads. JSON routes keep OpenAI's error envelope."""

from __future__ import annotations

import base64
import hashlib
from http.cookies import CookieError, SimpleCookie
from urllib.parse import unquote

from starlette.responses import HTMLResponse, Response
from starlette.types import Scope

COOKIE = "tito_api_key"
PAGES = frozenset({"/ui", "/ui/"})
_READ_METHODS = frozenset({"GET", "HEAD"})

_SCRIPT = """
document.getElementById("login").addEventListener("submit", function (event) {
  event.preventDefault();
  var key = document.getElementById("key").value;
  document.cookie = "tito_api_key=" + encodeURIComponent(key) + "; path=/; SameSite=Strict";
  location.reload();
});
"""
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>TITO viewer: API key</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:15px system-ui,sans-serif;margin:4em auto;max-width:32em;color:#222}}
input{{font:inherit;padding:.3em;width:20em}}button{{font:inherit;padding:.3em 1em}}
.note{{color:#a33}}</style></head>
<body><h1>TITO viewer</h1>
<p>This gateway runs with <code>--api-key</code>. Enter the key to open the viewer; it is
kept in a cookie of this site (<code>tito_api_key</code>, sent with page loads only).</p>
{note}<form id="login"><input id="key" type="password" autocomplete="current-password"
 placeholder="API key" autofocus> <button type="submit">Open</button></form>
<script>{script}</script></body></html>
"""


def is_ui_path(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def cookie_key(scope: Scope, headers: dict[bytes, bytes]) -> bytes | None:
    """The key in the ``tito_api_key`` cookie of a GET/HEAD request to ``/ui``, else None."""
    raw = headers.get(b"cookie")
    if raw is None or scope["method"] not in _READ_METHODS or not is_ui_path(scope["path"]):
        return None
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(raw.decode("latin-1"))
    except CookieError:
        return None
    morsel = cookies.get(COOKIE)
    return None if morsel is None else unquote(morsel.value).encode()


def wants_login_page(scope: Scope) -> bool:
    """A browser opening the viewer page (not a script reading JSON)."""
    if scope["method"] not in _READ_METHODS or scope["path"] not in PAGES:
        return False
    accept = dict(scope["headers"]).get(b"accept", b"")
    return b"text/html" in accept


def login_response(scope: Scope) -> Response:
    """401 with the form (and a word when the cookie it set was refused)."""
    tried = cookie_key(scope, dict(scope["headers"])) is not None
    note = '<p class="note">That key was refused.</p>' if tried else ""
    return HTMLResponse(_PAGE.format(note=note, script=_SCRIPT), status_code=401, headers={
        "Content-Security-Policy": f"default-src 'none'; style-src 'unsafe-inline'; "
                                   f"script-src 'sha256-{_SCRIPT_HASH}'; form-action 'none'; "
                                   "frame-ancestors 'none'; base-uri 'none'",
        "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer"})
