"""One folder per service; each shows its handlers at a glance."""
