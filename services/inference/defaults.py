"""`rollout serve-model`'s defaults, apart from the server so that its help shows them cheaply."""

# The address served on when none is given: this machine only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8400
# Most choices per request, and the largest max_tokens a request may ask for.
DEFAULT_MAX_N = 8
DEFAULT_MAX_TOKENS_LIMIT = 4096
# Most requests sampled together.
DEFAULT_MAX_BATCH = 16
