"""The HTTP API: one blueprint per resource, every error as problem+json."""
