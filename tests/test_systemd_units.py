"""The systemd fleet's unit files: `systemd-analyze verify` clean, and the fleet's policy.

`verify` needs the ExecStart binary to exist, so the units are copied to a temporary
directory with `/opt/aldebaran/.venv/bin/aldebaran` pointed at this checkout's
`aldebaran`; nothing else is changed. `verify` only warns (exit 0) on unknown keys and
bad values, so any output at all counts as a failure; the negative tests prove that a
broken unit really is caught.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED_BIN = "/opt/aldebaran/.venv/bin/aldebaran"
LOCAL_BIN = Path(sys.executable).with_name("aldebaran")
FLEET = [
    "aldebaran-engine@.service",
    "aldebaran-aggregator@.service",
    "aldebaran-books@.service",
    "aldebaran-channel@.service",
    "aldebaran-lookout.service",
    "aldebaran-tracer.service",
    "aldebaran-api.service",
]


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze missing: run `SETUP_TEST_TOOLS=1 make setup` (installs Debian's systemd)"
    return found


def _copy_units(target: Path) -> list[Path]:
    copies = []
    for unit in sorted(UNITS.iterdir()):
        if unit.suffix in {".service", ".target", ".timer", ".socket", ".path"}:
            copy = target / unit.name
            copy.write_text(unit.read_text().replace(INSTALLED_BIN, str(LOCAL_BIN)))
            copies.append(copy)
    return copies


def _verify(paths: list[Path]) -> tuple[int, str]:
    """Exit status and every line `systemd-analyze verify` printed about these units."""
    result = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", *map(str, paths)],
        capture_output=True, text=True, timeout=60, cwd=paths[0].parent,
    )
    return result.returncode, (result.stdout + result.stderr).strip()


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment]  # systemd keys are case-sensitive
    parser.read(UNITS / name)
    return parser


def _all_values(name: str, section: str, key: str) -> list[str]:
    values = []
    current = None
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line.startswith(f"{key}="):
            values.append(line.split("=", 1)[1])
    return values


def test_every_unit_verifies_clean(tmp_path: Path) -> None:
    assert LOCAL_BIN.exists(), f"{LOCAL_BIN} missing: install the package (`make setup`)"
    copies = _copy_units(tmp_path)
    assert {c.name for c in copies} >= set(FLEET) | {"aldebaran.target"}
    code, output = _verify(copies)
    assert (code, output) == (0, ""), output


def test_verify_catches_a_misspelt_key(tmp_path: Path) -> None:
    copies = _copy_units(tmp_path)
    broken = tmp_path / "aldebaran-aggregator@.service"
    broken.write_text(broken.read_text().replace("RestartPreventExitStatus=", "RestartPreventExitStatuss="))
    _code, output = _verify(copies)
    assert "RestartPreventExitStatuss" in output


def test_verify_catches_a_missing_binary(tmp_path: Path) -> None:
    copies = _copy_units(tmp_path)
    broken = tmp_path / "aldebaran-books@.service"
    broken.write_text(broken.read_text().replace(str(LOCAL_BIN), str(tmp_path / "no-such-aldebaran")))
    code, output = _verify(copies)
    assert code != 0 and "no-such-aldebaran" in output


@pytest.mark.parametrize("name", FLEET)
def test_fleet_policy(name: str) -> None:
    unit = _unit(name)
    service = unit["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert service["WatchdogSec"]
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"].split() == ["78"]
    assert "/etc/aldebaran/aldebaran.env" in _all_values(name, "Service", "EnvironmentFile")
    assert service["User"] == "aldebaran" and service["Group"] == "aldebaran"
    for key, value in {
        "ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
        "ProtectHome": "yes", "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == value, key
    assert unit["Unit"]["PartOf"] == "aldebaran.target"
    assert unit["Install"]["WantedBy"] == "aldebaran.target"


@pytest.mark.parametrize("name", FLEET)
def test_exec_start_is_a_valid_aldebaran_command(name: str) -> None:
    """The unit's command line parses with the real `aldebaran` parser."""
    from aldebaran.cli import build_parser
    from aldebaran.errors import ExitCode

    assert int(ExitCode.CONFIG) == 78  # what RestartPreventExitStatus= names
    argv = shlex.split(_unit(name)["Service"]["ExecStart"])
    assert argv[0] == INSTALLED_BIN
    instance = ("9101" if name.startswith(("aldebaran-engine", "aldebaran-aggregator", "aldebaran-books"))
                else "ops-webhook")
    args = [a.replace("%i", instance) for a in argv[1:]]
    parsed = build_parser().parse_args(args)
    assert parsed.command == args[0]
    if args[0] == "run" and name != "aldebaran-channel@.service":
        assert parsed.metrics_port and parsed.metrics_port > 0


def test_audit_unit_feeds_todays_in_doubt_list_to_the_audit() -> None:
    """ExecStartPre writes `delivery in-doubt --json` where the audit's `--in-doubt` reads it, in the
    unit's own runtime directory; both command lines parse with the real parser."""
    from aldebaran.cli import build_parser

    name = "aldebaran-audit.service"
    service = _unit(name)["Service"]
    audit = build_parser().parse_args(shlex.split(service["ExecStart"])[1:])
    [pre] = _all_values(name, "Service", "ExecStartPre")
    shell = shlex.split(pre.removeprefix("-"))
    assert shell[:2] == ["/bin/sh", "-c"]
    command, _, target = shell[2].removeprefix("exec ").partition(" > ")
    listing = build_parser().parse_args(shlex.split(command)[1:])
    assert (listing.command, listing.delivery_command, listing.json) == ("delivery", "in-doubt", True)
    assert audit.command == "audit" and audit.in_doubt == [target]
    assert target == f"/run/{service['RuntimeDirectory']}/in-doubt.jsonl"
