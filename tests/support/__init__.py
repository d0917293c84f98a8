"""Helpers shared by tests: stand-ins for services that cannot run here."""
