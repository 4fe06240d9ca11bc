"""Instruction fidelity of a world model under perturbations (lwm_jax/eval/fidelity.py says how).

  python evals/fidelity.py --checkpoint=runs/demo/sft --out=runs/fidelity --episodes=8
"""
import sys

from lwm_jax.eval import fidelity

if __name__ == "__main__":
  sys.exit(fidelity.main())
