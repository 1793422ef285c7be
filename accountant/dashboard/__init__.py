"""The compliance dashboard: server-rendered pages for auditors and admins."""
