"""A toy eighth domain defined only in this folder: a notebook of key/value notes.

It shows what a new domain needs: an environment, a scripted agent and a world generator
(`env.py`), a task verifier, and the record below with its text. Nothing outside this folder
names it; `register_domain(DOMAIN)` (the test's fixture) is the whole of the wiring.
"""
from lwm_jax import domains

PROMPT = dict(
    role="a notebook of short notes kept under keys",
    obs="the notebook's answer: a note's text, the list of keys, or an error line",
    actions="One call per turn: keys(), get(key), set(key, text).",
    demo="Action: `get('a')`\nObservation: `a = apple`",
    rules=[
        "A key that was never set answers `error: no note 'KEY'`.",
        "set(key, text) answers `saved KEY` and later get(key) shows the new text.",
        "keys() lists every key in alphabetical order, one per line.",
    ])

GUIDANCE = [
    ("Notebook state", [
        "Every set() changes what later get() and keys() show.",
        "Notes never change on their own.",
    ]),
]

DOMAIN = domains.Domain(
    name="toy", display="Toy",
    env="toy_domain.env:NotebookEnv", agent="toy_domain.env:NotebookAgent",
    world="toy_domain.env:generate_world", verifier="toy_domain.env:check",
    transcript_verifier="toy_domain.env:check",
    prompt=PROMPT, guidance=GUIDANCE,
    agent_world="a notebook of notes kept under keys",
    judge_guidance="Environment: a key/value notebook. Observations are deterministic: a note's "
                   "text must match the reference exactly, and so must the list of keys.",
    content="output", benchmark=False)
