"""Model backends behind one batch interface."""
