"""The worker endpoints (docs/trainer-protocol.md)."""
