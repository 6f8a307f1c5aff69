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
    extras_require={
        # k-means of large catalogues (`mindgr ids build`); numpy otherwise
        "ids": ["faiss-cpu>=1.7"],
        # `mindgr report` draws its plots with matplotlib
        "report": ["matplotlib>=3.5"],
        # mindgr serve / bench serve: HTTP server, load generator, optional ANN index (--index faiss-ivf)
        "serve": ["fastapi>=0.100", "pydantic>=2", "uvicorn>=0.29", "httpx>=0.24", "faiss-cpu>=1.7"],
        # the tests check the plots and run a real server, two test processes at a time (pytest -n 2)
        "test": ["pytest", "pytest-xdist>=3", "matplotlib>=3.5", "fastapi>=0.100", "pydantic>=2", "uvicorn>=0.29", "httpx>=0.24",
                 "faiss-cpu>=1.7"],
    },
    entry_points={"console_scripts": ["mindgr=mindgr.cli:main"]},
)
