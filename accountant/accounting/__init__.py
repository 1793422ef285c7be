"""The accounting rules of DESIGN.md as pure functions: no I/O, no HTTP, no SQL."""
