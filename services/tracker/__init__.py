"""Tracker: builds the read models from every event and (later) manages run lifecycles."""
