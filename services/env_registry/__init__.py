"""Env registry: validates pushed specs and keeps them as versioned, content-hashed events."""
