"""One default TLS context for every httpx client the suite creates.

httpx builds a new ``ssl.SSLContext`` for each client and loads the whole CA bundle into it
(~20 ms of CPU), even for ``http://`` URLs. The suite only talks plain HTTP to loopback, but
creates hundreds of clients (``httpx.get``/``post``/``delete`` make one per call; so do the
SDK clients): profiled, that was 15% of the fast tier's CPU. The default context (verify on,
no client certificate) is the same object every time, so it is built once per process and
shared, which ``ssl.SSLContext`` allows. Any other ``verify``/``cert`` goes to httpx as is.
"""

from __future__ import annotations

import importlib
import os
import ssl
from collections.abc import Callable
from typing import Any

_SHARED: dict[tuple[str, bool, str, str], ssl.SSLContext] = {}


def _sharing(package: str, create: Callable[..., ssl.SSLContext]) -> Callable[..., ssl.SSLContext]:
    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True
                           ) -> ssl.SSLContext:
        if verify is not True or cert:
            return create(verify=verify, cert=cert, trust_env=trust_env)
        key = (package, trust_env, os.environ.get("SSL_CERT_FILE", ""),
               os.environ.get("SSL_CERT_DIR", ""))
        if key not in _SHARED:
            _SHARED[key] = create(verify=verify, cert=cert, trust_env=trust_env)
        return _SHARED[key]
    return create_ssl_context


def share_default_tls_context() -> None:
    """Patch httpx (and httpx2, the SDKs' copy, when installed) to share the default
    context. A version whose transports no longer call ``create_ssl_context`` is left
    alone: the suite is then only slower."""
    for package in ("httpx", "httpx2"):
        try:
            transports = importlib.import_module(f"{package}._transports.default")
        except ImportError:
            continue
        create = getattr(transports, "create_ssl_context", None)
        if create is not None and not getattr(create, "__wrapped_default__", False):
            shared = _sharing(package, create)
            shared.__wrapped_default__ = True  # type: ignore[attr-defined]
            transports.create_ssl_context = shared  # type: ignore[attr-defined]
