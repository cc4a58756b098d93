"""The service kit: consumers declared once, one bootstrap, one batched projection consumer."""
