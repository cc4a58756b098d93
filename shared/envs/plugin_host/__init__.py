"""The plugin host: plugin code runs in sandboxed worker processes, never in a service."""
