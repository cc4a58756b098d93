"""Object store fixtures (defined in objectstore_backends.py so tests can import its helpers)."""

from objectstore_backends import backend, gcs_endpoint, moto_endpoint  # noqa: F401  (fixtures)
