"""Every RESHARD_* variable is read one way: its default when unset, its parsed value when set,
and a bad value raises InvalidArgument naming the variable; the docs list each one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reshard import InvalidArgument, settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


@pytest.mark.parametrize("name,text,value", [
    ("RESHARD_TIMEOUT", None, 300.0), ("RESHARD_TIMEOUT", " 2.5 ", 2.5),
    ("RESHARD_CHECK", None, True), ("RESHARD_CHECK", "0", False), ("RESHARD_CHECK", "Off", False),
    ("RESHARD_CHECK", "yes", True), ("RESHARD_SHM", "", True), ("RESHARD_SHM", "false", False),
    ("RESHARD_SHM_MIN_BYTES", None, None), ("RESHARD_SHM_MIN_BYTES", "0", 0),
    ("RESHARD_SHM_MIN_BYTES", "9" * 30, 1 << 62), ("RESHARD_RANK", "3", 3),
    ("RESHARD_ARENA_BYTES", "64K", 65536), ("RESHARD_ARENA_BYTES", " 8GiB ", 8 << 30),
    ("RESHARD_ARENA_MIN_BYTES", "1 MB", 1 << 20), ("RESHARD_ARENA_MIN_BYTES", "512b", 512),
    ("RESHARD_SHM_MIN_BYTES", "2t", 2 << 40),
])
def test_a_variable_reads_as_its_value_or_default(name, text, value):
    environ = {} if text is None else {name: text}
    assert settings.read(name, environ) == value


@pytest.mark.parametrize("name,text", [
    ("RESHARD_TIMEOUT", "soon"), ("RESHARD_TIMEOUT", "0"), ("RESHARD_TIMEOUT", "-1"), ("RESHARD_TIMEOUT", "inf"),
    ("RESHARD_CHECK", "maybe"), ("RESHARD_SHM", "2"), ("RESHARD_SHM_MIN_BYTES", "-1"),
    ("RESHARD_SHM_MIN_BYTES", "1e6"), ("RESHARD_RANK", "one"), ("RESHARD_ARENA_BYTES", "1.5G"),
    ("RESHARD_ARENA_BYTES", "K"), ("RESHARD_ARENA_BYTES", "64Q"), ("RESHARD_ARENA_BYTES", "-64K"),
])
def test_a_bad_value_names_the_variable(name, text):
    with pytest.raises(InvalidArgument, match=re.escape(f"{name}={text!r}")):
        settings.read(name, {name: text})


def test_every_bad_setting_is_named_at_once_and_good_ones_pass():
    with pytest.raises(InvalidArgument) as raised:
        settings.check_set({"RESHARD_ARENA": "x", "RESHARD_TRACEBACK": "7", "RESHARD_CHECK": "0", "RESHARD_RANK": "1"})
    said = str(raised.value)
    assert "RESHARD_ARENA='x'" in said and "RESHARD_TRACEBACK='7'" in said and "RESHARD_CHECK" not in said
    settings.check_set({"RESHARD_ARENA": "0", "RESHARD_ARENA_BYTES": "4096", "RESHARD_TIMEOUT": "5"})


def test_current_lists_set_variables_and_unknown_ones():
    found = settings.current({"RESHARD_CHECK": "0", "RESHARD_CHEK": "1", "PATH": "/bin"})
    assert found == {"RESHARD_CHECK": {"text": "0", "value": False},
                     "RESHARD_CHEK": {"text": "1", "error": "RESHARD_CHEK is not a reshard setting"}}


def test_init_refuses_a_bad_timeout_by_name():
    code = "import reshard as rs\ntry:\n    rs.init()\nexcept rs.InvalidArgument as e:\n    print(e)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"RESHARD_TIMEOUT": "ten", "PATH": "/usr/bin:/bin"})
    assert "RESHARD_TIMEOUT='ten': must be a number of seconds" in run.stdout, run.stdout + run.stderr


def test_the_settings_page_lists_every_variable_with_its_default():
    page = DOCS.read_text()
    documented = set(re.findall(r"^\| `(RESHARD_[A-Z_]+)` \|", page, re.M))
    assert documented == {v.name for v in settings.VARIABLES}
    for var in settings.VARIABLES:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{var.name}` |"))
        if var.set_by_reshard:
            shown = "set by rs.spawn"
        elif var.default_text is not None:
            shown = var.default_text
        elif isinstance(var.default, bool):
            shown = f"`{int(var.default)}`"
        else:
            shown = f"`{var.default:g}`" if isinstance(var.default, float) else f"`{var.default}`"
        assert shown in row, row
