"""Key validation: whatever a key is, an accepted one stays inside the local store's root."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rollout.shared.objectstore import InvalidObjectKey, LocalObjectStore, validate_key

ROOT = Path("/srv/objects")
STORE = LocalObjectStore(ROOT)

# Characters that matter for traversal and separators, plus arbitrary text.
_TRICKY = st.sampled_from(["/", "..", ".", "\\", "\x00", "a", "é", ":", "//", "~", " "])
keys = st.one_of(st.text(max_size=40), st.lists(_TRICKY, max_size=12).map("".join))


@given(keys)
def test_accepted_keys_stay_inside_the_root(key: str) -> None:
    try:
        validate_key(key)
    except InvalidObjectKey as exc:
        assert str(exc).startswith("invalid object key")
        assert exc.problems
        return
    path = STORE._path(key)
    assert path.is_relative_to(ROOT) and path != ROOT
    assert ".." not in path.parts
    # The URI names the same key again.
    assert STORE.key_for(STORE.uri_for(key)) == key


def test_every_problem_is_listed() -> None:
    try:
        validate_key("/a/../b\x00")
    except InvalidObjectKey as exc:
        assert len(exc.problems) == 3
        text = str(exc)
        assert "null byte" in text and "relative" in text and "traversal" in text
    else:
        raise AssertionError("expected InvalidObjectKey")
