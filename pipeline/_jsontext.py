"""What a JSON text's bytes hold, seen without reading the JSON.

For the MCP client, which mends a server's message that escapes a lone surrogate: it looks
at the bytes first, so that the commonest message, one without such an escape (emoji pairs
included), is not read and written again.
"""

import re

_LONE_ESCAPE = re.compile(
    rb"\\u[dD](?:"
    # a high surrogate that no low one follows
    rb"[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    # a low surrogate that no high one precedes (whose backslash no backslash precedes: one
    # that does may be escaped itself, and the low one is then taken for alone)
    rb"|(?<!(?<!\\)\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD])[c-fC-F][0-9a-fA-F]{2}"
    rb")"
)


def escapes_lone_surrogate(text: bytes) -> bool:
    """Whether `text`, JSON as UTF-8 (or ASCII) bytes, may escape a lone surrogate
    (``"\\ud83d"``: valid JSON, but half a character, which UTF-8 cannot encode).

    A pair (``"\\ud83d\\ude00"``, each emoji Python's ``json.dumps`` writes) is no lone
    surrogate: a text holding pairs alone is False, and need not be read and checked or
    written again (33 MB of them took a reader about 2 s). Text that only looks like an
    escape (``"\\\\ud83d"``, an escaped backslash) may be True: whoever reads the JSON then
    finds no lone surrogate, so True means "read it to know", never a wrong answer. Only
    escapes are seen: bytes that are a surrogate's UTF-8 form, and JSON in UTF-16 or UTF-32,
    are not.
    """
    return _LONE_ESCAPE.search(text) is not None
