"""AgentWorldBench evaluation: `infer`, `judge`, `score`, `all` or `export`, each resumable.

  python evals/agentworldbench.py all --data=evals/mini_bench --out=runs/mini --checkpoint=ckpt/

Every step, flag and example (hosted endpoints, the official judge protocol, the official client's
files): `python evals/agentworldbench.py --helpfull` and lwm_jax/eval/agentworldbench_cli.py,
where the command line lives.
"""
from absl import app

from lwm_jax.eval.agentworldbench_cli import main

if __name__ == "__main__":
  app.run(main)
