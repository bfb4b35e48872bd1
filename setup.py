"""The package list: ``clover_agent`` and everything under it, links included.

engine/, kernels/, tools/, sandboxes/ and environments/ install as ``clover_agent.<name>`` through the links
``clover_agent/<name> -> ../<name>``, the one place that mapping is written; the folders have no
``__init__.py``, so a Python started at the checkout's root finds nothing generic (``kernels``,
``tools``, ...) there that would hide an installed distribution. Everything else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

packages = [
    name
    for name in find_namespace_packages(include=["clover_agent", "clover_agent.*"])
    if "__pycache__" not in name.split(".")
]

setup(packages=packages)
