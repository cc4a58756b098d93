"""Environment engine: specs, template runtimes, verifier primitives, validation, sandbox."""
