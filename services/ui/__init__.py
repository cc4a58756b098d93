"""`rollout ui`: a small web viewer over the tracker's read models, live from the events stream."""
