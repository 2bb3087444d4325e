"""What a wrapper factory is, said where it is defined: what it does (a line ``describe_patch`` prints) and, where
``patch`` treats its function apart, its role (``TOWER``: a vision tower's forward, which takes the attention backend
``patch(vision_attention=...)`` chose). ``Target.wrap`` holds the factory itself; nothing is looked up by name."""

from __future__ import annotations

__all__ = ["TOWER", "wrapper", "role_of", "does"]

TOWER = "vision tower"


def wrapper(does: str, role: str | None = None):
    """Mark a module-level wrapper factory ``make_<x>(stock) -> replacement`` with what it does and its role."""
    def mark(factory):
        factory.syncfree_does = does
        factory.syncfree_role = role
        return factory

    return mark


def role_of(factory) -> str | None:
    return getattr(factory, "syncfree_role", None)


def does(factory) -> str | None:
    return getattr(factory, "syncfree_does", None)
