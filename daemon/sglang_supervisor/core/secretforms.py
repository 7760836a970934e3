"""Every spelling of a secret that can reach a log, and the shortest API key we accept. Pure.

SGLang prints the API key in more than one form: `repr()` inside `server_args=ServerArgs(...)`
and request echoes (a `'` or `\\` in the key comes out escaped), JSON in /server_info and
`--log-requests-format json`, and URL-encoded wherever a key travels in a URL (an operator's
`?api_key=` in an access line). Redacting only the raw key would leave those readable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

# Why 16: redaction replaces every occurrence of the key in every line. A short key also occurs
# in ordinary text ("admin", "1234", a word of a prompt), so the places where *** appears would
# show the key to anyone reading the log, and ordinary lines get shredded; it is also quick to
# guess. 16 characters is the length of `openssl rand -hex 8` (64 bits), far below what key
# generators produce (`openssl rand -hex 24` gives 48), and long enough not to occur by chance.
MIN_API_KEY_LEN = 16
KEY_FIX = "generate a new one, e.g. `openssl rand -hex 24 > KEYFILE` (48 characters), and use it"


def api_key_problem(key: str) -> str | None:
    """Why this API key cannot be used, or None."""
    if len(key) < MIN_API_KEY_LEN:
        return (f"the API key is {len(key)} characters long; keys shorter than {MIN_API_KEY_LEN} "
                "cannot be redacted safely from logs (they occur in ordinary text) and are easy to guess")
    if not all(" " <= c <= "~" for c in key):
        # It travels as `Authorization: Bearer KEY`: httpx (and HTTP) take ASCII header values only.
        return ("the API key has characters other than printable ASCII (non-ASCII letters, tabs or "
                "control characters); it is sent in an HTTP header, which cannot carry them")
    return None


def escaped_forms(secret: str) -> tuple[str, ...]:
    """The secret as repr(), JSON and URL encoding print it (the raw form first)."""
    forms = [
        secret,
        repr(secret)[1:-1],  # the quote repr picks
        secret.replace("\\", "\\\\").replace("'", "\\'"),  # inside '...' whatever repr picks
        secret.replace("\\", "\\\\").replace('"', '\\"'),  # inside "..."
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
    ]
    return tuple(dict.fromkeys(forms))


def expand(secrets: Iterable[str]) -> tuple[str, ...]:
    """Every form of every secret, and every form of those (a repr()ed key inside a JSON record,
    or inside our own logfmt/JSON rendering of an engine line), longest first so that a longer
    form is replaced before a shorter one inside it could be."""
    out: dict[str, None] = {}
    for secret in secrets:
        if secret:
            for form in escaped_forms(secret):
                out.update(dict.fromkeys(escaped_forms(form)))
    return tuple(sorted(out, key=len, reverse=True))
