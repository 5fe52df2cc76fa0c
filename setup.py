"""What pyproject.toml cannot say statically: every package below runtime/ ships as `aicirt.*`.

Found at build time, so a new subpackage (runtime/serve/, runtime/engine/, ...) is packaged without
editing this file. Everything else is in pyproject.toml.
"""
from setuptools import find_packages, setup

setup(packages=["aicirt", *(f"aicirt.{p}" for p in find_packages("runtime"))])
