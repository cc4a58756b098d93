"""`rollout ui`'s defaults, apart from the viewer so that its help shows them cheaply."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321
