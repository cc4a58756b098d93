"""Aggregates rebuilt from their own events: what decisions about them are made from."""
