"""The gateway's wire builders, as pure functions: laws that hold for any text."""

import json

from hypothesis import given
from hypothesis import strategies as st

from hooks.cli._wire import Completion, sse

# Any text a model may send, surrogates aside (they cannot be encoded as UTF-8 at all).
TEXT = st.text(st.characters(exclude_categories=["Cs"]))


@given(TEXT)
def test_a_templated_text_frame_equals_the_chunk_encoded_whole(text: str) -> None:
    """Catches: the per-response template (the fast path of every streamed delta) encoding
    some character differently from the JSON encoder: quotes, backslashes, control
    characters, U+2028, non-ASCII."""
    completion = Completion("chatcmpl-1", "m", created=1)
    frame = completion.text_frame(text)
    assert frame == sse(completion.text(text))
    assert json.loads(frame.removeprefix(b"data: "))["choices"][0]["delta"]["content"] == text


# Text with at least one lone surrogate (st.text() draws them only rarely).
ODD = st.builds("".join, st.lists(TEXT | st.characters(categories=["Cs"]), min_size=1)).filter(
    lambda text: any("\ud800" <= char <= "\udfff" for char in text)
)


@given(ODD)
def test_any_text_a_model_sends_is_written_as_json_it_means(text: str) -> None:
    """Catches: a reply holding a lone surrogate (valid in a Python string, and in JSON as an
    escape, but with no UTF-8 form) failing the response with UnicodeEncodeError."""
    completion = Completion("chatcmpl-1", "m", created=1)
    frame = completion.text_frame(text)
    assert frame == sse(completion.text(text))
    # JSON escapes are UTF-16 code units: a high and a low surrogate side by side read back
    # as the one character they pair into, as in UTF-16.
    utf16 = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    assert json.loads(frame.removeprefix(b"data: "))["choices"][0]["delta"]["content"] == utf16
