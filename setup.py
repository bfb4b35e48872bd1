"""Package mapping: engine/, kernels/, tools/ and sandboxes/ install as clover_agent.<name>.

Everything else lives in pyproject.toml. setuptools' declarative config cannot express "every
subpackage of these folders under another name", so the list is computed here; nothing generic
(``engine``, ``tools``, ...) is ever installed at top level.
"""

from setuptools import find_packages, setup

SIBLINGS = ("engine", "kernels", "tools", "sandboxes")

package_dir = {"clover_agent": "clover_agent"}
packages = ["clover_agent", *(f"clover_agent.{p}" for p in find_packages("clover_agent"))]
for folder in SIBLINGS:
    package_dir[f"clover_agent.{folder}"] = folder
    packages.append(f"clover_agent.{folder}")
    packages += [f"clover_agent.{folder}.{p}" for p in find_packages(folder)]

setup(package_dir=package_dir, packages=packages)
