"""Applications of the core. Each module exposes `rule`, a `Rule` the workers load by name."""

from __future__ import annotations

import importlib
from typing import Any

from aldebaran.errors import ConfigError


def load_rule(name: str) -> Any:
    """The rule of the application `name` (a module here, or `package.module` elsewhere)."""
    module_name = name if "." in name else f"aldebaran.apps.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"apps: no application named {name!r} ({exc.name} not found)") from None
    rule = getattr(module, "rule", None)
    if rule is None:
        raise ConfigError(f"apps: module {module_name} has no `rule`")
    return rule
