"""The distribution ships every module: pyproject's package list matches the folders."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"rollout": "sdk/rollout", "rollout.shared": "shared", "rollout.services": "services"}


def folders_with_code() -> set[str]:
    found = set()
    for package, folder in ROOTS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            relative = path.parent.relative_to(base).parts
            found.add(".".join((package, *relative)))
    return found


def test_every_folder_with_code_is_a_listed_package_with_an_init() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == ROOTS
    listed = set(config["packages"])
    assert folders_with_code() == listed
    for package in listed:
        folder = ROOTS.get(package) or next(
            ROOTS[root] + "/" + package[len(root) + 1 :].replace(".", "/")
            for root in sorted(ROOTS, key=len, reverse=True)
            if package.startswith(root + ".")
        )
        assert (ROOT / folder / "__init__.py").exists(), f"{folder} has no __init__.py"
