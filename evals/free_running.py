"""Free-running evaluation of trained world models beside the copy-previous and empty baselines:

  python evals/free_running.py --model=sft=data/world_model --out=runs/free_running

Every flag and what it writes: `python evals/free_running.py --help` and
lwm_jax/eval/free_running_cli.py, where the command line lives.
"""
from lwm_jax.eval.free_running_cli import main

if __name__ == "__main__":
  main()
