"""The jobs API: one endpoint class or a small group per module."""
