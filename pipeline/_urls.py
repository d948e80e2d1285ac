"""A URL as messages show it: without the credentials or the key it may carry.

Shared by the providers (a ``base_url``) and the MCP client (a server's ``url``), so that both
hide the same part of a URL. Regular expressions only, never a URL parser: a URL a parser
refuses (``http://[::1/mcp``) must still be shown in the message about it, and a password
holding a raw ``/``, ``?`` or ``#`` ends the host where a parser reads it.
"""

import re

# Up to the URL's last "@", not only the authority's (which ends at the first "/", "?" or
# "#"): a password may hold one of those unescaped, and what httpx then reads as a host, a
# path or a query is the password's rest. Hiding more than httpx would send beats showing it.
_USERINFO = re.compile(r"^([^/]*//)?[\s\S]*@")
_CUT = re.compile("[?#]")


def hide_userinfo(url: str) -> str:
    """`url` with the credentials it may carry (``https://user:secret@host``, which httpx
    sends as Basic auth) replaced by ``***``: for reprs, messages and anything else that shows
    a base URL (``turnplug check`` does), as the providers show it. Everything between the
    scheme's ``//`` and the URL's last ``@`` counts as credentials, a raw ``/``, ``?`` or
    ``#`` in a password included."""
    return _hidden(url, "***@")


def _hidden(url: str, mark: str) -> str:
    return _USERINFO.sub(lambda found: (found[1] or "") + mark, url)


def shown_url(url: str, mark: str = "***@") -> str:
    """`url` with its credentials replaced by `mark` (``***@``, as `hide_userinfo` does;
    the MCP client drops them), then cut after the
    first ``?`` or ``#`` (``https://host/mcp?...``), as a query may hold a key. A ``?`` or
    ``#`` before the last ``@`` is a password's character or a query holding an ``@``;
    which, the URL cannot tell, so nothing after the ``@`` is shown either."""
    if _CUT.search(url[: max(url.rfind("@"), 0)]):
        return _hidden(url[: url.rfind("@") + 1], mark) + "..."
    shown = _hidden(url, mark)
    cut = _CUT.search(shown)
    return shown if cut is None else shown[: cut.end()] + "..."
