"""Packaging: ``conf/`` sits at the top of the repository, where users read and edit it, and ships
inside the wheel as ``cptkit/conf`` so that an installed cptkit finds its configs."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["cptkit", "cptkit.*"]) + ["cptkit.conf"],
    package_dir={"cptkit.conf": "conf"},
    package_data={"cptkit.conf": ["**/*.yaml"]},
)
