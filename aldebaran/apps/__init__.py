"""Applications of the core. Each module exposes `rule`, a `Rule` the workers load by name.

An application that takes settings (a limit, a window) instead declares `Options`, a
pydantic model, and `make_rule(options) -> Rule`; its values come from the TOML table
`[app_options.<name>]` (or `ALDEBARAN_APP_OPTIONS` as JSON) and are validated here, at
start-up, so a typo or a bad value stops the worker with the key's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from aldebaran.errors import ConfigError

if TYPE_CHECKING:
    from aldebaran.settings import Settings


def load_rule(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The rule of the application `name` (a module here, or `package.module` elsewhere)."""
    module_name = name if "." in name else f"aldebaran.apps.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"apps: no application named {name!r} ({exc.name} not found)") from None
    declared = getattr(module, "Options", None)
    if declared is None:
        if options:
            raise ConfigError(f"app_options.{name}: application {name!r} takes no options")
        rule = getattr(module, "rule", None)
        if rule is None:
            raise ConfigError(f"apps: module {module_name} has no `rule`")
        return rule
    if not (isinstance(declared, type) and issubclass(declared, BaseModel)
            and callable(getattr(module, "make_rule", None))):
        raise ConfigError(f"apps: module {module_name} declares `Options` "
                          "but not as a pydantic model with a `make_rule(options)`")
    try:
        parsed = declared.model_validate(dict(options or {}))
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            where = ".".join(["app_options", name, *(str(p) for p in item["loc"])])
            problems.append(f"{where}: unknown option" if item["type"] == "extra_forbidden"
                            else f"{where}: {item['msg']}")
        raise ConfigError("; ".join(problems)) from None
    return module.make_rule(parsed)


def load_rules(settings: Settings) -> list[Any]:
    """Every configured application's rule, each with its own `[app_options.<name>]`."""
    rules = [load_rule(name, settings.app_options.get(name)) for name in settings.apps]
    check_queue_prefixes(rules)
    return rules


def check_queue_prefixes(rules: list[Any]) -> None:
    """Book queues are `<queue_prefix><encoded key>` (CONTRACT §2: never an internal name).

    Two prefixes where one starts the other (`book-`, `book-x`) would let two apps' keys
    meet in one queue (`x1` under the first, `1` under the second), and a prefix starting
    like an internal name (`Aldebaran.`, `aldebaran.`) could spell one: both are refused.
    """
    prefixes = {rule.name: str(rule.queue_prefix) for rule in rules}
    for name, prefix in prefixes.items():
        if not 0 < len(prefix.encode()) <= 50 or prefix.lower().startswith("aldebaran."):
            raise ConfigError(f"apps: {name}'s queue_prefix {prefix[:60]!r} must be 1-50 bytes "
                              "and not start with 'Aldebaran.' (internal queue names do)")
        for other, theirs in prefixes.items():
            if other != name and theirs.startswith(prefix):
                raise ConfigError(f"apps: {name}'s queue_prefix {prefix!r} starts {other}'s {theirs!r}: "
                                  "their book queues could meet")
