"""The local provider: a fleet of logical nodes on this machine."""

from .provider import LocalProvider

__all__ = ["LocalProvider"]
