"""Maps the fixed top-level folders onto one import package, `rollout`."""

from setuptools import find_packages, setup

ROOTS = {"rollout": "sdk/rollout", "rollout.shared": "shared", "rollout.services": "services"}


def _packages() -> list[str]:
    found: list[str] = []
    for name, root in ROOTS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(root))
    return found


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"rollout.shared.store": ["migrations/*.sql"]},
)
