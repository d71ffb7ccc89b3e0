"""URL redaction: the one place secrets are taken out of URLs before they are shown or logged."""

from __future__ import annotations

from urllib.parse import urlsplit


def redact_url(url: str) -> str:
    """*url* safe to log: its password and every query value replaced by ``***``.

    The one redaction of the project, for the upstream URL and the Redis URL alike
    (``http(s)://``, ``redis(s)://``, ``unix://``). The user name is kept (it names the ACL
    user or account); a query item without ``=`` is replaced whole (it may be a token); the
    fragment is dropped. A URL that cannot be parsed comes back as ``***``.

    Args:
        url: any URL.

    Returns:
        The URL without secrets.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "***"
    netloc = parts.netloc
    if password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{hostinfo}"
    query = "&".join(
        f"{pair.partition('=')[0]}=***" if "=" in pair else "***"
        for pair in parts.query.split("&")
        if pair
    )
    scheme = f"{parts.scheme}://" if "://" in url else f"{parts.scheme}:" * bool(parts.scheme)
    return f"{scheme}{netloc}{parts.path}" + (f"?{query}" if query else "")
