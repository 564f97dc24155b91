"""The package list, computed from the folders (pyproject.toml holds everything else).

kernels/ and bench/ sit at the top of the repository (the design card's layout)
but install under the package, as `jaxgemm.kernels` and `jaxgemm.bench`: a bare
`kernels` or `bench` in site-packages would collide with other projects' names.
pyproject.toml's `packages.find` cannot map folders to other names, and a list
written by hand drifts (one once left out `jaxgemm.kernels.pallas.scaled_matmul`),
so every package under these folders is found here. tests/test_packaging.py
builds the wheel and imports every module from it.
"""

from setuptools import find_packages, setup

# Installed package -> the repository folder it comes from.
PACKAGE_FOLDERS = {"jaxgemm": "jaxgemm", "jaxgemm.kernels": "kernels", "jaxgemm.bench": "bench"}


def packages() -> list[str]:
  """Each root of PACKAGE_FOLDERS and every package (a folder with __init__.py) below it."""
  found = []
  for package, folder in PACKAGE_FOLDERS.items():
    found += [package, *(f"{package}.{sub}" for sub in find_packages(folder))]
  return found


setup(packages=packages(),
      package_dir={p: f for p, f in PACKAGE_FOLDERS.items() if p != f})
