"""Install MindGR: the `mindgr` package and its console script. The C++ kernels are built on first use."""
from setuptools import find_packages, setup

setup(
    name="mindgr",
    version="0.1.0",
    description="MindSpore-native training suite for large-scale generative recommendation",
    packages=find_packages(include=["mindgr", "mindgr.*"]),
    package_data={"mindgr.ops": ["cpu/*.cc", "cpu/*.h", "ascend/**/*"]},
    python_requires=">=3.9",
    install_requires=["mindspore==2.10.0", "numpy<2", "pyarrow>=12,<23", "pyyaml", "tqdm"],
    extras_require={"test": ["pytest", "faiss-cpu"],
                    "ids": ["faiss-cpu"]},   # k-means of large catalogues (`mindgr ids build`); numpy otherwise
    entry_points={"console_scripts": ["mindgr=mindgr.cli:main"]},
)
