"""Unit-of-work functions: each takes a session first and never commits."""
