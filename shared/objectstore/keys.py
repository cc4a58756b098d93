"""Object keys every backend can hold: relative, '/'-separated, no traversal, bounded length."""

from __future__ import annotations

import re

from rollout.shared.objectstore.errors import InvalidObjectKey

# S3 and GCS both cap object names at 1024 UTF-8 bytes (store prefix included).
MAX_KEY_BYTES = 1024
# Most local filesystems cap one path component at 255 bytes; holding every backend to it
# keeps a key that works on S3 from failing only on the embedded default.
MAX_SEGMENT_BYTES = 255
# The local store writes temp files here, inside its root, so renames stay atomic.
RESERVED_SEGMENT = ".rollout-tmp"

URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def looks_like_uri(value: str) -> bool:
    """True for `scheme://...` strings, which are URIs rather than keys."""
    return bool(URI_RE.match(value))


def validate_key(key: object, *, prefix_bytes: int = 0) -> str:
    """Return `key` when it is a valid object key; raise InvalidObjectKey listing every problem."""
    problems = _problems(key, partial=False, prefix_bytes=prefix_bytes)
    if problems:
        raise InvalidObjectKey(f"invalid object key {key!r}", problems=problems)
    assert isinstance(key, str)
    return key


def validate_prefix(prefix: object, *, what: str = "prefix") -> str:
    """Return a listing prefix ('' or key-like, may end in '/'); raise InvalidObjectKey if not."""
    if prefix == "":
        return ""
    problems = _problems(prefix, partial=True, prefix_bytes=0)
    if problems:
        raise InvalidObjectKey(f"invalid object {what} {prefix!r}", problems=problems)
    assert isinstance(prefix, str)
    return prefix


def _problems(key: object, *, partial: bool, prefix_bytes: int) -> list[str]:
    """Everything wrong with a key; a partial key (listing prefix) may end with '/'."""
    if not isinstance(key, str):
        return [f"must be a string, got {type(key).__name__}"]
    if not key:
        return ["must not be empty"]
    problems: list[str] = []
    if "\x00" in key:
        problems.append("contains a null byte")
    elif _CONTROL_RE.search(key):
        problems.append("contains a control character")
    if looks_like_uri(key):
        problems.append("looks like a URI; pass a key relative to the store (or use the URI API)")
    if key.startswith("/"):
        problems.append("must be relative (no leading '/')")
    if "\\" in key:
        problems.append("must use '/' as the separator, not '\\'")
    body = key[:-1] if partial and key.endswith("/") else key
    segments = body.split("/")
    if "" in segments and not key.startswith("/"):
        problems.append("has an empty path segment ('//' or a trailing '/')")
    if any(segment in (".", "..") for segment in segments):
        problems.append("has a '.' or '..' segment (path traversal is not allowed)")
    if segments[0] == RESERVED_SEGMENT:
        problems.append(f"starts with the reserved folder {RESERVED_SEGMENT!r}")
    long_segments = [s for s in segments if len(s.encode("utf-8", "replace")) > MAX_SEGMENT_BYTES]
    if long_segments:
        problems.append(f"has a path segment longer than {MAX_SEGMENT_BYTES} bytes")
    total = len(key.encode("utf-8", "replace")) + prefix_bytes
    if total > MAX_KEY_BYTES:
        problems.append(f"is {total} bytes with the store prefix (max {MAX_KEY_BYTES})")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        problems.append("is not valid UTF-8 (lone surrogate characters)")
    return problems


def normalize_store_prefix(prefix: str) -> str:
    """A cloud store's prefix as '' or 'a/b/': it always names a folder."""
    stripped = prefix.strip("/")
    if not stripped:
        return ""
    return validate_prefix(stripped, what="store prefix") + "/"
