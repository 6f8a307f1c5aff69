"""Install MindGR: the `mindgr` package and its console script. The C++ kernels are built on first use."""
import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', (Path(__file__).parent / "mindgr" / "__init__.py").read_text())[1]

setup(
    name="mindgr",
    version=VERSION,   # one place: mindgr/__init__.py (also what `mindgr --version` prints)
    description="MindSpore-native training suite for large-scale generative recommendation",
    packages=find_packages(include=["mindgr", "mindgr.*"]),
    package_data={"mindgr.ops": ["cpu/*.cc", "cpu/*.h", "ascend/**/*"]},
    python_requires=">=3.9",
    install_requires=["mindspore==2.10.0", "numpy<2", "pyarrow>=12,<23", "pyyaml", "tqdm"],
    # `mindgr report` draws its plots with matplotlib; the tests check those plots, so `test` includes it.
    extras_require={"report": ["matplotlib>=3.5"], "test": ["pytest", "matplotlib>=3.5"]},
    entry_points={"console_scripts": ["mindgr=mindgr.cli:main"]},
)
