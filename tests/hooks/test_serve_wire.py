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
