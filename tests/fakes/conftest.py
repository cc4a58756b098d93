"""Makes the fake-server fixtures available to tests placed under tests/fakes."""

from fakes.openai_server import fake_openai  # noqa: F401  (a pytest fixture)
